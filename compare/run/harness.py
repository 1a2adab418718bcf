"""Run backends on cases: parity against the golden data, then timing through the shared timer.

Every failure is contained to its (backend, case, mode): an exception becomes an ``error`` result with its
message, and the other backends' results are still produced. A case the gate cannot judge (its plain computation
overflows the dtype, or its reference does) makes every cell of that case an ``error`` naming the tensor.

The pipeline of one case (:func:`run`): for each mode, every backend is prepared and its first call judged; the
timed ones are then timed together, interleaved (``compare.timing.timer.measure_interleaved``: load drift hits them
alike, and the comparisons between them are paired by round); each one's last timed output is judged again (a
replayed stale answer fails); each is profiled when asked and then run once on fresh inputs drawn from a seed made
at run time (``compare.gate.fresh``), and released. Only when every step of the case and mode has returned is the
fresh draw's reference computed (once per case, kept for its later modes; no step is ever given it) and the fresh
outputs judged: a backend that computed its answer from the golden data it could derive from its
:class:`~compare.problem.golden.Problem` fails there. The cells of a case and mode then settle together and are
stored at once (``compare.run.store``). A timing that implies more FLOP/s than
``compare.run.cell.IMPLAUSIBLE_FACTOR`` x the matmul ceiling measured in the same run makes the result ``implausible``.

Each stage of a cell (skip, refuse a step without ``fresh``, first call and its verdict, the last timed call's
verdict, the fresh step, its verdict, the status and the result) is ``compare.run.pipeline``'s, the same code the
tensor-parallel worker (``compare.run.tp_worker``) runs; what is this module's own is the order across a case's
backends and modes, the interleaved timing, the profile's trace folder and the fresh reference made once per case.
"""

from __future__ import annotations

import datetime
import functools
import math
import traceback
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare.backends.registry import BackendSpec, Prepared, probe
from compare.cost.records import Ceilings
from compare.gate import fresh, resolution
from compare.gate.parity import Plain, UnusableCase
from compare.gate.resolution import ResolutionRow
from compare.kernels.summary import Kernels
from compare.problem.cases import Case
from compare.problem.golden import golden_for
from compare.results import environment
from compare.results.document import Config, Result, Results
from compare.run import cell, pipeline, stop
from compare.run.cell import MODE_TENSORS, plain_reference
from compare.run.progress import Display
from compare.run.store import RunStore
from compare.run.tp_launch import Job, run_job
from compare.run.tp_worker import Cell
from compare.timing import timer as timing
from compare.timing.timer import Timing, TimingConfig


