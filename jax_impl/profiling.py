"""Kernels per step of a jitted JAX function, read from XLA's optimized HLO (summary schema in
``compare.kernels.summary``).

XLA decides the kernels when it compiles: after optimization, every top-level instruction of the entry
computation that does work is one kernel (a thunk) per call. So the count needs no profiler:

- each ``fusion`` is one kernel; ``absorbed`` lists the HLO ops of its fused computation (``dot`` inside a fusion
  makes it a ``gemm``: on CPU XLA wraps GEMMs as ``kCustom`` fusions, e.g. ``__ynn_fusion``);
- each ``custom-call`` is one kernel, named by its target (``__onednn$matmul``, ``__cublas$gemm``...);
- a ``dot``/``convolution`` outside any fusion is a ``gemm`` kernel, and any other real op is one kernel;
- ``parameter``, ``constant``, ``tuple`` and ``get-tuple-element`` are skipped; ``bitcast`` and ``reshape`` (a
  transpose that only relabels the layout becomes a ``bitcast``) launch nothing and go to ``metadata_ops``.

XLA's own cost model (``compiled.cost_analysis()``) is returned under ``"xla_cost"``.

Kernel times come from a trace, not the HLO: :func:`profile_jit` runs the real step under ``jax.profiler.trace``
(:func:`traced`). XLA's trace names the program (``hlo_module``) and the instruction (``hlo_op``) of every kernel it
runs, so each kernel row of the table gets its events' total duration per step (:func:`kernel_times`), or, if any
row has no event, no row gets a time. ``dispatch_profile`` times its replayed programs with the same two functions.

The summary's ``kernel_time`` (``compare.kernels.busy.KernelTime``, source ``"XLA trace"``) comes from the same
trace: the union of the table's kernel events' [ts, ts + dur] intervals over the traced steps, per step (XLA:CPU
runs independent kernels at once on its pool, so the union can be shorter than the events' sum), beside the
profiled step's wall time. :func:`traced_run` wraps each traced step in a ``jax.profiler.TraceAnnotation`` named
:data:`STEP_NAME`, and that range's mean length is the profiled step; where the trace holds no such range for every
step, ``profiled_step_us`` is None. It is filled only when :func:`kernel_times` timed every kernel.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import jax

from compare.kernels import summary as ks
from compare.kernels.classify import classify

#: Top-level opcodes that are neither work nor metadata.
SKIPPED = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
    }
)
#: Opcodes that only relabel a buffer: no kernel.
METADATA = frozenset({"bitcast", "reshape"})
#: Opcodes left out of a fusion's ``absorbed`` list (its inputs and literals, not work).
NOT_ABSORBED = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})
#: Ops that only move or relabel data inside a fusion.
_DATA_MOVEMENT = frozenset(
    {
        "bitcast",
        "reshape",
        "broadcast",
        "copy",
        "transpose",
        "slice",
        "concatenate",
        "pad",
        "convert",
        "dynamic-slice",
        "dynamic-update-slice",
    }
)
_GEMM_OPS = frozenset({"dot", "convolution"})
_GEMM_TARGET = re.compile(r"gemm|matmul|conv|dot", re.IGNORECASE)

_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s({]+)\s*[({]")
_INSTR = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_CALLS = re.compile(r"\b(?:calls|to_apply)=\{?%?(?P<c>[\w.\-]+)")
_FUSION_KIND = re.compile(r"\bkind=(?P<k>k\w+)")
_TARGET = re.compile(r'custom_call_target="(?P<t>[^"]+)"')
_BACKEND_KIND = re.compile(r'"kind":"(?P<k>__[^"]+)"')
_MODULE_NAME = re.compile(r"^HloModule\s+(?P<n>[^\s,]+)", re.MULTILINE)

#: Steps :func:`profile_jit` records under ``jax.profiler.trace`` for the kernel times, after one warm-up step.
TRACED_STEPS = 3
#: The ``jax.profiler.TraceAnnotation`` around each traced step (the name torch's profiler range has).
STEP_NAME = "fusion_compare_step"
#: ``KernelTime.source`` of a time read off XLA's trace.
KERNEL_TIME_SOURCE = "XLA trace"
#: How XLA's trace names the instruction a kernel event ran: (``hlo_module``, ``hlo_op``).
Site = tuple[str, str]
K = TypeVar("K", bound=Hashable)


@dataclass
class Instruction:
    """One HLO instruction: ``name = shape opcode(operands), attributes``."""

    name: str
    opcode: str
    shape: str
    rest: str
    calls: list[str] = field(default_factory=list)

    @property
    def fusion_kind(self) -> str:
        m = _FUSION_KIND.search(self.rest)
        return m.group("k") if m else ""

    @property
    def backend_kind(self) -> str:
        """A custom fusion's backend (``__ynn_fusion``, ``__triton_gemm``...), or ""."""
        m = _BACKEND_KIND.search(self.rest)
        return m.group("k") if m else ""

    @property
    def target(self) -> str:
        m = _TARGET.search(self.rest)
        return m.group("t") if m else ""


