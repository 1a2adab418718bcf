"""The options of a measuring run, one typed, frozen object (:class:`RunOptions`): what ``compare.run.harness.run``
and ``compare.run.sweep.run_sweep`` are asked to do, checked by the command line (``compare.cli``) before anything
runs. The objects that live while it runs (the progress display, the store, the time budget, a device watch, an
engine's runner) are passed beside it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from compare.timing.timer import TimingConfig


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to measure. ``cfg``: the timer's settings; ``config``: what the results document records of the command
    (``compare.results.document.Config``'s fields); ``profile``: count kernels per step, with ``trace_dir`` a
    Chrome/Perfetto trace per backend there; ``memory``: what each step holds in memory; ``ceilings``: measure this
    machine's matmul and copy ceilings first and hold every row to them; ``world_sizes``: tensor-parallel world
    sizes, run as ``tp_launch`` where a backend supports it, their processes' logs under ``tp_logs``; ``cache_mode``:
    the last-level cache's state in the timings (``compare.timing.llc.CACHE_MODES``); ``reuse_parity``: interpreted
    cells from ``compare.run.parity_cache``; ``cuda_graphs``: replay torch steps from a CUDA graph. A sweep's own:
    ``isolate`` (each cell in a worker process), ``cell_timeout_s`` (a worker's cell ended after so long) and
    ``retry_errors`` (stored ``error`` cells run again)."""

    cfg: TimingConfig = TimingConfig()
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    profile: bool = False
    trace_dir: Path | None = None
    memory: bool = False
    ceilings: bool = False
    world_sizes: tuple[int, ...] = (1,)
    tp_launch: str | None = None
    tp_logs: Path | None = None
    cache_mode: str = "warm"
    reuse_parity: bool = False
    cuda_graphs: bool = False
    isolate: bool = False
    cell_timeout_s: float | None = None
    retry_errors: bool = False