def _summarise_error(exc: BaseException) -> tuple[str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return f"{type(exc).__name__}: {exc}".strip(), tb


@dataclass
class _Cell:
    """One (backend, case, mode) on its way through the pipeline (``compare.run.pipeline``): started (prepared, first
    call judged), timed with its group, its last timed output and its fresh-input output judged; ``done`` once it is
    a result. A single-device step has one device copy: each verdict list holds one ``(device, verdict)``."""

    spec: BackendSpec
    case: Case
    mode: str
    done: Result | None = None
    prepared: Prepared | None = None
    first_s: float = math.nan
    first: pipeline.Judged = field(default_factory=list)
    again: pipeline.Judged | None = None
    timing: Timing | None = None
    kernels: Kernels | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    fresh_run: pipeline.FreshRun | None = None
    by_device: bool = False
    #: what the result keeps of its Prepared once the step is released
    kept: pipeline.Kept = field(default_factory=pipeline.Kept)

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

    def who(self) -> str:
        return pipeline.who(self.spec, self.mode)


def _start(
    c: _Cell,
    plain: dict[str, np.ndarray],
    precision: dict[str, Any],
    prepare: Callable[[], Prepared] | None = None,
) -> None:
    """Skip (``pipeline.skipped``), or prepare the step, refuse it without ``fresh`` (``pipeline.no_fresh``), make its
    first call (timed alone: compile + run) and judge it (``pipeline.first_call``)."""
    spec, case, mode = c.spec, c.case, c.mode
    try:
        c.done = pipeline.skipped(spec, case, mode)
        if c.done is not None:
            return
        golden = golden_for(case)
        prepared = prepare() if prepare else spec.load().prepare(golden.problem, mode)
        precision.update(prepared.precision)
        c.done = pipeline.no_fresh(spec, case, mode, prepared)
        if c.done is not None:
            return
        c.prepared = prepared
        c.first_s, c.first = pipeline.first_call(
            prepared, prepared.sync, pipeline.checked(mode, golden.ref), plain, case.dtype, c.who()
        )
    except Exception as exc:  # a backend's failure is a result, not the end of the run
        c.fail(exc)


def _time(cells: Sequence[_Cell], cfg: TimingConfig, plain: dict[str, np.ndarray]) -> None:
    """Time the started, timed cells of one case and mode together (``compare.timing.timer.measure_interleaved``), then
    judge each one's last timed output (a replayed stale answer fails there)."""
    timed = [c for c in cells if c.done is None and c.prepared is not None and c.prepared.timed]
    if not timed:
        return
    c0 = timed[0]
    group = timing.new_group_id(f"{c0.case.name}/{c0.mode}")
    entrants = [timing.Entrant(c.prepared.step, c.prepared.sync, c.first_s) for c in timed if c.prepared is not None]
    outcomes = timing.measure_interleaved(entrants, group=group, seed=zlib.crc32(group.encode()), **cfg.to_dict())
    ref = pipeline.checked(c0.mode, golden_for(c0.case).ref)
    for c, got in zip(timed, outcomes, strict=True):
        if isinstance(got, BaseException):
            c.fail(got)
            continue
        c.timing, last = got
        try:
            assert c.prepared is not None
            c.again = pipeline.judge_copies(c.prepared, last, ref, plain, c.case.dtype, c.who())
        except Exception as exc:
            c.fail(exc)


def _finish_steps(c: _Cell, inputs: dict[str, np.ndarray], profile: bool, trace_dir: Path | None) -> None:
    """The profile (when asked) and the step on fresh inputs (``pipeline.fresh_step``); then the step is released."""
    p = c.prepared
    if c.done is not None or p is None:
        return
    c.kept, c.by_device = pipeline.Kept.of(p), pipeline.named(p)
    if profile:
        trace = trace_dir / f"{c.spec.name}-{c.case.name}-{c.mode}" if trace_dir else None
        try:
            c.kernels = pipeline.profile(p, trace, trace_dir.parent if trace_dir is not None else None)
        except Exception as exc:  # the profile is extra information: keep the parity and timing results
            c.extras["profile_error"] = _summarise_error(exc)[0]
    try:
        c.fresh_run = pipeline.fresh_step(p, p.sync, inputs, c.who())
    except Exception as exc:
        c.fail(exc)
    c.prepared = None  # release the step (its weights, compiled code) before the next backend's


def _verdict(c: _Cell, seed: int, reference: tuple[dict[str, np.ndarray], Plain] | None) -> Result:
    """The cell's result (``pipeline.result``): the first call's, last timed call's and fresh inputs' verdicts of its
    one copy (``pipeline.verdicts``), its timing and profile."""
    if c.done is not None:
        return c.done
    assert c.fresh_run is not None and reference is not None
    checks = pipeline.judge_fresh(c.fresh_run, reference, c.case.dtype, c.mode, seed, c.who(), c.by_device)
    copies = pipeline.verdicts(c.first, c.again, checks)
    record = pipeline.parity_record(copies, pipeline.worst_fresh(checks))
    found = pipeline.findings(copies, c.by_device)
    return pipeline.result(c.spec, c.case, c.mode, found, c.kept, record, c.timing, c.kernels, c.extras)


class _FreshReference:
    """The float64 reference of a case's fresh inputs, made once, the first time a mode's cells settle (after their
    steps have returned: no step is given it, and none of those can have seen it), with the backward when any mode
    of the run needs it; kept for the case's later modes. An input the dtype cannot represent is an
    ``UnusableCase``, raised every time it is asked for."""

    def __init__(self, case: Case, inputs: dict[str, np.ndarray], backward: bool) -> None:
        self.case, self.inputs, self.backward = case, inputs, backward
        self.made = False
        self._value: tuple[dict[str, np.ndarray], Plain] | UnusableCase | None = None

    def get(self) -> tuple[dict[str, np.ndarray], Plain]:
        if not self.made:
            try:
                self._value = fresh.reference(self.case, golden_for(self.case).params, self.inputs, self.backward)
            except UnusableCase as exc:
                self._value = exc
            self.made = True
        if isinstance(self._value, UnusableCase):
            raise self._value
        assert self._value is not None
        return self._value


def _settle(
    case: Case, cells: Sequence[_Cell], seed: int, inputs: dict[str, np.ndarray], fresh_ref: _FreshReference
) -> list[Result]:
    """Every cell's result, once every step of ``cells`` has returned: the fresh draw's reference is asked for only
    now."""
    reference = None
    if any(c.done is None for c in cells):
        try:
            reference = fresh_ref.get()
        except UnusableCase as exc:  # a draw the dtype cannot represent: no cell can be judged on it
            for c in cells:
                if c.done is None:
                    c.done = Result.for_case(c.spec.name, case, c.mode, "error", reason=f"fresh inputs: {exc}")
    results = []
    for c in cells:
        try:
            results.append(_verdict(c, seed, reference))
        except Exception as exc:
            c.fail(exc)
            assert c.done is not None
            results.append(c.done)
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
) -> Result:
    """Parity, timing (alone: a group of one) and the fresh-input check of one backend on one case and mode; never
    raises for a backend's own failure.

    ``prepare`` overrides the backend's own preparation (tests use it for negative controls); ``time_it=False``
    checks parity only. ``profile`` adds the kernel summary of one more step (``compare.kernels.summary``), with a trace
    under ``trace_dir`` when given; a profiler failure is recorded in ``extras`` and does not fail the result.
    """
    c = _Cell(spec, case, mode)
    _start(c, plain, precision, prepare)
    if time_it:
        _time([c], cfg, plain)
    seed = fresh.new_seed()
    inputs = fresh.draw(case, seed, golden_for(case).params)
    _finish_steps(c, inputs, profile, trace_dir)
    return _settle(case, [c], seed, inputs, _FreshReference(case, inputs, mode != "fwd"))[0]


