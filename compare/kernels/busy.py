"""Kernel time per step with overlaps merged, split by kind, beside the step's wall time. Pure Python.

A profiler gives each kernel's own time (``time_us`` of a summary row: its launches' durations added up). Kernels
can run at once (XLA:CPU runs independent kernels on its thread pool; on a GPU, streams overlap), so the plain sum
of the rows can exceed the time the device was busy. :func:`merged_us` takes the union of the kernels' [start, end]
intervals instead: every microsecond during which at least one kernel ran counts once. That is ``busy_us``; the
plain sum is ``summed_us``.

How the busy time splits by kind cannot be read off a union (which kernel owns an overlapped microsecond?), so the
split takes the kinds' summed times, normalizes them to their total (the shares add up to 1), and applies those
shares to the merged busy time (:func:`split`). Where nothing overlaps the two agree exactly.

``overhead_s`` is the step's wall time (timed without the profiler) minus its busy time: what the framework spends
outside kernels (dispatch, Python, allocation, synchronization). It keeps its sign: a negative overhead says the
profiled kernel time exceeded the unprofiled wall time (the profiler's own cost, a machine busier during the
profile than during the timing), and :meth:`KernelTime.consistent` flags it beyond a margin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CONSISTENT_MARGIN", "SPLIT_GROUPS", "KernelTime", "merged_us", "split"]

#: How far busy time may exceed the wall time before :meth:`KernelTime.consistent` says no: 10 % (busy <= wall *
#: 1.10). The profiler slows kernels a little and the profile and the timing run minutes apart on a shared machine.
CONSISTENT_MARGIN = 0.10

#: The groups of :func:`split`, each with the kernel kinds (``compare.kernels.summary.KINDS``) it holds.
#: ``unfused`` is the standalone memory-bound work a fuser would merge into a neighbour: unfused elementwise
#: kernels and reductions (a bias gradient's ``sum``, a softmax) alike. ``fused`` is kind ``fused`` alone (kernels
#: that absorbed several ops). ``other`` holds copies, opaque ``custom`` kernels (an interpreted Triton launch, a
#: custom call whose target names no GEMM: what they do is not known, so they are not claimed as fused) and
#: ``other``; a kind named by no group also lands there.
SPLIT_GROUPS: dict[str, tuple[str, ...]] = {
    "gemm": ("gemm",),
    "fused": ("fused",),
    "unfused": ("elementwise", "reduction"),
    "collective": ("collective",),
    "other": ("copy", "custom", "other"),
}


def merged_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``[start, end]`` intervals (any unit; microseconds here), in any order: time
    covered by several intervals (overlapping or nested) counts once. 0.0 for none. An interval that ends before it
    starts is a ``ValueError`` (a misread trace, never something to drop quietly)."""
    spans = sorted((float(a), float(b)) for a, b in intervals)
    bad = next(((a, b) for a, b in spans if b < a), None)
    if bad is not None:
        raise ValueError(f"interval ends before it starts: [{bad[0]}, {bad[1]}]")
    if not spans:
        return 0.0
    total = 0.0
    start, end = spans[0]  # the current run of intervals that touch one another
    for a, b in spans[1:]:
        if a > end:  # a gap: the run is closed
            total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start)


@dataclass(frozen=True)
class KernelTime:
    """A step's kernel time from a profile, per step, in microseconds.

    ``busy_us``: the union of the kernels' intervals over the recorded steps, divided by the steps (overlaps count
    once). ``summed_us``: the plain sum of the kernels' ``time_us``. ``by_kind_us``: the kernels' summed time per
    kind present (``compare.kernels.summary.KINDS`` order). ``profiled_step_us``: the wall time of one profiled step
    (the mean of the recorded steps' ranges), None where the profiler shows no step boundary. ``source``: what
    measured it (``"torch.profiler CPU ops"``, ``"torch.profiler CUDA kernels"``, ``"XLA trace"``).
    """

    busy_us: float
    summed_us: float
    by_kind_us: dict[str, float] = field(default_factory=dict)
    profiled_step_us: float | None = None
    source: str = ""

    def consistent(self, wall_s: float, margin: float = CONSISTENT_MARGIN) -> bool:
        """Does the busy time fit in the step's (unprofiled) wall time ``wall_s``, up to ``margin`` above it
        (``busy <= wall * (1 + margin)``)? False for a NaN wall time."""
        return self.busy_us * 1e-6 <= wall_s * (1.0 + margin)


def split(k: KernelTime, wall_s: float) -> dict[str, float]:
    """A step's time split: the share of the busy time in each :data:`SPLIT_GROUPS` group (``gemm_share``,
    ``fused_share``, ``unfused_share``, ``collective_share``, ``other_share``: the groups' summed times over the
    kinds' total, so they add up to 1; all 0.0 when no kernel time was measured) and the seconds each stands for
    (``gemm_s``... = share x ``busy_s``), with ``busy_s`` (merged kernel time), ``wall_s`` (as given: the unprofiled
    step) and ``overhead_s = wall_s - busy_s`` (negative when the kernels took longer than the wall time; never
    clamped: see :meth:`KernelTime.consistent`)."""
    total = sum(k.by_kind_us.values())
    grouped = {kind: g for g, kinds in SPLIT_GROUPS.items() for kind in kinds}
    per_group = dict.fromkeys(SPLIT_GROUPS, 0.0)
    for kind, us in k.by_kind_us.items():
        per_group[grouped.get(kind, "other")] += us
    busy_s = k.busy_us * 1e-6
    out: dict[str, float] = {"busy_s": busy_s, "wall_s": wall_s, "overhead_s": wall_s - busy_s}
    for g, us in per_group.items():
        share = us / total if total > 0 else 0.0
        out[f"{g}_share"] = share
        out[f"{g}_s"] = share * busy_s
    return out