@dataclass
class HloModule:
    """The computations of an HLO module text, by name, and which one is the entry."""

    computations: dict[str, list[Instruction]]
    entry: str
    #: the module's name (its ``HloModule`` line): the ``hlo_module`` of its kernels' trace events
    name: str = ""


def module_name(text: str) -> str:
    """The name on an HLO module text's ``HloModule`` line, "" without one."""
    m = _MODULE_NAME.search(text)
    return m.group("n") if m else ""


def _split_shape(s: str) -> tuple[str, str]:
    """``"(f32[2], s32[]) tuple(...)"`` -> (``"(f32[2], s32[])"``, rest): a tuple shape has spaces inside."""
    s = s.lstrip()
    if not s.startswith("("):
        cut = s.find(" ")
        return (s, "") if cut < 0 else (s[:cut], s[cut:])
    depth = 0
    for i, ch in enumerate(s):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return s[: i + 1], s[i + 1 :]
    return s, ""


def parse_hlo(text: str) -> HloModule:
    """Parse HLO module text (``compiled.as_text()``) into its computations' instructions."""
    comps: dict[str, list[Instruction]] = {}
    entry = ""
    current: list[Instruction] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            m = _HEADER.match(line)
            if m and stripped.endswith("{") and not stripped.startswith("HloModule"):
                current = comps.setdefault(m.group("name"), [])
                if m.group("entry"):
                    entry = m.group("name")
            continue
        if stripped == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m is None:
            continue
        shape, after = _split_shape(line[m.end() :])
        op = _OPCODE.match(after)
        if op is None:
            continue
        rest = after[op.end() :]
        current.append(
            Instruction(m.group("name"), op.group("op"), shape, rest, [c.group("c") for c in _CALLS.finditer(rest)])
        )
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return HloModule(comps, entry, module_name(text))


def fused_ops(module: HloModule, computation: str, _seen: frozenset[str] = frozenset()) -> list[str]:
    """The HLO opcodes inside a fused computation, first appearance first, nested fusions/calls included."""
    out: list[str] = []
    for ins in module.computations.get(computation, []):
        if ins.opcode in ("fusion", "call") and ins.calls and ins.calls[0] not in _seen:
            inner = fused_ops(module, ins.calls[0], _seen | {computation})
            out.extend(o for o in inner if o not in out)
        elif ins.opcode not in NOT_ABSORBED and ins.opcode not in out:
            out.append(ins.opcode)
    return out


def _fusion_kind(ins: Instruction, absorbed: list[str]) -> str:
    if _GEMM_OPS & set(absorbed) or _GEMM_TARGET.search(ins.backend_kind):
        return "gemm"
    work = [o for o in absorbed if o not in ("bitcast", "reshape", "broadcast")]
    if not work or all(o in _DATA_MOVEMENT for o in work):
        return "copy"
    if len(work) == 1:
        return classify(work[0])
    return "fused"


def _base(name: str) -> str:
    """``ynn_fusion.2`` -> ``ynn_fusion``: XLA numbers instructions that share a name."""
    return re.sub(r"\.\d+$", "", name)


@dataclass
class HloKernels:
    """The kernel table of an HLO module's entry computation (:func:`hlo_kernel_table`)."""

    kernels: list[dict[str, Any]]
    metadata_ops: list[dict[str, Any]]
    #: fusion kinds (``kLoop``, ``kCustom(__ynn_fusion)``...) with their counts
    fusions: dict[str, int]
    #: instruction name -> index in ``kernels`` of the row it runs as, for every kernel instruction
    sites: dict[str, int]


