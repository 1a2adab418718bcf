"""What ``results.json`` keeps of a run's time budget (``compare.run.budget`` keeps the budget): a record, so that
the report, a rebuild from the store and ``diff`` read it without the run's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compare.formats.jsonfields import Obj, number, record_dict, texts


@dataclass(frozen=True)
class BudgetRecord:
    """What ``results.json`` keeps of a budget: the seconds asked for, the seconds the run took (measurements only,
    not the report's writing), and each cut, in order."""

    total_s: float
    spent_s: float
    cuts: tuple[str, ...] = ()

    @property
    def overrun_s(self) -> float:
        return max(0.0, self.spent_s - self.total_s)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @staticmethod
    def from_dict(d: Obj) -> BudgetRecord:
        return BudgetRecord(number(d, "total_s"), number(d, "spent_s"), texts(d, "cuts"))
