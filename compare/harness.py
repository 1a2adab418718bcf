"""Run backends on cases: parity against the golden data, then timing through the shared timer.

Every failure is contained to its (backend, case, mode): an exception becomes an ``error`` result with its
message, and the other backends' results are still produced.
"""

from __future__ import annotations

import datetime
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from compare import environment, timing
from compare.cases import Case
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
) -> Result:
    """Parity then timing of one backend on one case and mode; never raises for a backend's own failure.

    ``prepare`` overrides the backend's own preparation (tests use it for negative controls); ``time_it=False``
    checks parity only.
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
        status = "ok" if parity.passed else "parity-fail"
        return Result.for_case(spec.name, case, mode, status, reason="; ".join(parity.failures()),
                               note=prepared.note, device=prepared.device, parity=parity.to_dict(), timing=tim,
                               threads=prepared.threads, extras=prepared.extras)
    except Exception as exc:  # a backend's failure is a result, not the end of the run
        reason, tb = _summarise_error(exc)
        return Result.for_case(spec.name, case, mode, "error", reason=reason, extras={"traceback": tb})


def run(
    cases: Iterable[Case],
    specs: Iterable[BackendSpec],
    modes: Iterable[str],
    cfg: TimingConfig = TimingConfig(),
    config: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every (case, backend, mode); return the results document (see ``compare.results``)."""
    specs, modes = list(specs), list(modes)
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    results = []
    for case in cases:
        plain = plain_reference(case)
        for mode in modes:
            for spec in specs:
                if progress:
                    progress(f"{spec.name:18s} {case.name} {mode}")
                r = run_one(spec, case, mode, plain, cfg, precision)
                threads.update(r.threads)
                results.append(r.to_dict())
                if progress:
                    progress(f"  -> {r.status}" + (f": {r.reason}" if r.reason else ""))
    return {
        "schema": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {**(config or {}), "timing": asdict(cfg)},
        "environment": environment.collect(precision, threads),
        "results": results,
    }
