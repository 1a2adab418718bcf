"""Run backends on cases: parity against the golden data, then timing through the shared timer.

Every failure is contained to its (backend, case, mode): an exception becomes an ``error`` result with its
message, and the other backends' results are still produced. A case the gate cannot judge (its plain computation
overflows the dtype, or its reference does) makes every cell of that case an ``error`` naming the tensor.

One case (:class:`Groups`, :func:`run`'s in-process executor): its fresh inputs are drawn from a seed made at run
time (``compare.gate.fresh``); for each mode, every backend is prepared and its first calls judged; the timed ones
are then timed together, interleaved (``compare.timing.timer.measure_interleaved``: load drift hits them alike,
and the comparisons are paired by round), every call on inputs the harness made (``compare.run.pipeline.Feed``);
each is profiled when asked, and released. Only when every step of the case and mode has returned is the fresh
draw's reference computed (once per case; no step is ever given it) and the kept outputs judged, each cell stored
(``compare.run.store``) and said as soon as its verdict is made. A timing that implies more FLOP/s than
``compare.run.cell.IMPLAUSIBLE_FACTOR`` x the matmul ceiling measured in the same run makes the result
``implausible``.

Each stage of a cell is ``compare.run.pipeline``'s, the same code the tensor-parallel worker
(``compare.run.tp_worker``) runs; this module's own are the order across a case's backends and modes, the
interleaved timing, the budget's cuts and the profile's trace folder.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import math
import os
import traceback
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare.backends.registry import FRAMEWORK_PACKAGES, BackendSpec, Prepared, probe
from compare.formats.codec import FieldError, from_json, to_json
from compare.gate import fresh, resolution
from compare.gate.parity import UnusableCase
from compare.gate.resolution import ResolutionRow
from compare.kernels.summary import Kernels
from compare.problem import datacache
from compare.problem.cases import Case, FileChanged, check_name, is_moe
from compare.problem.golden import compute_of, golden_for, has_gelu, module_code, prefetch_reference
from compare.results import environment
from compare.results.document import Config, Result, Results
from compare.results.memory import Memory
from compare.run import budget, parity_cache, pipeline, stop
from compare.run.budget import Budget, budget_phase
from compare.run.cell import MODE_TENSORS, golden_stats, plain_reference
from compare.run.conductor import Conductor, Executor, Finished
from compare.run.grid import Cell as GridCell
from compare.run.options import RunOptions
from compare.run.progress import Display, run_stages
from compare.run.store import Store
from compare.run.tp_launch import Job, run_job
from compare.run.tp_worker import Cell
from compare.timing import llc, timer
from compare.timing.timer import Timing, TimingConfig

#: The longest reason an error row gets (the traceback's tail is kept beside it): one message ran to 5,076 characters
#: on a progress line.
REASON_CHARS = 400


def _summarise_error(exc: BaseException) -> tuple[str, str]:
    """An error's reason, on one line of at most :data:`REASON_CHARS` characters, and its traceback's tail. A
    ``SystemExit`` or ``KeyboardInterrupt`` the backend's code raised itself is named as such (``stop.CODE_ERRORS``)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        code = exc.args[0] if exc.args else ""
        text = f"its code raised {type(exc).__name__}({code}) itself (a sys.exit or an interrupt of its own)"
    if len(text) > REASON_CHARS:
        text = f"{text[: REASON_CHARS - 30]}... ({len(text)} characters)"
    return text, tb


@dataclass
class _Cell:
    """One (backend, case, mode) on its way through the pipeline (``compare.run.pipeline``): started, timed with its
    group, finished, settled; ``done`` once it is a result. A single-device step has one device copy."""

    spec: BackendSpec
    case: Case
    mode: str
    done: Result | None = None
    prepared: Prepared | None = None
    first_s: float = math.nan
    first: pipeline.Judged = field(default_factory=list)
    #: the seconds of the second call on the golden inputs (``pipeline.first_calls``), the budget's first read
    repeat_s: float = math.nan
    #: the harness's inputs of every later call, and the outputs it kept of them once the step is released
    feed: pipeline.Feed | None = None
    calls: list[pipeline.Call] = field(default_factory=list)
    made: int = 0
    #: the every-call check on the harness's inputs (``pipeline.SpotTally.result``), judged with ``calls``
    spot: tuple[int, list[str]] = (0, [])
    #: the harness's sync of the step (``pipeline.harness_sync``), set when the cell starts
    sync: Callable[[Any], None] = field(default=lambda _outputs: None)
    timing: Timing | None = None
    cold: Timing | None = None
    kernels: Kernels | None = None
    #: what one more step held in memory (``pipeline.memory``), None when not asked for
    memory: Memory | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    by_device: bool = False
    #: an interpreted (parity-only) backend's cell: its verdict is kept in ``compare.run.parity_cache``
    interpreted: bool = False
    #: what the result keeps of its Prepared once the step is released
    kept: pipeline.Kept = field(default_factory=pipeline.Kept)
    #: the budget left this step untimed beyond its first calls (too slow for its group's part), with its seconds
    #: a step: its profile and memory record, which run it again several times, are left out too
    untimed_s: float | None = None

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.case.name} {self.mode}"

    def fail(self, exc: BaseException) -> None:
        """A backend's exception: the cell is an ``error`` result (its own failure, never the run's)."""
        reason, tb = _summarise_error(exc)
        self.done = Result.for_case(
            self.spec.name, self.case, self.mode, "error", reason=reason, extras={"traceback": tb}
        )
        self.prepared = None