#: The ceiling probes (``compare.backends.registry.PROBES``), each a library's own GEMMs, in the order they are measured
# (XLA's
#: first: torch's OpenMP threads spin for a while after its GEMMs and would slow a probe that follows them); the
#: ceiling is the higher of them, on torch's record where there is one (it holds the 16-bit routes).
CEILING_PROBES: tuple[str, ...] = ("ceilings-xla", "ceilings")


def measure_ceilings(dtypes: Iterable[str], budget_s: float | None = None) -> Ceilings | None:
    """This machine's matmul FLOP/s and copy bandwidth per dtype: every probe of :data:`CEILING_PROBES` whose
    framework imports (XLA's, torch's on the device the torch backends use), per dtype the higher of them
    (``Ceiling.merged``; ``budget_s`` per dtype and probe, None: each probe's default); None where none imports."""
    dtypes = list(dtypes)
    got: dict[str, Ceilings] = {}
    for name in CEILING_PROBES:
        try:
            module = probe(name)
        except ImportError:
            continue
        got[name] = Ceilings.from_dict(module.measure_all(dtypes, budget_s))
    if not got:
        return None
    base = got.pop("ceilings", None) or got.pop(next(iter(got)))
    for other in got.values():
        base = base.peak(other)
    return base


def run(
    cases: Iterable[Case],
    specs: Iterable[BackendSpec],
    modes: Iterable[str],
    cfg: TimingConfig = TimingConfig(),
    config: dict[str, Any] | None = None,
    progress: Display | None = None,
    profile: bool = False,
    trace_dir: Path | None = None,
    ceilings: bool = False,
    world_sizes: Sequence[int] = (1,),
    tp_launch: str | None = None,
    tp_logs: Path | None = None,
    store: RunStore | None = None,
) -> Results:
    """Run every (case, backend, mode, world size); return the results document (``compare.results.document.Results``).

    Single-device backends run here, at world size 1 (at a larger one they are ``skipped``); tensor-parallel
    backends (a registry line with a ``runtime``) run in worker groups (``compare.run.tp_launch``), one group per
    runtime, launch and world size for all of its cells, launched as ``tp_launch`` where the backend supports it
    (else its first launch), with the processes' logs under ``tp_logs``.
    ``progress`` (a :class:`~compare.run.progress.Display`, already entered) is told as each cell starts and ends.
    ``store`` (``compare.run.store``) gets every finished cell the moment its verdict is known: a case's cells of one
    mode settle together (they are timed together), a tensor-parallel cell as its group reports it.
    A stop (Ctrl-C, SIGTERM: ``compare.run.stop``; a ``KeyboardInterrupt``) ends the run between cells: the
    document then holds every finished cell and ``interrupted`` (the caller writes it and says so)."""
    cases, specs, modes = list(cases), list(specs), list(modes)
    jobs: dict[tuple[str, str, int], list[tuple[Cell, BackendSpec]]] = {}
    ceil = None
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    raw: list[Result] = []  # as measured
    results: list[Result] = []  # as stored: held to the ceilings measured first
    res_rows: list[ResolutionRow] = []
    flops: dict[int, tuple[int, int]] = {}  # result index -> (the FLOPs its step must do at the least, its devices)
    interrupted = False

    def record(res: Result, ws: int = 1, label: str = "") -> None:
        threads.update(res.threads)
        res = replace(res, world_size=ws)
        if res.tp is None:
            flops[len(raw)] = (cell.min_flops(_case_of(res, cases), res.mode), 1)
        raw.append(res)
        held = res if ceil is None else _plausible(res, ceil, flops.get(len(raw) - 1), cases)
        results.append(held)
        if store is not None:
            store.cell(held, precision)
        if progress:
            suffix = f" x{ws}" if res.tp is not None else ""
            progress.cell(label or f"{res.backend} {res.case} {res.mode}{suffix}", res.status, res.reason)

    try:
        if ceilings:  # this machine's matmul FLOP/s and copy bandwidth per dtype, before any backend runs
            if progress:
                progress.message("measuring ceilings (matmul FLOP/s, copy bandwidth)", important=True)
            ceil = measure_ceilings(dict.fromkeys(c.dtype for c in cases))
            if ceil is not None and store is not None:
                store.ceilings(ceil)
        for case in cases:
            stop.check()
            try:
                plain = plain_reference(case)
            except UnusableCase as exc:  # nothing can be judged on this case: say so in every cell, go on
                for mode in modes:
                    for spec in specs:
                        record(Result.for_case(spec.name, case, mode, "error", reason=str(exc)))
                continue
            rows = case_resolution(case, plain, modes)
            res_rows += rows
            if store is not None:
                store.resolution(rows)
            seed = fresh.new_seed()  # drawn now: no backend of this run can have seen these inputs
            try:
                inputs = fresh.draw(case, seed, golden_for(case).params)
            except UnusableCase as exc:  # no fresh draw of this case can be judged: say so in every cell, go on
                for mode in modes:
                    for spec in specs:
                        record(Result.for_case(spec.name, case, mode, "error", reason=f"fresh inputs: {exc}"))
                continue
            backward = any(m != "fwd" for m in modes)
            reference = _FreshReference(case, inputs, backward)
            for mode in modes:
                group: list[_Cell] = []
                for spec in specs:
                    for ws in world_sizes:
                        if spec.runtime and case.model in spec.models and mode in spec.modes:
                            how = tp_launch if tp_launch in spec.launches else spec.launches[0]
                            tp_cell = Cell(sum(map(len, jobs.values())), spec.name, case, mode)
                            jobs.setdefault((spec.runtime, how, ws), []).append((tp_cell, spec))
                        elif ws > 1 and not spec.runtime:
                            reason = f"a single-device backend: world size {ws} is for tensor-parallel backends"
                            record(Result.for_case(spec.name, case, mode, "skipped", reason=reason), ws)
                        else:
                            stop.check()
                            c = _Cell(spec, case, mode)
                            if progress:
                                progress.starting(c.label)
                            _start(c, plain, precision)
                            group.append(c)
                stop.check()
                if progress and group:
                    progress.starting(f"timing {len(group)} backends of {case.name} {mode} together")
                _time(group, cfg, plain)
                for c in group:
                    _finish_steps(c, inputs, profile, trace_dir)
                if group and progress and not reference.made:
                    progress.starting(f"{case.name}: the reference of the fresh inputs")
                for res in _settle(case, group, seed, inputs, reference):
                    record(res)
        for (runtime, how, ws), tp_cells in jobs.items():
            stop.check()
            _run_tp_job(runtime, how, ws, tp_cells, cfg, profile, tp_logs, progress, functools.partial(record, ws=ws))
    except KeyboardInterrupt:  # keep what is done; the caller writes it and says so
        interrupted = True
    typed = results
    if ceil is not None and any(r.status == "implausible" for r in typed) and not interrupted:
        # A ceiling is a peak: a probe that ran while other work held the cores reads low, and real steps timed
        # later would look faster than the machine. Before calling a step implausible, probe again and keep
        # each dtype's higher ceiling.
        if progress:
            progress.message("a step beat the ceilings: measuring them again", important=True)
        again = measure_ceilings(dict.fromkeys(c.dtype for c in cases))
        ceil = ceil if again is None else ceil.peak(again)
        typed = [_plausible(r, ceil, flops.get(i), cases) for i, r in enumerate(raw)]
    return Results(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        config=replace(Config.from_dict(config or {}), timing=timing.TimingConfig.from_dict(asdict(cfg))),
        environment=environment.current(precision, threads),
        results=tuple(typed),
        resolution=tuple(res_rows),
        ceilings=ceil,
        interrupted=interrupted,
    )


