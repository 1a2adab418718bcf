"""A time budget that a whole ``run`` keeps: the ceilings, each timing group's samples (warm and cold), the slow steps
and the compile-cost sweep share it, and every cut made to keep it is said (``results.json``'s ``budget``, the
report's timing section).

What it can cut, and what it cannot:

- **cut**: the ceiling probes' sampling time; each group's sampling budget, its minimum samples and warm-up calls;
  a step too slow for its share is timed on fewer samples, then, if even that does not fit, not timed beyond its
  first call (its parity is still judged), nor run again to profile it or record its memory; the cold samples of
  a step too slow for them; the profile of a step too slow for its part (one warm-up and one profiled step instead
  of five calls, where the backend has that quick profile); the compile-cost sweep's token list (its smallest and
  largest counts kept) and its sampling per shape;
- **not cut**: parity, and the core comparison's rounds (``compare.run.harness``). Every backend's first call and
  its calls on the harness's inputs (a timed step's, or an untimed one's single call) run whatever the budget (the
  interpreted ones' verdicts may come from ``compare.run.parity_cache``); compiles; golden data and the plain
  computation (cached on disk after their first run).

So a budget below what parity alone costs on this machine is overrun, and the record says by how much. The shares
are fractions of the whole (:data:`SHARES`), each group's part of the timing share the same; a phase that finishes
under its share leaves the rest to those after it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from compare.timing.budgets import BudgetRecord

#: The fraction of the budget each cuttable phase may take at most: the ceiling probes, the timed samples of all
#: groups together (warm and cold), and the compile-cost sweep. The rest is what parity, compiles and the report
#: take, which are not cut.
SHARES: dict[str, float] = {"ceilings": 0.05, "timing": 0.30, "shape_sweep": 0.25, "profile": 0.20}
#: Calls a full profile makes at most (torch's wait, warm-up and three profiled steps; JAX's warm-up and three
#: traced): a step whose profile would pass its part of the ``profile`` share is profiled on its
#: ``Prepared.quick_profile`` where it has one (:func:`profile_calls`).
PROFILE_CALLS = 5
#: The fewest samples a budget may leave a timing (the timer's floor; the paired test needs 8 rounds to reach
#: p < 0.01, so a group cut below 8 says its verdicts are weaker).
MIN_SAMPLES = 5
#: The fraction of its part a phase keeps however late it starts (:meth:`Budget.part`).
FLOOR = 0.5
#: The budget's clock (``time.monotonic``: its deadline is compared with that clock's readings; a test's fake clock
#: replaces it here).
CLOCK: Callable[[], float] = time.monotonic


def _now() -> float:
    return CLOCK()


@dataclass
class Budget:
    """A run's budget of ``total_s`` seconds from ``start`` (``time.monotonic``). Phases ask for their part with
    :meth:`part`, say what they cut with :meth:`cut` and run inside :meth:`phase`, which counts their seconds."""

    total_s: float
    start: float = field(default_factory=_now)
    cuts: list[str] = field(default_factory=list)
    #: seconds spent inside each phase so far, in the order they first ran
    spent_in: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.total_s > 0:
            raise ValueError(f"a time budget must be positive, got {self.total_s}")

    def spent(self) -> float:
        return CLOCK() - self.start

    def left(self) -> float:
        return self.total_s - self.spent()

    def deadline(self) -> float:
        """The ``time.monotonic`` value at which the budget is spent."""
        return self.start + self.total_s

    def part(self, phase: str, of: int = 1) -> float:
        """Seconds for one of ``of`` equal parts of ``phase``'s share (:data:`SHARES`), never more than what is left,
        and never less than :data:`FLOOR` of that part: a run that overran its budget still times every group on
        its floor (fewer samples, said as a cut) rather than leaving a dtype out of the timing table."""
        share = SHARES[phase] * self.total_s / max(1, of)
        return max(FLOOR * share, min(share, self.left()))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the seconds inside as ``name``'s (one of :data:`SHARES`), whatever ends them: the record then says
        where the run's time went, and how much of it no phase could cut."""
        if name not in SHARES:
            raise ValueError(f"unknown budget phase {name!r} (known: {', '.join(SHARES)})")
        t0 = CLOCK()
        try:
            yield
        finally:
            self.spent_in[name] = self.spent_in.get(name, 0.0) + CLOCK() - t0

    def cut(self, what: str) -> None:
        """Say what was cut to keep the budget (a sentence naming the phase and the figures)."""
        if what not in self.cuts:
            self.cuts.append(what)

    def record(self) -> BudgetRecord:
        phases = {name: round(s, 3) for name, s in self.spent_in.items()}
        return BudgetRecord(self.total_s, round(self.spent(), 3), tuple(self.cuts), phases)


def budget_phase(b: Budget | None, name: str) -> contextlib.AbstractContextManager[None]:
    """``b.phase(name)``, or nothing to count for a run without a budget."""
    return b.phase(name) if b is not None else contextlib.nullcontext()
