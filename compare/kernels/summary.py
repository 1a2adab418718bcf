"""Kernels per step: the summary every profiler adapter returns, as JSON data and as typed records (the report section
is ``compare.report.kernels``; names are parsed by ``compare.kernels.names``, shortened by ``compare.kernels.shorten``
and classified by ``compare.kernels.classify``).

Framework-agnostic (imports neither torch nor jax). ``torch_impl.profiling`` fills a summary from
``torch.profiler``; ``jax_impl.profiling`` fills one from XLA's optimized HLO, both with :func:`kernel_entry` and
:func:`summary`. A result stores it as :class:`Kernels` (``from_json(Kernels, summary)``, ``compare.formats.codec``).

A kernel summary is a JSON-able dict; every count is **per step** (one call of ``Prepared.step``)::

    {
      "source": "torch.profiler" | "xla-hlo",
      "device": str,                       # "cpu", "cuda", ...
      "kernels_per_step": int,             # sum of the kernels' counts
      "kernels": [                         # in order of first launch within a step
        {"name": str,                      # as the profiler / HLO names it, e.g. "aten::mm",
                                           #   "graph_0_cpp_fused__unsafe_view_gelu_mul_0", "ynn_fusion"
         "short": str,                     # shorten(name), for tables
         "kind": "gemm" | "elementwise" | "fused" | "reduction" | "copy" | "collective" | "custom" | "other",
         "count": int,                     # launches per step
         "absorbed": [str],                # ops a fused kernel absorbed ([] for an unfused kernel)
         "time_us": float | None},         # time per step, all its launches together (None: not measured)
      ],
      "metadata_ops": [{"name": str, "count": int}],   # ops that launch nothing (views, transposes, bitcasts)
      "trace": str | None,                 # where a Chrome/Perfetto/XPlane trace was written, if one was
      "notes": str,
      "steps": int | None,                 # steps a profiler recorded (None: read off a compiled program)
      "xla_cost": {"flops", "bytes_accessed", "transcendentals": float | None, "error"?: str},  # JAX only
      "flop_count": {"flops": float | None, "by_op": {op: float}, "source": str, "error"?: str},  # optional
      "kernel_time": {                     # optional; absent or None where not measured (a kernel without a time)
        "busy_us": float,                  # the kernels' intervals merged (overlaps once), per step
        "summed_us": float,                # the kernels' time_us added up
        "by_kind_us": {kind: float},       # time_us added up per kind present, in KINDS order
        "profiled_step_us": float | None,  # wall time of one profiled step (None: no step boundary in the trace)
        "source": str} | None,             # "torch.profiler CPU ops", "torch.profiler CUDA kernels", "XLA trace"
    }

``kernel_time`` is ``compare.kernels.busy.KernelTime`` (what it means, and the split of a step's wall time into
GEMMs, fused and unfused kernels and framework overhead: :func:`compare.kernels.busy.split`); a summary fills it
with :func:`kernel_time_entry`. Summaries and result files written before it existed have no such field and load
as before.

``flop_count`` is what ``torch.utils.flop_counter`` counted over one step (``torch_impl.profiling.count_flops``;
torch backends of a user's module, ``--module``, whose FLOPs no cost-model plan models); absent elsewhere and in
older files. It counts only matmul-like ops (no elementwise FLOPs), where XLA's ``xla_cost`` counts every op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compare.formats.codec import LATER, from_json, to_json
from compare.kernels.busy import KernelTime, merged_us
from compare.kernels.classify import classify
from compare.kernels.names import parse_fused_name
from compare.kernels.shorten import shorten

__all__ = [
    "KINDS",
    "SOURCES",
    "KernelEntry",
    "Kernels",
    "MetadataOp",
    "check_summary",
    "count_by_kind",
    "describe",
    "kernel_entry",
    "kernel_time_entry",
    "summary",
]

SOURCES: tuple[str, ...] = ("torch.profiler", "xla-hlo")
KINDS: tuple[str, ...] = ("gemm", "elementwise", "fused", "reduction", "copy", "collective", "custom", "other")


@dataclass(frozen=True)
class KernelEntry:
    """One kernel of a step: its name, short name, kind, launches per step, absorbed ops and time per step."""

    name: str
    short: str
    kind: str
    count: int
    absorbed: tuple[str, ...] = ()
    time_us: float | None = None

    @staticmethod
    def json_fill(d: Mapping[str, Any]) -> dict[str, Any]:
        """An entry without a short name takes its name (``compare.formats.codec``)."""
        return {"short": d.get("name")}


@dataclass(frozen=True)
class MetadataOp:
    """An op that launches nothing (a view, a transpose, a bitcast), with its count per step."""

    name: str
    count: int


@dataclass(frozen=True)
class Kernels:
    """A result's kernel summary (the module docstring's schema). ``xla_cost`` is XLA's ``cost_analysis()`` of the
    compiled step (JAX backends), None elsewhere; ``kernel_time`` the step's merged kernel time, None where it was
    not measured; ``flop_count`` ``torch.utils.flop_counter``'s count of one step (a module case's torch
    backends), None elsewhere."""

    source: str
    device: str
    kernels_per_step: int
    kernels: tuple[KernelEntry, ...] = ()
    metadata_ops: tuple[MetadataOp, ...] = ()
    trace: str | None = None
    notes: str = ""
    steps: int | None = None
    xla_cost: dict[str, Any] | None = field(default=None, metadata=LATER)
    kernel_time: KernelTime | None = field(default=None, metadata=LATER)
    flop_count: dict[str, Any] | None = field(default=None, metadata=LATER)

    @staticmethod
    def json_fill(d: Mapping[str, Any]) -> dict[str, Any]:
        """What a partial summary takes (``compare.formats.codec``): no source or device named, and
        ``kernels_per_step`` the sum of its kernels' counts."""
        kernels = d.get("kernels")
        counts = [k.get("count") for k in kernels if isinstance(k, Mapping)] if isinstance(kernels, list) else []
        return {"source": "", "device": "", "kernels_per_step": sum(c for c in counts if isinstance(c, int))}

    def count_by_kind(self) -> dict[str, int]:
        """Kernels per step of each kind present, e.g. ``{"gemm": 3, "fused": 1}``, in ``KINDS`` order."""
        out = {kind: 0 for kind in KINDS}
        for k in self.kernels:
            out[k.kind] = out.get(k.kind, 0) + k.count
        return {kind: n for kind, n in out.items() if n}

    def describe(self) -> str:
        """A plain-text listing, one line per kernel (for logs and test output)."""
        lines = [f"{self.source} on {self.device}: {self.kernels_per_step} kernels per step"]
        for k in self.kernels:
            t = "" if k.time_us is None else f"  {k.time_us:.1f} us"
            absorbed = f"  absorbed: {' '.join(k.absorbed)}" if k.absorbed else ""
            lines.append(f"  {k.count:3d} x {k.kind:11s} {k.name}{absorbed}{t}")
        meta = ", ".join(f"{m.name} x{m.count}" for m in self.metadata_ops) or "none"
        lines.append("  metadata ops: " + meta)
        kt = self.kernel_time
        if kt is not None:
            step = "" if kt.profiled_step_us is None else f", profiled step {kt.profiled_step_us:.1f} us"
            lines.append(f"  kernel time ({kt.source}): busy {kt.busy_us:.1f} us, summed {kt.summed_us:.1f} us{step}")
        return "\n".join(lines)


