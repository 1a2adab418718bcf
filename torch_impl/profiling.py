"""Kernels per step of a torch step, counted with ``torch.profiler`` (summary schema in ``compare.kernels.summary``).

What counts as a kernel:

- on CUDA, the device activities (kernels, memcpy, memset) the profiler records on the GPU;
- on CPU, the ops that do the work at the leaves of the op tree: ``aten::mm``, ``aten::gelu``, ``aten::mul``,
  ``aten::copy_``... and Inductor's C++ kernels (``graph_0_cpp_fused_*``, visible only when
  :func:`enable_inductor_kernel_profile` was called before compiling). A composite op that only dispatches to
  others (``aten::linear``, ``aten::matmul``) is not a kernel: its leaves are.

View-like ops that launch nothing (``aten::t``, ``aten::transpose``, ``aten::view``, ``aten::as_strided``...) are
counted apart as ``metadata_ops``. Counts are per step: the total over the active steps divided by their number.

The summary's ``kernel_time`` (``compare.kernels.busy.KernelTime``): the union of the counted kernels' [start, end]
intervals per step (CPU: the ops' ranges, which are leaves of the op tree, so nothing nests, but an op on another
thread can overlap; CUDA: the device activities, which overlap across streams), their summed time, overall and per
kind, and the profiled step's wall time, the mean length of the ``STEP_NAME`` ranges (each ends with the step's
sync, so on CUDA it covers the device work too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from compare.kernels import summary as ks
from compare.kernels.classify import classify
from compare.kernels.names import parse_fused_name
from torch_impl.ops._launch import PREFIX as LAUNCH_PREFIX
from torch_impl.quiet_stderr import filtered_stderr

#: The ``record_function`` range around each profiled step (as in the blog post's profiling script).
STEP_NAME = "fusion_compare_step"
#: The blog post's profiler schedule: one step skipped, one warm-up step, three recorded steps.
WAIT, WARMUP, ACTIVE = 1, 1, 3

#: aten ops that only make views, allocate, or change metadata: no kernel runs for them.
METADATA_OPS: frozenset[str] = frozenset(
    {
        "t",
        "transpose",
        "view",
        "reshape",
        "_unsafe_view",
        "_reshape_alias",
        "as_strided",
        "expand",
        "expand_as",
        "permute",
        "detach",
        "detach_",
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "new_empty_strided",
        "resolve_conj",
        "resolve_neg",
        "alias",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "narrow",
        "flatten",
        "unflatten",
        "view_as",
        "contiguous",
        "lift_fresh",
        "set_",
        "to",
        "numpy_T",
        "result_type",
        "size",
        "stride",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
    }
)
#: Namespaces of profiler events that are bookkeeping, not ops.
_NON_OP_NAMESPACES = frozenset({"autograd", "profiler", "torch", "cuda", "c10d", "record_param_comms"})
_NAMESPACED_OP = re.compile(r"^([A-Za-z_]\w*)::([A-Za-z_]\w*)(?:\.\w+)?$")
#: Device activities that are work (not the GPU-side copies of ``record_function`` ranges).
_DEVICE_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def enable_inductor_kernel_profile(enabled: bool = True) -> bool:
    """Make Inductor's CPU kernels visible to ``torch.profiler`` (``graph_<k>_cpp_fused_*`` events).

    Sets ``torch._inductor.config.cpp.enable_kernel_profile``; it is read when Inductor generates code, so call it
    **before** the first call of a ``torch.compile``-d function. Returns the previous value (to restore it).
    """
    cfg = torch._inductor.config.cpp
    previous = bool(cfg.enable_kernel_profile)
    cfg.enable_kernel_profile = enabled
    return previous


def interpreted_regions() -> frozenset[str]:
    """Profiler ranges counted as one opaque kernel each (kind ``custom``, or ``collective`` by its name): the launch
    ranges of this project's Triton kernels when they run in Triton's CPU interpreter (``torch_impl.ops._launch``:
    ``triton::<kernel>``), else none.

    An interpreted launch runs in Python through numpy: the profiler sees only its range and the interpreter's host
    copies inside it, so the range is one kernel and nothing inside it counts. The range covers the launch alone:
    framework ops around it, inside an ``autograd.Function``'s forward or backward (the recompute GEMMs of
    ``torch-triton-fused``'s backward), are counted one by one like any others.
    """
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        return frozenset()
    return frozenset({LAUNCH_PREFIX + "*"})


def _opaque(name: str, opaque: Collection[str]) -> bool:
    """``name`` is one of ``opaque``, or starts with an entry's prefix (an entry ending in ``*``)."""
    return name in opaque or any(p.endswith("*") and name.startswith(p[:-1]) for p in opaque)


def _bare(name: str) -> str | None:
    """``aten::mm`` -> ``mm`` for an op event; None for bookkeeping events (annotations, autograd nodes...)."""
    m = _NAMESPACED_OP.match(name)
    if m is None or m.group(1) in _NON_OP_NAMESPACES:
        return None
    return m.group(2)


