"""A sweep (``python -m compare sweep``; its arguments: ``compare.cli.sweep``): run a grid of cells, one JSON line
per finished cell, resumable after a crash.

The grid is ``tokens x dtypes x modes x backends`` at a fixed model, ``dim`` and ``hidden`` (from ``--preset`` or
``--model/--dim/--hidden``). Each token count ``T`` becomes the shape ``batch = T / seq, seq`` (``--seq``, default
1); ``T`` must be a multiple of ``--seq``. A *cell* is ``(backend, case, mode)``, keyed ``"backend|case name|mode"``.

``<out>/results.jsonl`` is append-only (``compare.run.store``): a ``header`` line per start, a ``cell`` line per
finished cell, fsynced before the next cell starts. A restart with the same ``--out`` and grid skips every cell
already in the file, so a kill loses at most the cell in flight; a different grid there is refused (bad input), and
an exclusive lock keeps a second sweep from writing it. ``--retry-errors`` runs the stored ``error`` cells again.
:func:`load_sweep` turns the file, at any time, into a results document; at the end the sweep writes it as
``<out>/results.json`` with ``<out>/REPORT.md`` and plots. Every cell records its step's memory
(``compare.results.memory``): the report plots it against tokens and, with ``--device-memory SIZE``, states the
largest token count that fits.

Before the first cell each start measures this machine's matmul and copy ceilings for the swept dtypes (stored in
its header line) and every single-device row is held to them: a step whose median call beats the matmul ceiling
is ``implausible`` (``compare.run.cell.against_ceilings``). ``--no-ceilings`` skips both.

A backend that raises is an ``error`` result and the sweep goes on. With ``--isolate`` each cell runs in its own
worker process (``compare.run.cell_worker``): a hard crash (segfault, the OOM killer) is an ``error`` naming the exit
status or signal, and ``--cell-timeout`` turns a hang into one too; the workers' scratch folder ``<out>/.cells/`` is
removed when the sweep ends and, if a killed sweep left one, when the next starts. ``--engine ray``
(``compare.run.engines``) runs each cell as a Ray task on a cluster (``--address HOST:PORT`` or ``auto``; none: a
local instance): a lost worker or node is stored as an ``error`` line marked ``retrying`` before the cell runs
again, up to ``--retries`` times. Every row carries the node that measured it.

Ctrl-C or SIGTERM stops the sweep: the worker in flight is killed, what is done is written to ``results.json`` and
``REPORT.md``, and the exit status is 130 (rerun the same command to resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec
from compare.cost.records import Ceilings
from compare.formats.codec import to_json
from compare.results import environment
from compare.results.document import Results
from compare.run import exitcodes
from compare.run.budget import Budget
from compare.run.cell_worker import run_cell_inprocess, run_cell_isolated
from compare.run.conductor import Conductor, Finished
from compare.run.engines import Runner
from compare.run.grid import Cell, cells_from_config
from compare.run.options import RunOptions
from compare.run.progress import Display
from compare.run.store import JSONL, Store, check_same_grid, done_keys, load_sweep
from compare.timing.timer import TimingConfig

#: The workers' scratch folder under a sweep's output folder.
SCRATCH = ".cells"


class LocalRunner:
    """The local engine (a ``compare.run.conductor.Executor``): each cell here (``run_cell_inprocess``), or in its
    own worker process with ``isolate`` (``run_cell_isolated``, scratch files under ``scratch``, a hang ended after
    ``cell_timeout_s``); every row labelled with this machine (``compare.results.environment.node``)."""

    def __init__(self, isolate: bool = False, scratch: Path | None = None, cell_timeout_s: float | None = None):
        self.isolate, self.scratch, self.cell_timeout_s = isolate, scratch, cell_timeout_s

    def describe(self) -> dict[str, Any]:
        return {"name": "local", "isolate": self.isolate}

    def run(self, todo: list[Cell], to: Conductor) -> None:
        plain_refs: dict[str, Any] = {}
        for i, cell in enumerate(todo):
            if not to.may_start(len(todo) - i):
                return
            t0 = time.perf_counter()
            to.starting(cell)
            if self.isolate:
                assert self.scratch is not None
                r, meta = run_cell_isolated(to.specs[cell.backend], cell, to.cfg, self.scratch, self.cell_timeout_s)
            else:
                r, meta = run_cell_inprocess(to.specs[cell.backend], cell, to.cfg, plain_refs)
            to.done(Finished(cell, dataclasses.replace(r, node=environment.node()), meta, time.perf_counter() - t0))

    def close(self) -> None:
        """Nothing to end: every worker process ended with its cell."""


def run_sweep(
    config: dict[str, Any],
    out: Path,
    specs: dict[str, BackendSpec],
    options: RunOptions | None = None,
    *,
    progress: Display | None = None,
    budget: Budget | None = None,
    runner: Runner | None = None,
) -> Results:
    """Run every cell of ``config`` not yet in ``out/results.jsonl`` (of ``options``: ``retry_errors``, ``ceilings``,
    ``isolate``, ``cell_timeout_s``) through the conductor (``compare.run.conductor``) on ``runner``
    (``compare.run.engines``, opened and closed by the caller; None: the local engine), appending every attempt as
    it finishes (a lost worker's ``error`` row marked ``retrying``); return :func:`load_sweep` of the file. The
    ceilings go into this session's header line; a stop raises ``KeyboardInterrupt`` once what is done is stored.
    The workers' scratch folder ``out/.cells`` is removed on the way out, and a stale one on the way in.
    """
    options = options or RunOptions()
    path = out / JSONL
    cfg = TimingConfig(**config["timing"])
    env = environment.collect({}, {})
    cells = cells_from_config(config)
    engine = runner or LocalRunner(options.isolate, out / SCRATCH, options.cell_timeout_s)
    with Store(path) as w:
        check_same_grid(path, config, env)
        _remove_scratch(out)
        try:
            done = done_keys(path, options.retry_errors)
            todo = [c for c in cells if c.key not in done]
            n_done = len(cells) - len(todo)
            if progress:
                progress.resume(n_done, len(cells))
            if progress and n_done:
                progress.message(f"resuming {path}: {n_done}/{len(cells)} cells already done", important=True)
            if progress and options.retry_errors:
                progress.message(
                    f"retrying {len(done_keys(path)) - len(done)} cell(s) whose stored result is an error",
                    important=True,
                )

            def begin(ceil: Ceilings | None) -> None:  # this session's header line
                measured = {"ceilings": to_json(ceil)} if ceil is not None else {}
                w.header(config, env, isolate=options.isolate, engine=engine.describe(), **measured)

            conductor = Conductor(specs, cfg, w, keyed=True, budget=budget, progress=progress)
            try:
                got = conductor.conduct([(engine, todo)], config["dtypes"] if options.ceilings else (), begin)
            except OSError as exc:
                raise exitcodes.WriteFailed(
                    f"cannot append to {path} ({exc.strerror or exc}): the {w.cells} cell lines of this session "
                    f"before it are stored; free space and rerun the same command to resume"
                ) from exc
            if got.interrupted:
                raise KeyboardInterrupt
        finally:
            _remove_scratch(out)
    return load_sweep(path)


def _remove_scratch(out: Path) -> None:
    """Remove the workers' scratch folder ``out/.cells`` if there is one."""
    with contextlib.suppress(FileNotFoundError):  # none: nothing to clean
        shutil.rmtree(out / SCRATCH)
