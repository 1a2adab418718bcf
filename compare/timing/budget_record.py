"""What ``results.json`` keeps of a run's time budget (``compare.run.budget`` keeps the budget): a record, so that
the report, a rebuild from the store and ``diff`` read it without the run's code."""

from __future__ import annotations

from dataclasses import dataclass, field

from compare.formats.codec import LATER

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
    phases: dict[str, float] = field(default_factory=dict, metadata=LATER)

    @property
    def overrun_s(self) -> float:
        return max(0.0, self.spent_s - self.total_s)

    @property
    def rest_s(self) -> float:
        """The seconds spent outside every phase: what the budget cannot cut (:data:`REST`)."""
        return max(0.0, self.spent_s - sum(self.phases.values()))

    def __post_init__(self) -> None:
        unknown = [name for name in self.phases if name not in PHASES]
        if unknown:
            raise ValueError(f"phases {unknown} are not budget phases (known: {', '.join(PHASES)})")
