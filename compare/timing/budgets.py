"""What ``results.json`` keeps of a run's time budget (``compare.run.budget`` keeps the budget): a record, so that
the report, a rebuild from the store and ``diff`` read it without the run's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compare.formats.jsonfields import FieldError, Obj, number, opt_mapping, record_dict, texts

#: The phases a budget parts its time among (``compare.run.budget.SHARES``' keys), as the report names them.
PHASES: dict[str, str] = {
    "ceilings": "ceilings",
    "timing": "timed samples",
    "profile": "profiles and memory",
    "shape_sweep": "compile-cost sweep",
}
#: What the time outside every phase went to: what the budget never cuts.
REST = "the rest (first calls and compiles, parity and fresh-input checks, reference data; never cut)"


@dataclass(frozen=True)
class BudgetRecord:
    """What ``results.json`` keeps of a budget: the seconds asked for, the seconds the run took (measurements only,
    not the report's writing), each cut, in order, and the seconds each phase (:data:`PHASES`) took, in the order
    they first ran (``phases``: empty in documents written before phases were kept)."""

    total_s: float
    spent_s: float
    cuts: tuple[str, ...] = ()
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def overrun_s(self) -> float:
        return max(0.0, self.spent_s - self.total_s)

    @property
    def rest_s(self) -> float:
        """The seconds spent outside every phase: what the budget cannot cut (:data:`REST`)."""
        return max(0.0, self.spent_s - sum(s for _, s in self.phases))

    def to_dict(self) -> dict[str, Any]:
        d = record_dict(self, optional=("phases",))
        if self.phases:
            d["phases"] = dict(self.phases)
        return d

    @staticmethod
    def from_dict(d: Obj) -> BudgetRecord:
        spent = opt_mapping(d, "phases") or {}
        for name in spent:
            if name not in PHASES:
                raise FieldError(f"phases.{name}", f"is not a budget phase (known: {', '.join(PHASES)})")
        phases = tuple((name, float(number(spent, name))) for name in spent)
        return BudgetRecord(number(d, "total_s"), number(d, "spent_s"), texts(d, "cuts"), phases)
