"""What running one cell (backend, case, mode) needs, in one process or in a tensor-parallel worker group: the
tensors each mode checks, the plain same-dtype reference the gate measures against, the gate's verdict on one
output and the status the findings make, the cost model's entry for the cell, and the plausibility of its timing
against the measured ceilings. The stages that use them, once for every runner, are ``compare.run.pipeline``'s."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from compare.backends.registry import DEFAULT_BASELINE, BackendSpec, module_file
from compare.cost.model import cost, roofline
from compare.cost.records import Ceilings, Cost
from compare.formats.codec import to_json
from compare.gate import parity
from compare.gate.parity import Parity, Plain, check_all, check_plain
from compare.problem import datacache, moe
from compare.problem.cases import Case, is_moe
from compare.problem.golden import golden_for, module_code, plain_run_of, prefetch_reference
from compare.problem.reference import held, round_to_dtype
from compare.results.document import Result

#: Which reference tensors each mode checks.
MODE_TENSORS: dict[str, Callable[[str], bool]] = {
    "fwd": lambda k: k == "y",
    "bwd": lambda k: k != "y",
    "fwd+bwd": lambda k: True,
}


#: A step whose median call beats the measured matmul ceiling by more than this factor cannot have done its FLOPs.
IMPLAUSIBLE_FACTOR = 1.2
#: The statuses a plausibility check can overturn: a timing of a step that fails or errs is not a verdict on speed.
_JUDGED_FAST = ("ok", "deviates")


@functools.lru_cache(maxsize=4)
def plain_reference(case: Case, backward: bool = True) -> Plain:
    """The plain same-dtype emulation of ``case`` (its output, and with ``backward`` its gradients), the parity gate's
    yardstick, with its envelope twin in float32 cases of a model with an activation (``compare.gate.parity.Plain``;
    in a 16-bit dtype a float32 transcendental's few ulp are far below the dtype's rounding). The same bits on every
    machine. A run of ``fwd`` alone needs only ``y``: the backward is two thirds of the work (on ``cpu-mlp`` float32,
    17 s of 24 s here), so it is left out when no mode needs it (a separate data cache entry).

    A module case's is its module's own plain computation (``compare.problem.golden.plain_run_of``).

    Raises :class:`~compare.gate.parity.UnusableCase` when it (or the reference) is not finite in the case dtype."""
    g = golden_for(case)
    prefetch_reference(g, backward)
    what = to_json(case) if case.module is None else {"case": to_json(case), **module_code(case)}
    name = datacache.key("plain" if backward else "plain-fwd", what)
    cached = datacache.load(name)
    if cached is not None:
        parts = {
            part: {k[len(part) + 1 :]: v for k, v in cached.items() if k.startswith(f"{part}.")} or None
            for part in ("unrounded", "envelope", "signature")
        }
        unrounded, envelope, signature = parts["unrounded"] or {}, parts["envelope"], parts["signature"]
    else:
        dy = g.dy if backward else None
        unrounded, envelope, signature = plain_run_of(case, g.x, g.params, dy)
        twins = {"unrounded": unrounded, "envelope": envelope or {}, "signature": signature or {}}
        datacache.save(name, {f"{part}.{k}": v for part, d in twins.items() for k, v in d.items()})
    # what final=True computes, held in the dtype's own type (half a float32's memory in bfloat16)
    plain = {k: held(round_to_dtype(v, case.dtype), case.dtype) for k, v in unrounded.items()}
    check_plain(case.name, case.dtype, g.ref, plain)
    return Plain(plain, envelope, unrounded, signature)


def golden_stats(case: Case, plain: Plain, tensors: Iterable[str]) -> None:
    """The gate's statistics of the plain computation against the golden (``compare.gate.parity.tensor_stats``) of
    ``tensors``, put in ``plain.stats`` (``plain``: :func:`plain_reference`'s), where every judgment of an output on
    the golden inputs reads them: from the data cache, else computed now and saved. A pure function of the case's
    golden data and the gate's code, as the resolution rows are (``compare.run.harness.case_resolution``), which
    took every run two passes over each tensor and its float64 reference: 0.6 s of CPU per 16.8M-element weight
    gradient (a Llama 3.2 1B layer's) on a busy 2-core VM."""
    g = golden_for(case)
    wanted = [k for k in tensors if k in plain]
    what = {"case": to_json(case), "tensors": wanted, "plain": sorted(plain), **module_code(case)}
    name = datacache.key("plain-stats", {**what, "gate": datacache.source_digest(["compare/gate"])})
    cached = datacache.load_json(name)
    sig = plain.signature
    if isinstance(cached, dict) and set(cached) == set(wanted):
        try:
            got = {k: parity.stats_of_record(cached[k], None if sig is None else sig[k]) for k in wanted}
        except (KeyError, TypeError, ValueError):  # an entry of another layout: a miss, computed again below
            got = {}
        if got:
            plain.stats.update({k: (g.ref[k], s) for k, s in got.items()})
            return
    datacache.save_json(name, {k: parity.stats_record(parity.tensor_stats(g.ref, plain, k)) for k in wanted})


def model_cost(spec: BackendSpec, case: Case, mode: str) -> Cost | None:
    """The cost model's entry (``compare.cost.model.cost``) for a result; None exactly when the backend's registry
    line names no plan (it is not modelled). Any other problem is an error, not a silently missing row."""
    return None if spec.plan is None else cost(case, spec, mode)


def status_of(failures: list[str], deviations: list[str]) -> tuple[str, str]:
    """A result's status and reason from the gate's fail-tier and deviates-tier findings (first call and last timed
    call together): ``parity-fail`` with the failures, else ``deviates`` with the deviations, else ``ok``."""
    if failures:
        return "parity-fail", "; ".join(failures)
    if deviations:
        return "deviates", "; ".join(deviations)
    return "ok", ""


def judge(
    got: dict[str, np.ndarray], ref: dict[str, np.ndarray], plain: dict[str, np.ndarray], dtype: str, who: str
) -> Parity:
    """The gate's verdict (``compare.gate.parity.check_all``) on one output of a step, read as named float64 arrays
    (``Prepared.to_numpy``); a step that returns other tensors than the mode checks (``ref``'s) is an error naming
    ``who`` (the backend and mode)."""
    if set(got) != set(ref):
        raise RuntimeError(f"{who} returned tensors {sorted(got)}; expected {sorted(ref)}")
    return check_all(got, ref, plain, dtype)


@functools.lru_cache(maxsize=64)
def min_flops(case: Case, mode: str) -> int | None:
    """GEMM FLOPs any backend's step must do on ``case`` in ``mode``: the baseline's, which recomputes nothing. A
    module case's, which no cost model knows, are its torch module's eager step's as ``torch.utils.flop_counter``
    counts them (the ``module-file`` probe's ``matmul_flops``: on shapes alone, milliseconds), a property of the
    case: counted once and held to every backend of it (a JAX port is held to the FLOPs of the torch module it
    ports). None where a module's cannot be counted: its timing is then not checked against the ceilings. A MoE
    case's are its routed block's (``compare.problem.moe.gemm_flops``)."""
    if is_moe(case.model):  # no cost-model plan knows a MoE block: its routed GEMMs (``moe.gemm_flops``)
        s = case.shape
        return moe.gemm_flops(moe.MOE_SPECS[case.model], s.tokens, s.dim, s.hidden, mode)
    return cost(case, DEFAULT_BASELINE, mode).flops if case.module is None else module_file().matmul_flops(case, mode)


def implausible(frac: float) -> str:
    """Why a step is implausible (``frac``, the case's GEMM FLOPs over its median call as a fraction of the measured
    matmul ceiling, above ``IMPLAUSIBLE_FACTOR``: it cannot have done its FLOPs, e.g. it returns a stored answer),
    or ``""``. The reason names the statistic (:func:`against_ceilings` says why the median)."""
    if frac > IMPLAUSIBLE_FACTOR:
        return (
            f"implausible: its median call does the case's GEMM FLOPs at {frac:.2f}x the matmul ceiling measured in "
            f"this run (more than {IMPLAUSIBLE_FACTOR:g}x cannot be computing its FLOPs)"
        )
    return ""


def against_ceilings(r: Result, ceil: Ceilings, min_step_flops: int | None, devices: int = 1) -> Result:
    """``r`` with its roofline numbers (``cost.achieved``) and, where its timing implies more FLOP/s than ``devices``
    of the machine's measured ceiling allow, the ``implausible`` reason and status (an ``ok`` or ``deviates`` step
    only: it cannot have computed its answer). ``min_step_flops``: the FLOPs the whole step must do (every rank of a
    tensor-parallel group together, whose ``devices`` are the devices it ran on). A TP row's cost is one rank's
    share, so it gets no single-device roofline.

    The step is judged on its median per-call time, against a best-of ceiling (each probe's fastest sample at its
    best size, the higher library, the higher of a re-measure: ``compare.cost.records.Ceilings.peak``). The median
    and not the minimum: the fastest of n samples on a loaded machine is an extreme-value statistic, the one moment
    the load let go, and need not fall where the ceiling's probe had its luck. On a busy 2-core machine honest
    JAX backends (jitted and op by op) had their fastest samples at 33.7 ms against a median of 62 ms, and were called
    1.23x and 1.24x the ceiling; their medians stand at about 0.67x. An honest step's median cannot beat the machine's
    best rate whatever the load (load only slows it), while a step that answers from memory does so on every call, so
    its median is as fast as its minimum. Not the lower quartile: it would add only a cheat fast on a quarter to a
    half of its calls, for half the median's robustness (a quarter of samples, not half, moves it); and the median
    is what the report's roofline (``cost.achieved``) divides by, so the flag and a row's achieved FLOP/s there
    read the same time."""
    k, t = ceil.get(r.dtype), r.timing
    if k is None or t is None:
        return r
    if r.cost is not None and r.tp is None:
        r = replace(r, cost=replace(r.cost, achieved=roofline(r.cost, t.median_s, k)))
    if min_step_flops:
        why = implausible(min_step_flops / t.median_s / (devices * k.flops_per_s))
        r = replace(r, implausible=why)
        if why and r.status in _JUDGED_FAST:
            r = replace(r, status="implausible", reason="; ".join(x for x in (why, r.reason) if x))
    return r
