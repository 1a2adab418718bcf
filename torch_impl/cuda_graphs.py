"""CUDA-graph capture of a prepared torch step, for timing its replay against its eager launches.

A CUDA graph records the kernels one call of the step launches, with their arguments (device addresses
included), and replays them with one launch from the host: what the graph saves is the host's launch cost per
kernel, never device work. The recipe is PyTorch's (``torch.cuda.graphs``): a few calls on a side stream first (so
that lazy initialisation, cuBLAS workspaces and the caching allocator settle outside the capture), then one call
captured under ``torch.cuda.graph(g)``, whose outputs become the graph's *static* outputs.

What a graph cannot hold, and so what comes back as :class:`NotCaptured` with its reason rather than an error: a
sync with the host inside the step (``.item()``, ``.cpu()``, a data-dependent shape), an op that is not capturable
(some of autograd's, a fresh random seed, a new allocation the pool cannot give), or no CUDA device at all.

Nothing touches CUDA when this module is imported (the CPU build of torch imports it as well).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The reason of :class:`NotCaptured` where torch sees no CUDA device.
NO_CUDA = "no CUDA device: CUDA graphs need one"


@dataclass(frozen=True)
class Captured:
    """A step captured into a CUDA graph.

    ``replay()`` launches the graph (asynchronously, like the step's own launches: sync as for the step) and
    returns ``output``, the step's static outputs, the very tensors the captured call returned. Every replay
    overwrites them in place: read (or copy) an output before the next replay. The graph reads the memory of the
    step's inputs where they were at capture, so ``replay`` keeps the step (and through it its inputs) alive.
    ``output`` already holds one replay's result when :func:`capture` returns."""

    replay: Callable[[], Any]
    output: Any
    note: str


@dataclass(frozen=True)
class NotCaptured:
    """Why a step was not captured (a sentence the results can carry as it is)."""

    reason: str


@dataclass(frozen=True)
class _Replay:
    """``Captured.replay``: the graph, its static outputs, and the step, kept alive for the graph's addresses."""

    graph: Any
    output: Any
    step: Callable[[], Any]

    def __call__(self) -> Any:
        self.graph.replay()
        return self.output


def _said(exc: BaseException) -> str:
    """An exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__


def capture(step: Callable[[], Any], *, warmup: int = 3, cuda: Any = None) -> Captured | NotCaptured:
    """Capture one call of ``step`` (zero arguments, its inputs already on the device) into a CUDA graph.

    ``warmup`` calls run first on a side stream, then one call is captured, then the graph is replayed once and
    the device synced (so that ``Captured.output`` holds a result and a replay that fails fails here). ``cuda`` is
    the namespace used (``torch.cuda`` by default; a test passes a fake with ``is_available``, ``Stream``,
    ``stream``, ``current_stream``, ``CUDAGraph``, ``graph`` and ``synchronize``). Returns :class:`NotCaptured`
    with the reason, never raises, when there is no CUDA device or any of these steps fails; a ``warmup`` under 1
    is the caller's error (``ValueError``)."""
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 (capture needs the step's lazy set-up done), got {warmup}")
    if cuda is None:
        import torch

        cuda = torch.cuda
    if not cuda.is_available():
        return NotCaptured(NO_CUDA)
    stage = f"the {warmup} warm-up calls on a side stream"
    try:
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(warmup):
                step()
        cuda.current_stream().wait_stream(side)
        stage = "the capture"
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            output = step()
        stage = "the first replay"
        graph.replay()
        cuda.synchronize()
    except Exception as exc:  # the design: a step that cannot be captured is a recorded reason, never an error
        reason = f"the step could not be captured into a CUDA graph: {stage} failed with {_said(exc)}"
        try:
            cuda.synchronize()
        except Exception as later:  # recorded with the first failure: the device may be unusable after it
            reason += f"; the device then failed to sync too ({_said(later)})"
        return NotCaptured(reason)
    note = (
        f"one call captured after {warmup} warm-up calls on a side stream and replayed once; each replay "
        "overwrites the step's outputs in place"
    )
    return Captured(replay=_Replay(graph, output, step), output=output, note=note)
