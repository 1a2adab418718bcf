"""Run backends on cases: parity against the golden data, then timing through the shared timer.

Every failure is contained to its (backend, case, mode): an exception becomes an ``error`` result with its
message, and the other backends' results are still produced.
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compare import costmodel, environment, timing
from compare.cases import Case, InputError
from compare.golden import golden_for
from compare.parity import check_all
from compare.reference import Arith, compute
from compare.registry import BackendSpec, Prepared
from compare.results import SCHEMA_VERSION, Result

#: Which reference tensors each mode checks.
MODE_TENSORS: dict[str, Callable[[str], bool]] = {
    "fwd": lambda k: k == "y",
    "bwd": lambda k: k != "y",
    "fwd+bwd": lambda k: True,
}


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = 3
    min_samples: int = 5
    max_samples: int = 100
    budget_s: float = 1.0
    min_sample_s: float = 2e-3


def plain_reference(case: Case) -> dict[str, np.ndarray]:
    """The plain same-dtype emulation of ``case`` (outputs and gradients), the parity gate's yardstick."""
    g = golden_for(case)
    return compute(case.model, g.x, g.params, g.dy, Arith.plain(case.dtype))


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
        return Result.for_case(spec.name, case, mode, "skipped",
                               reason=f"implements {', '.join(spec.models)} only, not {case.model}")
    if mode not in spec.modes:
        return Result.for_case(spec.name, case, mode, "skipped",
                               reason=f"supports modes {', '.join(spec.modes)} only, not {mode}")
    try:
        avail = spec.availability()
        if not avail.ok:
            return Result.for_case(spec.name, case, mode, "skipped", reason=avail.reason, device=avail.device)
        golden = golden_for(case)
        prepared = prepare() if prepare else spec.load().prepare(golden, mode)
        precision.update(prepared.precision)
        first_s, out = timing.first_call(prepared.step, prepared.sync)
        got = prepared.to_numpy(out)
        del out
        want = MODE_TENSORS[mode]
        ref = {k: v for k, v in golden.ref.items() if want(k)}
        if set(got) != set(ref):
            raise RuntimeError(f"{spec.name} returned tensors {sorted(got)} in mode {mode}; expected {sorted(ref)}")
        parity = check_all(got, ref, plain, case.dtype, reduction=case.reduction_length)
        tim = None
        if prepared.timed and time_it:
            tim = timing.measure(prepared.step, prepared.sync, first_call_s=first_s, warmup=cfg.warmup,
                                 min_samples=cfg.min_samples, max_samples=cfg.max_samples, budget_s=cfg.budget_s,
                                 min_sample_s=cfg.min_sample_s).to_dict()
        kernels, extras = None, dict(prepared.extras)
        if profile and prepared.profile is not None:
            trace = trace_dir / f"{spec.name}-{case.name}-{mode}" if trace_dir else None
            try:
                kernels = prepared.profile(trace)
                if kernels.get("trace") and trace_dir is not None:  # relative to the output folder, for links
                    kernels["trace"] = os.path.relpath(kernels["trace"], trace_dir.parent)
            except Exception as exc:  # the profile is extra information: keep the parity and timing results
                extras["profile_error"] = _summarise_error(exc)[0]
        status = "ok" if parity.passed else "parity-fail"
        return Result.for_case(spec.name, case, mode, status, reason="; ".join(parity.failures()),
                               note=prepared.note, device=prepared.device, parity=parity.to_dict(), timing=tim,
                               threads=prepared.threads, kernels=kernels, extras=extras,
                               cost=model_cost(spec.name, case, mode))
    except Exception as exc:  # a backend's failure is a result, not the end of the run
        reason, tb = _summarise_error(exc)
        return Result.for_case(spec.name, case, mode, "error", reason=reason, extras={"traceback": tb})


def model_cost(backend: str, case: Case, mode: str) -> dict[str, Any] | None:
    """The cost model's entry (``compare.costmodel.cost``) for a result; None for a backend it does not model."""
    try:
        return costmodel.cost(case, backend, mode)
    except InputError:
        return None


def measure_ceilings(dtypes: Iterable[str], budget_s: float = 0.5) -> dict[str, Any] | None:
    """This machine's matmul FLOP/s and copy bandwidth per dtype, measured with torch on the device the torch
    backends use (``torch_impl.ceilings``); None where torch cannot be imported."""
    try:
        from torch_impl import device as tdev
        from torch_impl.ceilings import measure_ceilings as measure
    except ImportError:
        return None
    device = str(tdev.device())
    return {"device": device, **{d: measure(d, device, budget_s) for d in dtypes}}


def run(
    cases: Iterable[Case],
    specs: Iterable[BackendSpec],
    modes: Iterable[str],
    cfg: TimingConfig = TimingConfig(),
    config: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    profile: bool = False,
    trace_dir: Path | None = None,
    ceilings: bool = False,
) -> dict[str, Any]:
    """Run every (case, backend, mode); return the results document (see ``compare.results``)."""
    cases, specs, modes = list(cases), list(specs), list(modes)
    ceil = None
    if ceilings:  # this machine's matmul FLOP/s and copy bandwidth per dtype, before any backend runs
        if progress:
            progress("measuring ceilings (matmul FLOP/s, copy bandwidth)")
        ceil = measure_ceilings(dict.fromkeys(c.dtype for c in cases))
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    results = []
    for case in cases:
        plain = plain_reference(case)
        for mode in modes:
            for spec in specs:
                if progress:
                    progress(f"{spec.name:18s} {case.name} {mode}")
                r = run_one(spec, case, mode, plain, cfg, precision, profile=profile, trace_dir=trace_dir)
                threads.update(r.threads)
                results.append(r.to_dict())
                if progress:
                    progress(f"  -> {r.status}" + (f": {r.reason}" if r.reason else ""))
    for r in results if ceil else []:
        c, t, k = r.get("cost"), r.get("timing"), ceil.get(r["dtype"])
        if c and t and k:
            c["achieved"] = costmodel.roofline(c, t["median_s"], k)
    return {
        "schema": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {**(config or {}), "timing": asdict(cfg)},
        "environment": environment.collect(precision, threads),
        "results": results,
        **({"ceilings": ceil} if ceil else {}),
    }