def hlo_kernel_table(module: HloModule) -> HloKernels:
    """The kernels of the entry computation, in schedule order, and which instruction runs as which row.

    Kernels with the same base name, kind and absorbed ops are one entry with a count.
    """
    groups: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}
    meta: dict[str, int] = {}
    fusions: dict[str, int] = {}

    def visit(computation: str, seen: frozenset[str]) -> None:
        for ins in module.computations.get(computation, []):
            op = ins.opcode
            if op in SKIPPED:
                continue
            if op in METADATA:
                meta[op] = meta.get(op, 0) + 1
                continue
            if op == "call" and ins.calls and ins.calls[0] not in seen:
                visit(ins.calls[0], seen | {computation})
                continue
            absorbed: list[str] = []
            if op == "fusion":
                absorbed = fused_ops(module, ins.calls[0]) if ins.calls else []
                name, kind = _base(ins.name), _fusion_kind(ins, absorbed)
                label = ins.fusion_kind + (f"({ins.backend_kind})" if ins.backend_kind else "")
                fusions[label] = fusions.get(label, 0) + 1
            elif op == "custom-call":
                name = ins.target or _base(ins.name)
                kind = "gemm" if _GEMM_TARGET.search(name) else "custom"
            elif op in _GEMM_OPS:
                name, kind = op, "gemm"
            else:
                name, kind = op, classify(op)
            row = groups.setdefault((name, kind, tuple(absorbed)), {"count": 0, "first": ins.name, "sites": []})
            row["count"] += 1
            row["sites"].append(ins.name)

    visit(module.entry, frozenset())
    base_names = [key[0] for key in groups]
    kernels = []
    sites: dict[str, int] = {}
    for i, ((name, kind, absorbed), row) in enumerate(groups.items()):
        shown = name if base_names.count(name) == 1 else row["first"]
        kernels.append(ks.kernel_entry(shown, row["count"], kind=kind, absorbed=list(absorbed)))
        sites.update(dict.fromkeys(row["sites"], i))
    return HloKernels(kernels, [{"name": k, "count": v} for k, v in meta.items()], fusions, sites)


def hlo_kernels(module: HloModule) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """(kernels, metadata_ops, fusion kinds with counts) of the entry computation (:func:`hlo_kernel_table`)."""
    table = hlo_kernel_table(module)
    return table.kernels, table.metadata_ops, table.fusions


def xla_cost(compiled: Any) -> dict[str, float | None]:
    """XLA's cost model for a compiled executable: flops, bytes accessed and transcendentals (None if absent).

    ``cost_analysis()`` returns a dict in current JAX and a one-element list of dicts in older releases.
    """
    error = None
    try:
        raw = compiled.cost_analysis()
    except Exception as exc:  # some backends do not implement it: say so in the result, with the reason
        raw, error = None, f"{type(exc).__name__}: {exc}"
    if isinstance(raw, list | tuple):
        raw = raw[0] if raw else None
    raw = raw or {}

    def get(key: str) -> float | None:
        v = raw.get(key)
        return None if v is None else float(v)

    out: dict[str, Any] = {
        "flops": get("flops"),
        "bytes_accessed": get("bytes accessed"),
        "transcendentals": get("transcendentals"),
    }
    if error:
        out["error"] = error
    return out


def _find_trace(trace_dir: Path) -> str | None:
    """The newest trace file JAX wrote under ``trace_dir``: a Chrome ``.trace.json.gz``, else an ``.xplane.pb``."""
    for pattern in ("*.trace.json.gz", "*.xplane.pb"):
        found = sorted(trace_dir.rglob(pattern), key=lambda p: (p.stat().st_mtime, str(p)))
        if found:
            return str(found[-1])
    return None


#: A trace event's [start, end] in microseconds (``ts``, ``ts + dur``).
Interval = tuple[float, float]


@dataclass(frozen=True)
class TraceIntervals:
    """What a Chrome trace says about time (:func:`trace_intervals`), in microseconds on the trace's clock."""

    #: (``hlo_module``, ``hlo_op``) -> the intervals of its kernel events, in the trace's order
    kernels: dict[Site, list[Interval]]
    #: the :data:`STEP_NAME` ranges, in the trace's order
    steps: list[Interval]