def is_metadata(name: str) -> bool:
    """An aten op that launches nothing (views, transposes, allocations)."""
    m = _NAMESPACED_OP.match(name)
    return m is not None and m.group(1) == "aten" and m.group(2) in METADATA_OPS


def _is_inductor_kernel(name: str) -> bool:
    return parse_fused_name(name) is not None or name.startswith(("triton_", "cpp_"))


def _works(e: FunctionEvent, opaque: Collection[str]) -> bool:
    """Does this CPU event stand for work (an op that is not metadata-only, an Inductor kernel, an opaque range)?"""
    if _opaque(e.name, opaque) or _is_inductor_kernel(e.name):
        return True
    return _bare(e.name) is not None and not is_metadata(e.name)


def _descendants(e: FunctionEvent) -> Iterable[FunctionEvent]:
    stack = list(e.cpu_children)
    while stack:
        c = stack.pop()
        yield c
        stack.extend(c.cpu_children)


#: GEMM ops that are one kernel even when the CPU profiler shows work below them (``aten::addmm`` copies its bias
#: term into the output with an ``aten::copy_`` before the BLAS call): counted whole, their insides not.
ATOMIC_OPS: frozenset[str] = frozenset({"mm", "addmm", "bmm", "baddbmm", "addmv", "mv"})


def _atomic(name: str) -> bool:
    m = _NAMESPACED_OP.match(name)
    return m is not None and m.group(1) == "aten" and m.group(2) in ATOMIC_OPS


def _inside(e: FunctionEvent, opaque: Collection[str]) -> bool:
    """Below an opaque range or an atomic GEMM: its work is already counted as that one kernel."""
    p = e.cpu_parent
    while p is not None:
        if _opaque(p.name, opaque) or _atomic(p.name):
            return True
        p = p.cpu_parent
    return False


def _activity(e: FunctionEvent) -> str:
    return str(getattr(e, "activity_type", "") or "")


def summarize_events(
    events: Iterable[FunctionEvent], device: str, opaque: Collection[str] = (), trace: str | None = None
) -> dict[str, Any]:
    """The kernel summary of profiler events recorded over whole steps, each inside a ``STEP_NAME`` range.

    Counts are totals over the steps divided by the number of ``STEP_NAME`` ranges on the CPU; ``time_us`` is the
    kernel's time per step (CPU: the op's CPU time; CUDA: its device time). ``kernel_time``: the counted kernels'
    intervals merged, per step, beside the mean ``STEP_NAME`` range (module docstring); None without a kernel.
    """
    evs = list(events)
    steps = [e for e in evs if e.name == STEP_NAME and e.device_type == torch.autograd.DeviceType.CPU]
    if not steps:
        raise RuntimeError(f"no '{STEP_NAME}' ranges among the profiler's events: nothing was recorded")
    n = len(steps)
    spans = [(s.time_range.start, s.time_range.end) for s in steps]

    def in_step(e: FunctionEvent) -> bool:
        return any(a <= e.time_range.start <= b for a, b in spans)

    cpu = [
        e
        for e in evs
        if e.device_type == torch.autograd.DeviceType.CPU and not e.is_async and in_step(e) and e.name != STEP_NAME
    ]
    found: dict[str, dict[str, Any]] = {}
    meta: dict[str, dict[str, Any]] = {}
    #: [start, end] (us) of every counted kernel launch, all steps together: their union is the busy time
    intervals: list[tuple[float, float]] = []

    def add(table: dict[str, dict[str, Any]], name: str, start: float, time_us: float) -> None:
        row = table.setdefault(name, {"total": 0, "first": start, "time": 0.0})
        row["total"] += 1
        row["first"] = min(row["first"], start)
        row["time"] += time_us

    cuda = device.startswith("cuda")
    for e in cpu:
        if _inside(e, opaque):
            continue
        if is_metadata(e.name):
            add(meta, e.name, e.time_range.start, 0.0)
        elif (
            not cuda
            and _works(e, opaque)
            and (_opaque(e.name, opaque) or _atomic(e.name) or not any(_works(d, opaque) for d in _descendants(e)))
        ):
            add(found, e.name, e.time_range.start, e.cpu_time_total)
            intervals.append((e.time_range.start, e.time_range.end))
    if cuda:
        for e in evs:
            if e.device_type == torch.autograd.DeviceType.CPU or e.name == STEP_NAME:
                continue
            act = _activity(e)
            if (act and act not in _DEVICE_ACTIVITIES) or (not act and e.is_user_annotation):
                continue
            add(found, e.name, e.time_range.start, e.time_range.end - e.time_range.start)
            intervals.append((e.time_range.start, e.time_range.end))

    notes = []
    uneven = sorted(k for k, r in {**found, **meta}.items() if r["total"] % n)
    if uneven:
        notes.append(f"counts not a multiple of the {n} steps (rounded): {', '.join(uneven)}")
    kernels = []
    for name, r in sorted(found.items(), key=lambda kv: kv[1]["first"]):
        # an opaque range is a custom kernel unless its name says what it is (a collective, counted as one too)
        kind = "custom" if _opaque(name, opaque) and classify(name) != "collective" else None
        kernels.append(ks.kernel_entry(name, round(r["total"] / n), kind=kind, time_us=r["time"] / n))
    metadata = [
        {"name": k, "count": round(r["total"] / n)} for k, r in sorted(meta.items(), key=lambda kv: kv[1]["first"])
    ]
    if not cuda:
        compiled = any(e.name.startswith("## Call CompiledFxGraph") for e in cpu)
        if compiled and not any(_is_inductor_kernel(k) for k in found):
            notes.append(
                "Inductor's fused C++ kernels are invisible here: call "
                "torch_impl.profiling.enable_inductor_kernel_profile() before compiling"
            )
        if any(_opaque(k, opaque) for k in found):
            notes.append(
                "Triton interpreter: each launch runs in Python and shows only as its launch range "
                "(triton::<kernel>), counted as one custom kernel"
            )
    kernel_time = ks.kernel_time_entry(
        kernels,
        intervals,
        n,
        sum(b - a for a, b in spans) / n,
        "torch.profiler CUDA kernels" if cuda else "torch.profiler CPU ops",
    )
    return ks.summary(
        "torch.profiler",
        device,
        kernels,
        metadata,
        trace=trace,
        notes="; ".join(notes),
        steps=n,
        kernel_time=kernel_time,
    )


