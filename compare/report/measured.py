"""What the report measures for a user's own MLP (``--module``), where no cost-model plan models its bytes and FLOPs
(``BackendSpec.plan`` is None for the module backends): the FLOPs its frameworks counted over one step and the rate
they make at the warm median. Pure functions of a result (the sections are ``compare.report.cost``'s and
``compare.report.render``'s)."""

from __future__ import annotations

from dataclasses import dataclass

from compare.problem.cases import MODULE_MODEL
from compare.results.document import Result

#: What a table cell says where the plan would have a figure.
NOT_MODELLED = "not modelled"
#: The sources of measured FLOPs, as the report names them.
FLOP_COUNTER = "torch flop_counter"
XLA_COST = "XLA cost_analysis"


def unmodelled(r: Result) -> bool:
    """True for a module case's result with no cost-model plan (its sections say "not modelled")."""
    return r.model == MODULE_MODEL and r.cost is None


@dataclass(frozen=True)
class MeasuredFlops:
    """FLOPs of one step of a result's mode as its framework counted them, and by what (:data:`FLOP_COUNTER`:
    ``torch.utils.flop_counter``, matmuls only; :data:`XLA_COST`: XLA's ``cost_analysis()``, every op)."""

    flops: float
    source: str


def measured_flops(r: Result) -> MeasuredFlops | None:
    """The counted FLOPs of a profiled result (the kernel summary's ``flop_count``, else its ``xla_cost``); None
    where it was not profiled or nothing counted."""
    k = r.kernels
    if k is None:
        return None
    if k.flop_count and k.flop_count.get("flops") is not None:
        return MeasuredFlops(float(k.flop_count["flops"]), FLOP_COUNTER)
    if k.xla_cost and k.xla_cost.get("flops") is not None:
        return MeasuredFlops(float(k.xla_cost["flops"]), XLA_COST)
    return None


def not_counted(r: Result) -> str:
    """Why a result has no measured FLOPs, for a table cell."""
    k = r.kernels
    if k is None:
        return "- (not profiled)"
    error = (k.flop_count or {}).get("error") or (k.xla_cost or {}).get("error")
    return f"- ({error})" if error else "-"


def achieved_flops_per_s(r: Result) -> float | None:
    """Measured FLOPs over the warm median; None without either."""
    m = measured_flops(r)
    t = r.timing
    if m is None or t is None or not t.median_s or r.status not in ("ok", "deviates"):
        return None
    return m.flops / t.median_s