def _case_of(r: Result, cases: Sequence[Case]) -> Case:
    return next(c for c in cases if c.name == r.case and c.model == r.model and c.dtype == r.dtype)


def _plausible(r: Result, ceil: Ceilings, known: tuple[int, int] | None, cases: Sequence[Case]) -> Result:
    """``compare.run.cell.against_ceilings`` for a row: a single-device row against one device's ceiling; a
    tensor-parallel row's whole step (every rank's FLOPs together) against the ceiling times its hosts (its ranks
    share a host's cores)."""
    if known is not None:
        return cell.against_ceilings(r, ceil, known[0], known[1])
    if r.tp is None:
        return r
    return cell.against_ceilings(r, ceil, cell.min_flops(_case_of(r, cases), r.mode), max(1, len(r.tp.hosts)))


def _run_tp_job(
    runtime: str,
    how: str,
    world_size: int,
    cells: list[tuple[Cell, BackendSpec]],
    cfg: TimingConfig,
    profile: bool,
    logs: Path | None,
    progress: Display | None,
    record: Callable[[Result], None],
) -> None:
    """The cells of one worker group (``compare.run.tp_launch``), each given to ``record`` as its result the moment
    the group's process 0 reports it (an interrupt ends the group and keeps those already recorded)."""
    job = Job(
        runtime,
        how,
        world_size,
        tuple(c for c, _ in cells),
        tuple(dict.fromkeys(s for _, s in cells)),
        cfg,
        profile=profile,
    )
    if progress:
        progress.message(
            f"starting a tensor-parallel group: {runtime}, world size {world_size}, {job.nproc} process(es) x "
            f"{job.threads} thread(s), {len(cells)} cells",
            important=True,
        )
    run_job(job, root=logs, on_result=lambda doc: record(Result.from_dict(doc)))


def case_resolution(case: Case, plain: dict[str, np.ndarray], modes: Iterable[str]) -> list[ResolutionRow]:
    """The gate's resolution (``compare.gate.resolution``) for the tensors the modes check."""
    g = golden_for(case)
    order = ["y", "dx", *(f"d{p}" for p in case.weight_shapes())]
    wanted = [k for k in order if k in g.ref and any(MODE_TENSORS[m](k) for m in modes)]
    s = case.shape
    label = f"{case.model} {s.batch}x{s.seq}x{s.dim}->{s.hidden}"
    return resolution.resolution_rows(
        case.name, case.model, label, case.dtype, (g.x, g.params, g.dy), g.ref, plain, wanted
    )