def _start(
    c: _Cell,
    plain: dict[str, np.ndarray],
    precision: dict[str, Any],
    draw: dict[str, np.ndarray],
    prepare: Callable[[], Prepared] | None = None,
    options: RunOptions | None = None,
) -> None:
    """Stages 1 to 3 of ``compare.run.pipeline`` (skip, refuse a step without ``bind``, its first calls and its feed
    of the case's fresh ``draw``). With ``options.reuse_parity`` an interpreted backend's cell (``c.interpreted``) is
    first looked up in ``compare.run.parity_cache``; with ``options.memory`` a cached cell without a memory record is
    run again; ``options.cuda_graphs`` replays a torch step from a CUDA graph (:func:`_graphed`)."""
    spec, case, mode = c.spec, c.case, c.mode
    try:
        c.done = pipeline.skipped(spec, case, mode)
        if c.done is not None:
            return
        c.interpreted = not spec.availability().timed
        if options is not None and options.reuse_parity and c.interpreted and prepare is None:
            c.done = parity_cache.lookup(spec, case, mode)
            if c.done is not None and options.memory and c.done.memory is None:
                c.done = None  # a verdict cached without its memory: run it, measuring both
            if c.done is not None:
                return
        prepared = prepare() if prepare else spec.load().prepare(golden_for(case).problem, mode)
        precision.update(prepared.precision)
        c.done = pipeline.no_fresh(spec, case, mode, prepared)
        if c.done is not None:
            return
        c.prepared, c.sync = prepared, pipeline.harness_sync(spec, prepared)
        c.first_s, c.repeat_s, c.first, c.extras["deterministic"], c.feed = pipeline.first_calls(
            prepared, c.sync, spec, case, mode, plain, draw
        )
        if options is not None and options.cuda_graphs and prepared.timed:
            c.extras["cuda_graph"] = _graphed(c, prepared)
    except stop.CODE_ERRORS as exc:  # a backend's failure is a result, not the end of the run
        stop.reraise_stop(exc)
        c.fail(exc)