def trace_intervals(trace_file: str | None) -> TraceIntervals:
    """The kernel events of a Chrome trace (``.trace.json.gz``) as intervals, by (``hlo_module``, ``hlo_op``), and
    its :data:`STEP_NAME` ranges; nothing without a Chrome trace (an ``.xplane.pb`` alone, or no file)."""
    kernels: dict[Site, list[Interval]] = {}
    steps: list[Interval] = []
    if trace_file is None or not trace_file.endswith(".trace.json.gz"):
        return TraceIntervals(kernels, steps)
    with gzip.open(trace_file, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        ts = float(e.get("ts", 0.0))
        span = (ts, ts + float(e.get("dur", 0.0)))
        a = e.get("args") or {}
        if "hlo_module" in a and "hlo_op" in a:
            kernels.setdefault((str(a["hlo_module"]), str(a["hlo_op"])), []).append(span)
        elif e.get("name") == STEP_NAME:
            steps.append(span)
    return TraceIntervals(kernels, steps)


def trace_events(trace_file: str | None) -> dict[Site, list[float]]:
    """Durations (us) of the kernel events of a Chrome trace (``.trace.json.gz``), by (``hlo_module``, ``hlo_op``);
    {} without one (:func:`trace_intervals`' kernel events, each as its length)."""
    return {site: [b - a for a, b in spans] for site, spans in trace_intervals(trace_file).kernels.items()}


@dataclass(frozen=True)
class TracedRun:
    """A traced run (:func:`traced_run`): the trace file, its kernel events' durations (:func:`trace_events`, what
    :func:`kernel_times` reads) and its intervals (:func:`trace_intervals`, for the busy time)."""

    #: the trace file, kept under the caller's ``trace_dir``; None without one (the trace went to a temporary folder)
    trace: str | None
    events: dict[Site, list[float]]
    intervals: TraceIntervals


def traced_run(run: Callable[[], Any], runs: int, trace_dir: Path | None = None, warm_up: bool = True) -> TracedRun:
    """``run()`` once to warm up (unless ``warm_up`` is False), then ``runs`` times under ``jax.profiler.trace``,
    each waited for inside a :data:`STEP_NAME` annotation; the trace is kept under ``trace_dir`` (else it goes to a
    temporary folder)."""
    if warm_up:
        jax.block_until_ready(run())
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(trace_dir) if trace_dir is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        with jax.profiler.trace(str(where)):
            for _ in range(runs):
                with jax.profiler.TraceAnnotation(STEP_NAME):
                    jax.block_until_ready(run())
        trace = _find_trace(where)
        # read twice (durations, then intervals): the durations go through trace_events, the one reader of them
        events = trace_events(trace)
        intervals = trace_intervals(trace)
    return TracedRun(trace if trace_dir is not None else None, events, intervals)


def traced(
    run: Callable[[], Any], runs: int, trace_dir: Path | None = None
) -> tuple[str | None, dict[Site, list[float]]]:
    """The trace file and the kernel events' durations of :func:`traced_run`."""
    r = traced_run(run, runs, trace_dir)
    return r.trace, r.events


@dataclass(frozen=True)
class KernelTimes(Generic[K]):
    """Each kernel row's time per run (us), from a trace of ``runs`` runs (:func:`kernel_times`)."""

    #: row -> its events' total duration per run; None unless every row got its events
    times: dict[K, float] | None
    #: kernel events found for the rows' instructions, and how many there should be (``runs`` x kernels per run)
    seen: int
    expected: int

    def note(self, what: str) -> str:
        """The summary's note on the times; ``what`` says what was traced (e.g. "3 steps")."""
        if self.times is not None:
            return f"kernel times: XLA's trace of {what}"
        return f"no kernel times: {self.seen} of {self.expected} kernel events found in the trace"


def kernel_times(
    counts: Mapping[K, int], sites: Iterable[tuple[Site, K]], events: Mapping[Site, list[float]], runs: int
) -> KernelTimes[K]:
    """The time per run of each kernel row (``counts``: row -> kernels per run) from a trace of ``runs`` runs:
    ``sites`` says which row each traced instruction runs as, ``events`` are the trace's (:func:`trace_events`).
    A row's time is the total duration of its instructions' events divided by ``runs``.

    Unless every row has events and there is exactly one event per kernel per run, no row gets a time
    (``times`` None): a partial table would misstate the split between GEMMs and the rest.
    """
    times: dict[K, float] = {}
    seen = 0
    for site, key in sites:
        durations = events.get(site, [])
        seen += len(durations)
        if durations:
            times[key] = times.get(key, 0.0) + sum(durations) / runs
    expected = runs * sum(counts.values())
    timed = set(times) == set(counts) and seen == expected
    return KernelTimes(times if timed else None, seen, expected)


def traced_kernel_time(
    kernels: list[dict[str, Any]], sites: Iterable[Site], run: TracedRun, runs: int
) -> tuple[dict[str, Any] | None, str]:
    """The summary's ``kernel_time`` of ``kernels`` (the timed rows, ``time_us`` None where untimed) from a traced
    run of ``runs`` steps: the union of the events of the table's instructions (``sites``) per step, and the mean
    :data:`STEP_NAME` range as the profiled step (None unless there is one per step), with a note for the summary
    ("" when there is nothing to say). None when a row has no time (``compare.kernels.summary.kernel_time_entry``):
    the note of :meth:`KernelTimes.note` already says why."""
    spans = [span for site in sites for span in run.intervals.kernels.get(site, [])]
    steps = run.intervals.steps
    step_us = sum(b - a for a, b in steps) / runs if len(steps) == runs else None
    kt = ks.kernel_time_entry(kernels, spans, runs, step_us, KERNEL_TIME_SOURCE)
    if kt is not None and step_us is None:
        return kt, f"no profiled step time: {len(steps)} '{STEP_NAME}' ranges in the trace for {runs} steps"
    return kt, ""


def profile_jit(
    jitted: Callable[..., Any],
    args: tuple[Any, ...],
    step: Callable[[], Any],
    trace_dir: Path | None = None,
    timed: bool = True,
) -> dict[str, Any]:
    """The kernel summary of ``jitted(*args)`` (counts and ``time_us`` per call), from its optimized HLO and a trace.

    ``jitted`` is a ``jax.jit`` function and ``args`` the arguments its step passes (pytrees of arrays); it is
    lowered and compiled here (``jitted.lower(*args).compile()``) for its HLO. ``step`` (which calls ``jitted`` on
    ``args``) runs once to warm up, then :data:`TRACED_STEPS` times under ``jax.profiler.trace`` (:func:`traced`);
    each kernel's ``time_us`` is its events' total duration per step, as ``torch.profiler``'s is (on CPU, XLA may
    run independent kernels at once, so the times can add up to more than the step's wall time). With
    ``trace_dir`` the trace is kept there (``"trace"``). ``"xla_cost"`` holds XLA's flops / bytes accessed
    estimate for one call. ``"kernel_time"``: the kernels' events merged per step, beside the profiled step's wall
    time (module docstring); None unless every kernel was timed. ``timed=False`` (an interpreted, parity-only step
    that costs seconds: Pallas's ``interpret=True``) traces one step and no warm-up: its counts are the compiled
    program's, and its times are the interpreter's, not a kernel's.
    """
    compiled = jitted.lower(*args).compile()  # type: ignore[attr-defined]  # a jax.jit-wrapped callable
    module = parse_hlo(compiled.as_text())
    table = hlo_kernel_table(module)
    steps = TRACED_STEPS if timed else 1
    run = traced_run(step, steps, trace_dir, warm_up=timed)
    sites = [((module.name, name), i) for name, i in table.sites.items()]
    timing = kernel_times({i: k["count"] for i, k in enumerate(table.kernels)}, sites, run.events, steps)
    kernels = [{**k, "time_us": None if timing.times is None else timing.times[i]} for i, k in enumerate(table.kernels)]
    kernel_time, kt_note = traced_kernel_time(kernels, (site for site, _ in sites), run, steps)
    notes = [timing.note(f"{steps} step{'s' if steps > 1 else ''}")]
    if kt_note:
        notes.append(kt_note)
    if table.fusions:
        notes.append("XLA fusion kinds: " + ", ".join(f"{k} x{n}" for k, n in table.fusions.items()))
    s = ks.summary(
        "xla-hlo",
        jax.default_backend(),
        kernels,
        table.metadata_ops,
        trace=run.trace,
        notes="; ".join(notes),
        kernel_time=kernel_time,
    )
    s["xla_cost"] = xla_cost(compiled)
    return s