def kernel_entry(
    name: str,
    count: int,
    *,
    kind: str | None = None,
    absorbed: Sequence[str] | None = None,
    time_us: float | None = None,
) -> dict[str, Any]:
    """One ``kernels`` item of a summary; ``kind`` and ``absorbed`` default to what the name says."""
    if absorbed is None:
        absorbed = parse_fused_name(name) or []
    kind = kind or classify(name)
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; known: {', '.join(KINDS)}")
    entry = KernelEntry(
        name, shorten(name), kind, int(count), tuple(absorbed), None if time_us is None else float(time_us)
    )
    return to_json(entry)


def kernel_time_entry(
    kernels: Sequence[Mapping[str, Any]],
    intervals_us: Iterable[tuple[float, float]],
    steps: int,
    profiled_step_us: float | None,
    source: str,
) -> dict[str, Any] | None:
    """The ``kernel_time`` of a summary whose ``kernels`` (its rows, times per step) were measured over ``steps``
    recorded steps, each of their launches over ``intervals_us`` (``[start, end]`` in microseconds, all steps
    together): the union of the intervals per step, the rows' times summed, overall and per kind. None where there
    is nothing to split: no kernel, or a kernel without a time (a partial table would misstate the split)."""
    if steps < 1:
        raise ValueError(f"kernel time over {steps} steps")
    if not kernels or any(k["time_us"] is None for k in kernels):
        return None
    unknown = sorted({str(k["kind"]) for k in kernels} - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kernel kinds {unknown}; known: {', '.join(KINDS)}")
    by_kind = {kind: [float(k["time_us"]) for k in kernels if k["kind"] == kind] for kind in KINDS}
    kt = KernelTime(
        busy_us=merged_us(intervals_us) / steps,
        summed_us=sum(float(k["time_us"]) for k in kernels),
        by_kind_us={kind: sum(times) for kind, times in by_kind.items() if times},
        profiled_step_us=profiled_step_us,
        source=source,
    )
    return to_json(kt)


def summary(
    source: str,
    device: str,
    kernels: list[dict[str, Any]],
    metadata_ops: list[dict[str, Any]],
    trace: str | None = None,
    notes: str = "",
    steps: int | None = None,
    kernel_time: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A kernel summary dict (schema in the module docstring); ``kernels_per_step`` is the sum of counts;
    ``steps`` is how many steps a profiler recorded (None where the count is read off a compiled program);
    ``kernel_time`` the step's merged kernel time (:func:`kernel_time_entry`), None where not measured."""
    if source not in SOURCES:
        raise ValueError(f"unknown kernel summary source {source!r}; known: {', '.join(SOURCES)}")
    return {
        "source": source,
        "device": device,
        "kernels_per_step": sum(k["count"] for k in kernels),
        "kernels": kernels,
        "metadata_ops": metadata_ops,
        "trace": trace,
        "notes": notes,
        "steps": steps,
        "kernel_time": kernel_time,
    }


def check_summary(s: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first way ``s`` departs from the schema."""
    keys = {"source", "device", "kernels_per_step", "kernels", "metadata_ops", "trace", "notes"}
    if not keys <= set(s):
        raise ValueError(f"kernel summary lacks {sorted(keys - set(s))}")
    if s["source"] not in SOURCES:
        raise ValueError(f"unknown source {s['source']!r}")
    for k in s["kernels"]:
        if not {"name", "short", "kind", "count", "absorbed", "time_us"} <= set(k):
            raise ValueError(f"kernel entry {k} lacks keys")
        if k["kind"] not in KINDS or not isinstance(k["count"], int) or not isinstance(k["absorbed"], list):
            raise ValueError(f"bad kernel entry {k}")
    if s["kernels_per_step"] != sum(k["count"] for k in s["kernels"]):
        raise ValueError("kernels_per_step is not the sum of the kernels' counts")
    for m in s["metadata_ops"]:
        if not isinstance(m.get("name"), str) or not isinstance(m.get("count"), int):
            raise ValueError(f"bad metadata op entry {m}")
    kt = s.get("kernel_time")
    if kt is not None:  # optional: summaries written before it existed have none
        t = from_json(KernelTime, kt)  # a FieldError (a ValueError) names a missing or mistyped field
        unknown = sorted(set(t.by_kind_us) - set(KINDS))
        if unknown:
            raise ValueError(f"kernel_time.by_kind_us has unknown kinds {unknown}")
        if t.busy_us < 0 or t.summed_us < 0:
            raise ValueError(f"negative kernel time {kt}")


def count_by_kind(s: dict[str, Any]) -> dict[str, int]:
    """Kernels per step of each kind present in a summary dict (:meth:`Kernels.count_by_kind`)."""
    return from_json(Kernels, s).count_by_kind()


def describe(s: dict[str, Any]) -> str:
    """A plain-text listing of a summary dict, one line per kernel (:meth:`Kernels.describe`)."""
    return from_json(Kernels, s).describe()
