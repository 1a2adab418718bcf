"""Run backends on cases: parity against the golden data, then timing through the shared timer.

Every failure is contained to its (backend, case, mode): an exception becomes an ``error`` result with its
message, and the other backends' results are still produced. A case the gate cannot judge (its plain computation
overflows the dtype, or its reference does) makes every cell of that case an ``error`` naming the tensor.

A backend is handed a :class:`~compare.golden.Problem` (inputs and weights, no reference). Parity is checked on
the first call's output and again on the output of the last timed call. A timing that implies more FLOP/s than
:data:`IMPLAUSIBLE_FACTOR` x the matmul ceiling measured in the same run is flagged ``implausible``.
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare import cell, costmodel, environment, resolution, timing
from compare.cases import Case
from compare.cell import IMPLAUSIBLE_FACTOR, MODE_TENSORS, model_cost, plain_reference
from compare.cost_types import Ceilings
from compare.golden import golden_for
from compare.kernels import Kernels
from compare.parity import Parity, UnusableCase
from compare.parity_record import ParityRecord
from compare.progress import Display
from compare.registry import DEFAULT_BASELINE, BackendSpec, Prepared, probe
from compare.resolution import ResolutionRow
from compare.results import Config, Result, Results
from compare.timing import TimingConfig
from compare.tp_launch import Job, run_job
from compare.tp_worker import Cell


def _summarise_error(exc: BaseException) -> tuple[str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return f"{type(exc).__name__}: {exc}".strip(), tb


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
    """Parity then timing of one backend on one case and mode; never raises for a backend's own failure.

    ``prepare`` overrides the backend's own preparation (tests use it for negative controls); ``time_it=False``
    checks parity only. ``profile`` adds the kernel summary of one more step (``compare.kernels``), with a trace
    under ``trace_dir`` when given; a profiler failure is recorded in ``extras`` and does not fail the result.
    """
    if case.model not in spec.models:
        return Result.for_case(
            spec.name, case, mode, "skipped", reason=f"implements {', '.join(spec.models)} only, not {case.model}"
        )
    if mode not in spec.modes:
        return Result.for_case(
            spec.name, case, mode, "skipped", reason=f"supports modes {', '.join(spec.modes)} only, not {mode}"
        )
    try:
        avail = spec.availability()
        if not avail.ok:
            return Result.for_case(spec.name, case, mode, "skipped", reason=avail.reason, device=avail.device)
        golden = golden_for(case)
        prepared = prepare() if prepare else spec.load().prepare(golden.problem, mode)
        precision.update(prepared.precision)
        first_s, out = timing.first_call(prepared.step, prepared.sync)
        want = MODE_TENSORS[mode]
        ref = {k: v for k, v in golden.ref.items() if want(k)}

        def judge(output: Any) -> Parity:
            return cell.judge(prepared, output, ref, plain, case.dtype, f"{spec.name} in mode {mode}")

        parity = judge(out)
        del out
        tim, last = None, list[Any]()
        if prepared.timed and time_it:
            tim = timing.measure(
                prepared.step,
                prepared.sync,
                first_call_s=first_s,
                warmup=cfg.warmup,
                min_samples=cfg.min_samples,
                max_samples=cfg.max_samples,
                budget_s=cfg.budget_s,
                min_sample_s=cfg.min_sample_s,
                last_output=last.append,
            )
        failures, deviations = parity.failures(), parity.deviations()
        again = judge(last.pop()) if last else None  # the last timed call must be right too (no replayed answers)
        if again is not None:
            failures += [f"last timed call: {f}" for f in again.failures()]
            deviations += [f"last timed call: {f}" for f in again.deviations()]
        kernels, extras = None, dict(prepared.extras)
        if profile and prepared.profile is not None:
            trace = trace_dir / f"{spec.name}-{case.name}-{mode}" if trace_dir else None
            try:
                kernels = Kernels.from_dict(prepared.profile(trace))
                if kernels.trace and trace_dir is not None:  # relative to the output folder, for links
                    kernels = replace(kernels, trace=os.path.relpath(kernels.trace, trace_dir.parent))
            except Exception as exc:  # the profile is extra information: keep the parity and timing results
                extras["profile_error"] = _summarise_error(exc)[0]
        status, reason = cell.status_of(failures, deviations)
        return Result.for_case(
            spec.name,
            case,
            mode,
            status,
            reason=reason,
            note=prepared.note,
            device=prepared.device,
            parity=ParityRecord.of(parity, again),
            timing=tim,
            threads=prepared.threads,
            kernels=kernels,
            extras=extras,
            cost=model_cost(spec, case, mode),
        )
    except Exception as exc:  # a backend's failure is a result, not the end of the run
        reason, tb = _summarise_error(exc)
        return Result.for_case(spec.name, case, mode, "error", reason=reason, extras={"traceback": tb})


def measure_ceilings(dtypes: Iterable[str], budget_s: float = 0.5) -> Ceilings | None:
    """This machine's matmul FLOP/s and copy bandwidth per dtype, from the registry's ``ceilings`` probe (torch, on
    the device the torch backends use); None where its framework cannot be imported."""
    try:
        ceilings = probe("ceilings")
    except ImportError:
        return None
    return Ceilings.from_dict(ceilings.measure_all(list(dtypes), budget_s))


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
) -> Results:
    """Run every (case, backend, mode, world size); return the results document (``compare.results.Results``).

    Single-device backends run here, at world size 1 (at a larger one they are ``skipped``); tensor-parallel
    backends (a registry line with a ``runtime``) run in worker groups (``compare.tp_launch``), one group per
    runtime, launch and world size for all of its cells, launched as ``tp_launch`` where the backend supports it
    (else its first launch), with the processes' logs under ``tp_logs``.
    ``progress`` (a :class:`~compare.progress.Display`, already entered) is told as each cell starts and ends.
    Ctrl-C stops the run between or inside cells: the document then holds every finished cell and
    ``interrupted`` (the caller writes it and says so)."""
    cases, specs, modes = list(cases), list(specs), list(modes)
    jobs: dict[tuple[str, str, int], list[tuple[Cell, BackendSpec]]] = {}
    ceil = None
    if ceilings:  # this machine's matmul FLOP/s and copy bandwidth per dtype, before any backend runs
        if progress:
            progress.message("measuring ceilings (matmul FLOP/s, copy bandwidth)", important=True)
        ceil = measure_ceilings(dict.fromkeys(c.dtype for c in cases))
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    res_rows: list[ResolutionRow] = []
    flops: dict[int, int] = {}  # result index -> the FLOPs its step must do at the least
    interrupted = False
    try:
        for case in cases:
            try:
                plain = plain_reference(case)
            except UnusableCase as exc:  # nothing can be judged on this case: say so in every cell, go on
                refused = [
                    Result.for_case(spec.name, case, mode, "error", reason=str(exc)).to_dict()
                    for mode in modes
                    for spec in specs
                ]
                results += refused
                for row in refused:
                    if progress:
                        progress.cell(f"{row['backend']} {case.name} {row['mode']}", "error", str(exc))
                continue
            res_rows += case_resolution(case, plain, modes)
            for mode in modes:
                for spec in specs:
                    for ws in world_sizes:
                        label = f"{spec.name} {case.name} {mode}" + (f" x{ws}" if ws > 1 or spec.runtime else "")
                        if spec.runtime and case.model in spec.models and mode in spec.modes:
                            how = tp_launch if tp_launch in spec.launches else spec.launches[0]
                            cell = Cell(sum(map(len, jobs.values())), spec.name, case, mode)
                            jobs.setdefault((spec.runtime, how, ws), []).append((cell, spec))
                            continue
                        if progress:
                            progress.starting(label)
                        if ws > 1 and not spec.runtime:
                            res = Result.for_case(
                                spec.name,
                                case,
                                mode,
                                "skipped",
                                reason=f"a single-device backend: world size {ws} is for tensor-parallel backends",
                            )
                        else:
                            res = run_one(spec, case, mode, plain, cfg, precision, profile=profile, trace_dir=trace_dir)
                        threads.update(res.threads)
                        results.append({**res.to_dict(), "world_size": ws})
                        flops[len(results) - 1] = min_flops(case, mode)
                        if progress:
                            progress.cell(label, res.status, res.reason)
        for (runtime, how, ws), cells in jobs.items():
            results += _run_tp_job(runtime, how, ws, cells, cfg, profile, tp_logs, progress)
    except KeyboardInterrupt:  # keep what is done; the caller writes it and says so
        interrupted = True
    typed = [Result.from_dict(r) for r in results]
    if ceil is not None:
        typed = [_against_ceilings(r, ceil, flops.get(i)) for i, r in enumerate(typed)]
    return Results(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        config=replace(Config.from_dict(config or {}), timing=timing.TimingConfig.from_dict(asdict(cfg))),
        environment=environment.current(precision, threads),
        results=tuple(typed),
        resolution=tuple(res_rows),
        ceilings=ceil,
        interrupted=interrupted,
    )


def _against_ceilings(r: Result, ceil: Ceilings, min_step_flops: int | None) -> Result:
    """``r`` with its roofline numbers (``cost.achieved``) and, where its timing implies more FLOP/s than the
    machine has, the ``implausible`` flag; a TP row's cost is one rank's share, so it gets no single-device
    roofline."""
    k, t = ceil.get(r.dtype), r.timing
    if k is None or t is None:
        return r
    if r.cost is not None and r.tp is None:
        r = replace(r, cost=replace(r.cost, achieved=costmodel.roofline(r.cost, t.median_s, k)))
    if min_step_flops:
        # best against best: the step's fastest sample against the ceiling's (both the least disturbed by other load)
        r = replace(r, implausible=implausible(min_step_flops / t.min_s / k.flops_per_s))
    return r


def _run_tp_job(
    runtime: str,
    how: str,
    world_size: int,
    cells: list[tuple[Cell, BackendSpec]],
    cfg: TimingConfig,
    profile: bool,
    logs: Path | None,
    progress: Display | None,
) -> list[dict[str, Any]]:
    """The cells of one worker group (``compare.tp_launch``), each as its result document."""
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

    def told(doc: dict[str, Any]) -> None:
        if progress:
            label = f"{doc['backend']} {doc['case']} {doc['mode']} x{world_size}"
            progress.cell(label, doc["status"], doc["reason"])

    return run_job(job, root=logs, on_result=told)


def min_flops(case: Case, mode: str) -> int:
    """GEMM FLOPs any backend's step must do on ``case`` in ``mode``: the baseline's, which recomputes nothing."""
    return costmodel.cost(case, DEFAULT_BASELINE, mode).flops


def implausible(frac: float) -> str:
    """Why a step is implausible (``frac``, the case's GEMM FLOPs over its fastest sample as a fraction of the measured
    matmul ceiling, above ``IMPLAUSIBLE_FACTOR``: it cannot have done its FLOPs, e.g. it returns a stored answer),
    or ``""``."""
    if frac > IMPLAUSIBLE_FACTOR:
        return (
            f"implausible: {frac:.2f}x the matmul ceiling measured in this run (more than {IMPLAUSIBLE_FACTOR:g}x "
            f"cannot be computing its FLOPs)"
        )
    return ""


def case_resolution(case: Case, plain: dict[str, np.ndarray], modes: Iterable[str]) -> list[ResolutionRow]:
    """The gate's resolution (``compare.resolution``) for the tensors the modes check."""
    g = golden_for(case)
    order = ["y", "dx", *(f"d{p}" for p in case.weight_shapes())]
    wanted = [k for k in order if k in g.ref and any(MODE_TENSORS[m](k) for m in modes)]
    s = case.shape
    label = f"{case.model} {s.batch}x{s.seq}x{s.dim}->{s.hidden}"
    return resolution.resolution_rows(
        case.name, case.model, label, case.dtype, (g.x, g.params, g.dy), g.ref, plain, wanted
    )