def profile_step(
    step: Callable[[], Any],
    sync: Callable[[Any], None],
    trace_path: Path | None = None,
    *,
    device: str,
    opaque: Collection[str] | None = None,
    steps: tuple[int, int, int] = (WAIT, WARMUP, ACTIVE),
) -> dict[str, Any]:
    """Run ``step`` under ``torch.profiler`` and return its kernel summary (counts per step).

    Schedule ``wait=1, warmup=1, active=3`` (as the blog post's); each step runs inside
    ``record_function("fusion_compare_step")`` and ends with ``sync(outputs)``. Activities: CPU, plus CUDA when
    ``device`` is a CUDA device. With ``trace_path`` a Chrome trace (JSON with ``traceEvents``) is written there.
    ``opaque``: ranges counted as one ``custom`` kernel each, nothing inside them counted (default:
    :func:`interpreted_regions`). ``steps``: the (wait, warmup, active) schedule; interpreted (parity-only)
    backends pass ``(0, 0, 1)``, since their steps cost seconds and their counts do not depend on warm-up.
    """
    wait, warmup, active = steps
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with (
        filtered_stderr(),
        profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1)) as prof,
    ):
        for _ in range(wait + warmup + active):
            with record_function(STEP_NAME):
                sync(step())
            prof.step()
    trace = None
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
        trace = str(trace_path)
    regions = interpreted_regions() if opaque is None else frozenset(opaque)
    return summarize_events(prof.events(), device, regions, trace)


#: The counter :func:`count_flops` reads (``compare.kernels.summary``'s ``flop_count.source``).
FLOP_COUNTER = "torch.utils.flop_counter"


def count_flops(step: Callable[[], Any], sync: Callable[[Any], None]) -> dict[str, Any]:
    """FLOPs of one call of ``step``, counted by ``torch.utils.flop_counter`` (a summary's ``flop_count``:
    ``{"flops", "by_op": {op: flops}, "source"}``, or ``flops`` None and ``error`` where counting failed).

    The counter counts only the ops in its registry (matmuls, convolutions, attention), so an MLP's elementwise
    work is not in it. It runs as the counter's dispatch mode alone: ``FlopCounterMode``'s own module tracker
    installs backward hooks that ``torch.autograd.grad`` over a leaf input refuses (the shared runner's step), and
    every count lands under its ``"Global"`` entry anyway. ``torch.compile`` refuses to run under a dispatch mode,
    so the runner counts a compiled backend's step on its eager module (the same FLOPs)."""
    from torch.utils import flop_counter

    counter = flop_counter.FlopCounterMode(display=False)
    try:
        with flop_counter._FlopCounterMode(counter):
            sync(step())
        counts = counter.get_flop_counts().get("Global", {})
    except Exception as exc:  # say so in the result, with the reason: the report then shows no count
        first = " ".join(str(exc).split("\n", 1)[0].split())[:200]
        return {"flops": None, "by_op": {}, "source": FLOP_COUNTER, "error": f"{type(exc).__name__}: {first}"}
    by_op = {str(op).removeprefix("aten."): float(n) for op, n in counts.items()}
    return {"flops": float(sum(by_op.values())), "by_op": by_op, "source": FLOP_COUNTER}