def _graphed(c: _Cell, prepared: Prepared) -> str:
    """``--cuda-graphs``: a torch step on a CUDA device captured in a CUDA graph (``torch_impl.cuda_graphs``, the
    ``cuda-graphs`` probe); from then on the cell times, checks and profiles the graph's replay. Returns what
    happened, for the row: captured, or why not (no CUDA device, a step that cannot be captured). JAX steps: XLA
    decides (its command buffers, ``--xla_gpu_enable_command_buffer`` in ``XLA_FLAGS``), said as such."""
    if c.spec.framework == "jax":
        flags = os.environ.get("XLA_FLAGS", "")
        return "XLA's own choice: command buffers per XLA's defaults" + (f" and XLA_FLAGS={flags}" if flags else "")
    if c.spec.framework != "torch":
        return f"not captured: CUDA graphs are for torch steps, not {c.spec.framework}"
    if not prepared.device.startswith("cuda"):
        return f"not captured: no CUDA device (the step runs on {prepared.device})"
    capture = probe("cuda-graphs").capture
    got = capture(prepared.step)
    if not hasattr(got, "replay"):
        return "not captured: " + got.reason
    prepared.step = got.replay
    if c.mode == "bwd":  # a slot's forward is built anew at each bind: a graph would replay the old one's backward
        return "captured: " + got.note + "; calls on the harness's inputs (bwd: a new forward each) run uncaptured"
    bind, graphs = prepared.bind, {}
    assert bind is not None

    def graphed(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
        """The slot's step captured once: the runner writes the slot's buffers in place, so its replay runs on the
        new values (the harness refills a replayed graph's inputs as every other step's)."""
        step = bind(inputs, slot)
        if slot not in graphs:
            graphs[slot] = capture(step)
        return getattr(graphs[slot], "replay", step)

    prepared.bind = graphed
    return "captured: " + got.note


@dataclass
class _Timer:
    """How a run times its groups: the timer's settings, the last-level cache mode and its flush (None: warm only),
    the budget (None: none) and its groups left, and a factory of device watches (None: none)."""

    cfg: TimingConfig
    cache_mode: str = "warm"
    flush: llc.Flush | None = None
    #: the flush's median seconds (``llc.time_flush``, measured once per run)
    flush_s: float = 0.0
    budget: Budget | None = None
    groups_left: int = 1
    watch: Callable[[], timer.Watch | None] | None = None
    #: the run's single-device cells, among which the budget's ``profile`` share is parted
    cells: int = 1

    @property
    def warm(self) -> bool:
        return self.cache_mode in ("warm", "both")

    @property
    def cold(self) -> bool:
        return self.cache_mode in ("cold", "both") and self.flush is not None


def _budgeted(timed: Sequence[_Cell], how: _Timer, label: str) -> tuple[TimingConfig, float, list[_Cell], list[_Cell]]:
    """The group's timer settings under the budget, the cold samples' budget per entrant, the cells it times, and
    those it times cold (``compare.run.budget.timing_plan``, every cut said to the budget; a step's time is read from
    one or two more calls, :func:`_steady_s`). Without a budget: the run's settings, all cells, and all of them cold
    when the cache mode asks for it."""
    cfg, cells = how.cfg, list(timed)
    if how.budget is None:
        return cfg, cfg.budget_s / 2, cells, list(cells) if how.cold else []
    part = how.budget.part("timing", how.groups_left)
    step_s: dict[int, float] = {}
    for c in cells:
        try:
            step_s[id(c)] = _steady_s(c, part / len(cells) / budget.FLOOR_CALLS)
        except stop.CODE_ERRORS as exc:  # this step's failure, recorded as its result
            stop.reraise_stop(exc)
            c.fail(exc)
    cells = [c for c in cells if c.done is None]
    steps = [budget.Step(c.label, c.spec.name, step_s[id(c)], c.spec.core) for c in cells]
    flush_s = how.flush_s if how.cold else None
    new, cold_s, kept, cold = budget.timing_plan(how.budget, part, cfg, label, steps, how.warm, flush_s)
    for i, c in enumerate(cells):
        c.untimed_s = None if i in kept else step_s[id(c)]
        if c.untimed_s is not None:  # why its row reads "not timed" (its note says what the backend is, not this)
            c.extras["untimed"] = (
                f"cut by the time budget (a twin, {c.untimed_s:.3g} s a step; the core comparison first)"
            )
    return new, cold_s, [cells[i] for i in kept], [cells[i] for i in cold]


#: a step read slower than its even share by at most this factor is read once more (see :func:`_steady_s`)
RECHECK = 4.0


def _steady_s(c: _Cell, fair_s: float) -> float:
    """A step's steady seconds for the budget, from its second call (``_Cell.repeat_s``: the first call's time
    includes its compile; this one warmed up, too). Where that call is slower than ``fair_s`` (the step's even
    share of its group's part, per floor call) by at most :data:`RECHECK` times, one call more, and the faster of
    the two: the call right after a compile is often slow (a 2-core AVX2 EPYC read 0.333 s for a torch.compile
    step of 0.11 s, 0.418 s for an XLA one of 0.05 s), and a single read cut steps the budget had room for. A step
    slower still is cut on one read."""
    assert c.prepared is not None
    t = c.repeat_s
    if fair_s < t <= RECHECK * fair_s:
        t = min(t, timer.first_call(c.prepared.step, c.sync)[0])
    return t


def _watched(
    cells: Sequence[_Cell],
    how: _Timer,
    measure: Callable[[list[timer.Entrant], timer.Watch | None], list[Any]],
    kept: str,
    telemetry: str,
) -> None:
    """``measure`` (a timer function) on the cells' steps under a fresh device watch (``how.watch``; none without
    one): each cell's timing goes to its attribute ``kept`` (``timing`` or ``cold``) and the watch's telemetry
    record, where there is one, to its ``extras[telemetry]``; an exception in the outcomes fails its cell. The
    watch's sampling thread ends with the timing, whatever ended it."""
    watch = how.watch() if how.watch is not None else None
    entrants = [timer.Entrant(c.prepared.step, c.sync, c.first_s, c.feed) for c in cells if c.prepared]
    try:
        outcomes = measure(entrants, watch)
    finally:
        seen = watch.stop() if watch is not None else []
    for c, got, tele in zip(cells, outcomes, seen or [None] * len(cells), strict=True):
        if isinstance(got, BaseException):
            stop.reraise_stop(got)
            c.fail(got)
            continue
        setattr(c, kept, got)
        if tele is not None:
            c.extras[telemetry] = tele


def _time(cells: Sequence[_Cell], how: _Timer) -> None:
    """Time the started, timed cells of one case and mode together (``compare.timing.timer.measure_interleaved``), each
    call on its feed's inputs (the feed keeps the outputs it judges later); then, when the cache mode asks for it,
    their cold samples (``compare.timing.timer.measure_cold``), after warm-up, in rounds of single flushed calls."""
    timed = [c for c in cells if c.done is None and c.prepared is not None and c.prepared.timed]
    if not timed:
        return
    c0 = timed[0]
    label = f"{c0.case.name} {c0.mode}"
    cfg, cold_budget, timed, cold = _budgeted(timed, how, label)
    group = timer.new_group_id(f"{c0.case.name}/{c0.mode}")
    seed = zlib.crc32(group.encode())
    if how.warm and timed:

        def warm(entrants: list[timer.Entrant], watch: timer.Watch | None) -> list[Any]:
            return list(timer.measure_interleaved(entrants, group=group, seed=seed, watch=watch, **asdict(cfg)))

        _watched(timed, how, warm, "timing", "telemetry")
    cold = [c for c in cold if c.done is None and c.prepared is not None]
    if cold and how.flush is not None:
        if not how.warm:  # warm-up before the first cold sample: the first calls compiled, now the caches are hot
            for c in cold:
                assert c.prepared is not None
                timer.first_call(c.prepared.step, c.sync)
        flush = how.flush

        def cold_rounds(entrants: list[timer.Entrant], watch: timer.Watch | None) -> list[Any]:
            return list(
                timer.measure_cold(
                    entrants,
                    flush,
                    group=group + "/cold",
                    min_samples=budget.MIN_SAMPLES,
                    budget_s=cold_budget,
                    seed=seed + 1,
                    watch=watch,
                )
            )

        _watched(cold, how, cold_rounds, "cold", "telemetry_cold")
        _release(flush)


def _release(flush: llc.Flush) -> None:
    """A host flush's buffer unmapped between timings (``llc.HostFlush.release``; a device flush keeps its own)."""
    release = getattr(flush, "release", None)
    if release is not None:
        release()


def _quick(c: _Cell, p: Prepared, part_s: float, cut: Callable[[str], None]) -> Prepared:
    """``p``, or ``p`` profiling through its ``quick_profile`` when a full profile (:data:`budget.PROFILE_CALLS` calls
    at the step's warm median, else its first call) would pass ``part_s``; the cut is said."""
    step_s = c.timing.median_s if c.timing is not None else c.first_s
    if p.quick_profile is None or not budget.PROFILE_CALLS * step_s > part_s:
        return p
    cut(
        f"{c.spec.name} {c.case.name} {c.mode}: profiled on one step after one warm-up call instead of "
        f"{budget.PROFILE_CALLS} calls (its step takes {step_s:.3g} s; its part of the profile share: {part_s:.3g} s)"
    )
    return replace(p, profile=p.quick_profile)


def _finish_steps(
    c: _Cell, profile: bool, trace_dir: Path | None, memory: bool = False, how: _Timer | None = None
) -> None:
    """The profile and the memory record (when asked); one call on the harness's inputs for a step that made none
    (untimed: ``pipeline.Feed.judged``, the path the timed calls took); the outputs its feed kept, read; then the step
    is released. Under ``how``'s budget a slow step's profile may be its quick one (:func:`_quick`)."""
    p = c.prepared
    if c.done is not None or p is None:
        return
    c.kept, c.by_device = pipeline.Kept.of(p), pipeline.named(p)
    if c.untimed_s is not None and (profile or memory) and how is not None and how.budget is not None:
        # a step the budget could not time is not run again for extras: a profile runs it at least twice and a
        # memory record about three times (on an emulating CPU: seconds per bf16 step); its parity stands
        why = f"not timed beyond its first calls ({c.untimed_s:.3g} s a step)"
        how.budget.cut(
            f"{c.label}: {' and '.join(('not profiled',) * profile + ('memory not recorded',) * memory)}, "
            f"since it was {why}"
        )
        profile = False
        if memory:
            c.memory = Memory.not_measured(f"left out by the run's time budget: the step was {why}")
            memory = False
    with budget_phase(how.budget if how is not None else None, "profile"):  # the fresh-input step after it is parity's
        if profile:
            trace = trace_dir / f"{c.spec.name}-{c.case.name}-{c.mode}" if trace_dir else None
            if how is not None and how.budget is not None:
                p = _quick(c, p, how.budget.part("profile", of=how.cells), how.budget.cut)
            try:
                c.kernels = pipeline.profile(p, trace, trace_dir.parent if trace_dir is not None else None)
            except stop.CODE_ERRORS as exc:  # the profile is extra information: keep the parity and timing results
                stop.reraise_stop(exc)
                c.extras["profile_error"] = _summarise_error(exc)[0]
        if memory:
            try:
                c.memory = pipeline.memory(p)
            except (
                stop.CODE_ERRORS
            ) as exc:  # recorded as the reason both figures are absent; the parity and timing stand
                stop.reraise_stop(exc)
                c.memory = Memory.not_measured(f"the measurement raised {_summarise_error(exc)[0]}")
    try:
        assert c.feed is not None
        c.calls, c.made = c.feed.judged(c.sync), c.feed.calls
        c.spot = c.feed.tally.result()
    except stop.CODE_ERRORS as exc:
        stop.reraise_stop(exc)
        c.fail(exc)
    c.prepared, c.feed = None, None  # release the step (its weights, compiled code) before the next backend's


def _verdict(c: _Cell, seed: int, reference: fresh.FreshReference | None) -> Result:
    """The cell's result (``pipeline.result``): the first call's verdict and those of the calls its feed kept on its
    one copy (``pipeline.verdicts``), its timing and profile."""
    if c.done is not None:
        return c.done
    assert reference is not None
    copies = pipeline.verdicts(c.first, c.calls, c.made, reference, c.spec, c.case, c.mode, seed, c.by_device, c.spot)
    c.calls = []  # judged: their outputs are not held while the next cell's are
    found, record = pipeline.findings(copies, c.by_device), pipeline.parity_record(copies)
    return pipeline.result(
        c.spec, c.case, c.mode, found, c.kept, record, c.timing, c.kernels, c.extras, cold=c.cold, memory=c.memory
    )


def _settle(
    case: Case,
    cells: Sequence[_Cell],
    fresh_ref: pipeline.CaseReference,
    judging: Callable[[_Cell | None], None] | None = None,
    each: Callable[[int, Result], None] | None = None,
) -> list[Result]:
    """Every cell's result, once every step of ``cells`` has returned: the fresh draw's reference is asked for only
    now (made once per case). ``judging`` is told before the reference is made (None) and before each cell's verdict,
    ``each`` of each result (its index in ``cells``) as soon as it is made."""
    reference = None
    if any(c.done is None for c in cells):
        if judging is not None and not fresh_ref.made:
            judging(None)
        try:
            reference = fresh_ref.get()
        except UnusableCase as exc:  # a draw the dtype cannot represent: no cell can be judged on it
            for c in cells:
                if c.done is None:
                    c.done = Result.for_case(c.spec.name, case, c.mode, "error", reason=f"fresh inputs: {exc}")
    results = []
    for i, c in enumerate(cells):
        if judging is not None:
            judging(c)
        try:
            results.append(_verdict(c, fresh_ref.seed, reference))
        except stop.CODE_ERRORS as exc:
            stop.reraise_stop(exc)
            c.fail(exc)
            assert c.done is not None
            results.append(c.done)
        if each is not None:
            each(i, results[-1])
    return results


def run_one(
    spec: BackendSpec,
    case: Case,
    mode: str,
    plain: dict[str, np.ndarray],
    cfg: TimingConfig,
    precision: dict[str, Any],
    prepare: Callable[[], Prepared] | None = None,
    time_it: bool = True,
    profile: bool = False,
    trace_dir: Path | None = None,
    memory: bool = False,
    reference: pipeline.CaseReference | None = None,
) -> Result:
    """Parity, timing (alone: a group of one) and the fresh-input check of one backend on one case and mode; never
    raises for a backend's own failure. ``memory`` adds the step's memory record (``pipeline.memory``);
    ``reference``: the case's fresh draw, shared with other calls (its ``backward`` must cover ``mode``; not given:
    a new draw). ``prepare`` overrides the backend's own preparation (tests' negative controls); ``time_it=False``
    checks parity only. ``profile`` adds the kernel summary of one more step, with a trace under ``trace_dir`` when
    given; a profiler failure is recorded in ``extras`` and does not fail the result."""
    c = _Cell(spec, case, mode)
    if reference is None:
        reference = pipeline.CaseReference(case, fresh.new_seed(), mode != "fwd")
    _start(c, plain, precision, reference.inputs, prepare)
    if time_it:
        _time([c], _Timer(cfg))
    _finish_steps(c, profile, trace_dir, memory)
    return _settle(case, [c], reference)[0]


class Staged:
    """The backends of one case and mode staged in this process as a run stages them (:class:`Groups`), for a caller
    that times them itself: the A/B worker (``compare.run.ab_worker``), whose coordinator decides the rounds. Made:
    every cell started (:func:`_start`: its first calls judged, its feed of ``reference``'s fresh draw); then
    :meth:`entrant` is a timed cell's step (None: it was not started, or is not timed), :meth:`fail` records its
    failure; :meth:`settle` finishes every cell (profile, memory, its calls on the fresh draw judged) and returns its
    result, untimed (the caller adds the timing it assembled)."""

    def __init__(
        self, specs: Sequence[BackendSpec], case: Case, mode: str, plain: Any, reference: pipeline.CaseReference
    ) -> None:
        self.case, self.reference, self.precision = case, reference, dict[str, Any]()
        self.cells = [_Cell(s, case, mode) for s in specs]
        for c in self.cells:
            _start(c, plain, self.precision, reference.inputs)

    def entrant(self, i: int) -> timer.Entrant | None:
        c = self.cells[i]
        if c.done is not None or c.prepared is None or not c.prepared.timed:
            return None
        return timer.Entrant(c.prepared.step, c.sync, c.first_s, c.feed)

    def fail(self, i: int, exc: BaseException) -> None:
        self.cells[i].fail(exc)

    def settle(self, profile: bool = False, memory: bool = False) -> list[Result]:
        for c in self.cells:
            _finish_steps(c, profile, None, memory)
        return _settle(self.case, self.cells, self.reference)


class Groups:
    """The run's in-process executor (``compare.run.conductor.Executor``), case by case (the plain reference, the
    resolution rows, a fresh draw), mode by mode: every backend started (:func:`_start`), timed together
    (:func:`_time`), finished (:func:`_finish_steps`), settled together (:func:`_settle`), each cell reported as its
    verdict is made; a single-device backend at a world size above 1 ``skipped``. Each stage is told to the progress
    display (``compare.run.progress.run_stages``), planned before the first."""

    def __init__(self, options: RunOptions, run_timer: _Timer, progress: Display | None, store: Store | None) -> None:
        self.options, self.timer, self.progress, self.store = options, run_timer, progress, store
        self.precision: dict[str, Any] = {}
        self.resolution: list[ResolutionRow] = []

    def run(self, todo: list[GridCell], to: Conductor) -> None:
        options, progress = self.options, self.progress
        specs, interpreted = to.specs, set[tuple[str, str]]()  # (backend, mode): this case's interpreted verdicts

        def report(cell: GridCell, res: Result) -> None:
            res = replace(res, world_size=cell.world_size)
            if (cell.backend, cell.mode) in interpreted:
                parity_cache.save(specs[cell.backend], cell.case, cell.mode, res)
            to.done(Finished(cell, res, {"precision": self.precision}, 0.0))

        if progress:  # the stages of the cells run here (a single-device backend at a world size above 1 is not)
            here = [(c.case, c.mode, c.backend) for c in todo if c.world_size == 1 or specs[c.backend].runtime]
            how = {"profile": options.profile, "memory": options.memory, "cold": self.timer.cold}
            stages = run_stages(here, timing_s=self.timer.cfg.budget_s, **how)
            progress.expect(stages, len(here))
        for case, in_case in itertools.groupby(todo, key=lambda c: c.case):
            stop.check()
            of_case = list(in_case)
            modes = list(dict.fromkeys(c.mode for c in of_case))
            backward = any(m != "fwd" for m in modes)
            interpreted.clear()
            why = ""
            try:
                if progress:
                    progress.stage("golden", case.name)
                _golden(case, backward)
                if progress:
                    progress.stage("plain", case.name)
                plain = plain_reference(case, backward=backward)
                golden_stats(case, plain, [k for k in plain if any(MODE_TENSORS[m](k) for m in modes)])
                if progress:
                    progress.stage("resolution", case.name)
                rows = case_resolution(case, plain, modes)
                plain.unrounded = None  # the resolution rows' alone: not held through the case's cells
                self.resolution += rows
                if self.store is not None:
                    self.store.resolution(rows)
                why = "fresh inputs: "  # drawn now: no backend of this run can have seen these inputs
                reference = pipeline.CaseReference(case, fresh.new_seed(), backward)
            except (UnusableCase, FileChanged) as exc:  # nothing can be judged on this case: say so in every cell
                for cell in of_case:
                    to.error(cell, f"{why}{exc}")
                continue
            for mode, in_mode in itertools.groupby(of_case, key=lambda c: c.mode):
                group: list[tuple[GridCell, _Cell]] = []
                for cell in in_mode:
                    spec = specs[cell.backend]
                    if cell.world_size > 1 and not spec.runtime:
                        why = f"a single-device backend: world size {cell.world_size} is for tensor-parallel backends"
                        report(cell, Result.for_case(spec.name, case, mode, "skipped", reason=why))
                        continue
                    stop.check()
                    c = _Cell(spec, case, mode)
                    if progress:
                        progress.stage("first", case.name, mode, spec.name)
                    _start(c, plain, self.precision, reference.inputs, options=options)
                    if c.interpreted and c.done is None:
                        interpreted.add((spec.name, mode))
                    group.append((cell, c))
                stop.check()
                cells = [c for _, c in group]
                if progress and group:
                    progress.stage("timing", case.name, mode)
                with budget_phase(self.timer.budget, "timing"):
                    _time(cells, self.timer)
                self.timer.groups_left = max(1, self.timer.groups_left - 1)
                for c in cells:
                    if progress:
                        progress.stage("finish", case.name, mode, c.spec.name)
                    _finish_steps(c, options.profile, options.trace_dir, options.memory, self.timer)
                # each cell reported (stored, said) as soon as its verdict is made
                hook = functools.partial(_judging, progress, case.name, mode) if progress else None
                _settle(case, cells, reference, hook, functools.partial(_each, report, [cell for cell, _ in group]))


def _golden(case: Case, backward: bool) -> None:
    """The case's golden reference, made (or read) now: what the plain computation reads first."""
    g = golden_for(case)
    prefetch_reference(g, backward)
    if "y" in g.ref:
        _ = g.ref["y"]  # a forward-only run's reference: its output alone


def _each(report: Callable[[GridCell, Result], None], cells: Sequence[GridCell], i: int, res: Result) -> None:
    report(cells[i], res)


def _judging(progress: Display, case: str, mode: str, c: _Cell | None) -> None:
    """The stage :func:`_settle` is at: the reference of the fresh inputs (``c`` None), or a cell's verdict."""
    if c is None:
        progress.stage("reference", case)
    else:
        progress.stage("judging", case, mode, c.spec.name)


class TpGroups:
    """The run's tensor-parallel executor: one worker group (``compare.run.tp_launch``) per runtime, launch
    (``options.tp_launch`` where the backend has it, else its first) and world size, logs under ``options.tp_logs``;
    each cell reported as the group's process 0 reports it."""

    def __init__(self, options: RunOptions, progress: Display | None) -> None:
        self.options, self.progress = options, progress

    def run(self, todo: list[GridCell], to: Conductor) -> None:
        jobs: dict[tuple[str, str, int], list[GridCell]] = {}
        for cell in todo:
            spec = to.specs[cell.backend]
            how = self.options.tp_launch if self.options.tp_launch in spec.launches else spec.launches[0]
            jobs.setdefault((spec.runtime, how, cell.world_size), []).append(cell)
        index = itertools.count()  # a cell's index, unique in the run
        for (runtime, how, ws), cells in jobs.items():
            stop.check()
            tp_cells = tuple(Cell(next(index), c.backend, c.case, c.mode) for c in cells)
            job_specs = tuple(dict.fromkeys(to.specs[c.backend] for c in cells))
            job = Job(runtime, how, ws, tp_cells, job_specs, to.cfg, profile=self.options.profile)
            if self.progress:
                self.progress.message(
                    f"starting a tensor-parallel group: {runtime}, world size {ws}, {job.nproc} process(es) x "
                    f"{job.threads} thread(s), {len(cells)} cells",
                    important=True,
                )
            of = {(c.backend, c.case.name, c.mode): c for c in cells}

            def report(doc: dict[str, Any], ws: int = ws, of: dict[tuple[str, str, str], GridCell] = of) -> None:
                res = replace(from_json(Result, doc), world_size=ws)
                to.done(Finished(of[res.backend, res.case, res.mode], res, {}, 0.0))

            run_job(job, root=self.options.tp_logs, on_result=report)


def run(
    cases: Iterable[Case],
    specs: Iterable[BackendSpec],
    modes: Iterable[str],
    options: RunOptions | None = None,
    *,
    progress: Display | None = None,
    store: Store | None = None,
    budget: Budget | None = None,
    watch: Callable[[], timer.Watch | None] | None = None,
) -> Results:
    """Run every (case, backend, mode, world size) through the conductor (``compare.run.conductor``): the
    single-device cells in process (:class:`Groups`), the tensor-parallel ones in worker groups (:class:`TpGroups`);
    return the results document, ``interrupted`` when a stop ended it (the caller writes it and says so).

    ``options`` (None: the defaults) says how; ``progress`` (already entered) is told as each cell starts and ends,
    ``store`` gets every finished cell the moment its verdict is known; ``budget`` is the time the run keeps, its
    cuts in the document; ``watch`` makes a device watch per timed group. Cold samples (``options.cache_mode``)
    follow a flush of the last-level cache (:func:`cold_flush`)."""
    options = options or RunOptions()
    cfg, cache_mode = options.cfg, options.cache_mode
    cases, specs, modes = list(cases), list(specs), list(modes)
    spec_of = {sp.name: sp for sp in specs}
    check_name("cache mode", cache_mode, list(llc.CACHE_MODES))
    cold_setup = None
    groups = max(1, len(cases) * len(modes))
    single = sum(1 for sp in specs if not sp.runtime)
    run_timer = _Timer(cfg, cache_mode, budget=budget, groups_left=groups, watch=watch, cells=max(1, groups * single))
    if cache_mode != "warm":
        size, flush = cold_flush(sp.framework for sp in specs)
        run_timer.flush, run_timer.flush_s = flush, llc.time_flush(flush)
        _release(flush)
        cold_setup = llc.ColdSetup(cache_mode, size, flush.bytes, flush.about, run_timer.flush_s)
    todo = [GridCell(s.name, c, m, w) for c in cases for m in modes for s in specs for w in options.world_sizes]

    def tp(c: GridCell) -> bool:
        s = spec_of[c.backend]
        return bool(s.runtime) and c.case.model in s.models and c.mode in s.modes

    here = Groups(options, run_timer, progress, store)
    plan: list[tuple[Executor, list[GridCell]]] = [(here, [c for c in todo if not tp(c)])]
    plan.append((TpGroups(options, progress), [c for c in todo if tp(c)]))
    dtypes = list(dict.fromkeys(c.dtype for c in cases)) if options.ceilings else []
    begin = (lambda ceil: store.ceilings(ceil) if ceil is not None else None) if store is not None else None
    got = Conductor(spec_of, cfg, store, budget=budget, progress=progress).conduct(plan, dtypes, begin)
    return Results(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        config=replace(from_json(Config, options.config), timing=cfg),
        environment=environment.current(here.precision, got.threads),
        results=tuple(got.rechecked()),
        resolution=tuple(here.resolution),
        ceilings=got.ceilings,
        interrupted=got.interrupted,
        budget=budget.record() if budget is not None else None,
        cold=cold_setup,
    )


def cold_flush(frameworks: Iterable[str]) -> tuple[llc.CacheSize | None, llc.Flush]:
    """The last-level cache of the device the timed steps run on and a flush that evicts it: the ``flush`` probe's
    (``compare.backends.registry.PROBES``: a GPU's L2 and a device buffer, when torch sees one), else this CPU's
    (``compare.timing.llc``: the OS's figure, a host buffer). The probe is asked only when one of the run's
    ``frameworks`` can step on a device (``compare.backends.registry.FRAMEWORK_PACKAGES``): a run of framework-free
    backends steps here, and importing torch to learn so would cost it a second and more."""
    if set(frameworks) & set(FRAMEWORK_PACKAGES.values()):
        try:
            device = probe("flush").device_flush()
        except ImportError:  # no torch here: the CPU's caches are the only ones a step can run in
            device = None
        if device is not None:
            return device
    size = llc.cpu_last_level()
    return size, llc.HostFlush(llc.flush_bytes(size))


def case_resolution(case: Case, plain: dict[str, np.ndarray], modes: Iterable[str]) -> list[ResolutionRow]:
    """The gate's resolution (``compare.gate.resolution``) for the tensors the modes check."""
    g = golden_for(case)
    order = ["y", "dx", *(f"d{p}" for p in case.weight_shapes())]
    wanted = [k for k in order if k in g.ref and any(MODE_TENSORS[m](k) for m in modes)]
    s = case.shape
    label = f"{case.model} {s.batch}x{s.seq}x{s.dim}->{s.hidden}"
    # a pure function of the case's golden data and the gate's code (seconds on a large case): cached on disk
    name = datacache.key(
        "resolution",
        {
            "case": to_json(case),
            "tensors": wanted,
            "gate": datacache.source_digest(["compare/gate"]),
            **module_code(case),
        },
    )
    cached = datacache.load_json(name)
    if isinstance(cached, list):
        try:
            return [from_json(ResolutionRow, r) for r in cached]
        except (FieldError, TypeError, ValueError):  # an entry of another layout: a miss, computed again below
            pass
    # a module's and a MoE block's computation are compute_of's (the built-in dense models': reference.compute)
    compute_in = None if case.module is None and not is_moe(case.model) else functools.partial(compute_of, case)
    rows = resolution.resolution_rows(
        case.name, case.model, label, case.dtype, (g.x, g.params, g.dy), g.ref, plain, wanted, compute_in,
        has_gelu(case),
    )  # fmt: skip
    datacache.save_json(name, [to_json(r) for r in rows])
    return rows
