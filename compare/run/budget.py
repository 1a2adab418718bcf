"""A time budget that a whole ``run`` keeps: the ceilings, each timing group's samples (warm and cold), the slow steps
and the compile-cost sweep share it, and every cut made to keep it is said (``results.json``'s ``budget``, the
report's timing section).

What it can cut, and what it cannot:

- **cut**: the ceiling probes' sampling time; each group's sampling budget, its minimum samples and warm-up calls;
  a step too slow for its share is timed on fewer samples, then not timed beyond its first calls (its parity is
  still judged), nor run again to profile it or record its memory; the cold samples of a step too slow for them;
  the profile of a step too slow for its part (its quick profile, where the backend has one); the compile-cost
  sweep's token list (its smallest and largest counts kept) and its sampling per shape;
- **not cut**: parity (every first call and every call on the harness's inputs), the core comparison's rounds
  (:func:`timing_plan`), compiles, golden data and the plain computation (cached on disk after their first run).

So a budget below what parity alone costs on this machine is overrun, and the record says by how much. The shares
are fractions of the whole (:data:`SHARES`), each group's part of the timing share the same; a phase that finishes
under its share leaves the rest to those after it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from compare.timing.budget_record import BudgetRecord
from compare.timing.significance import MIN_PAIRS
from compare.timing.timer import TimingConfig

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
#: Calls the floor of a step's timing costs: warm-up, two sizing blocks and the minimum samples, one call each at the
#: least; the core comparison's floor has the paired test's rounds (:func:`timing_plan`).
FLOOR_CALLS, CORE_CALLS = 1 + 2 + MIN_SAMPLES, 1 + 2 + MIN_PAIRS
#: The fraction of its part a phase keeps however late it starts (:meth:`Budget.part`).
FLOOR = 0.5
#: The budget's clock (``time.monotonic``: its deadline is compared with that clock's readings; a test's fake clock
#: replaces it here).
CLOCK: Callable[[], float] = time.monotonic


@dataclass
class Budget:
    """A run's budget of ``total_s`` seconds from ``start`` (``time.monotonic``). Phases ask for their part with
    :meth:`part`, say what they cut with :meth:`cut` and run inside :meth:`phase`, which counts their seconds."""

    total_s: float
    start: float = field(default_factory=lambda: CLOCK())
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


def split(part: float, warm_min: float, cold_min: float) -> tuple[float, float]:
    """A group's part of the timing share split between its warm and its cold samples: each first gets what its
    floor costs (``warm_min``: warm-up, sizing blocks and the minimum samples of every step; ``cold_min``: the
    minimum cold samples, each after a flush), the rest in halves; a part too small for both floors is split in
    their proportion. A cold sample pays for its flush (on a CPU with a large last-level cache many times the step),
    so halves alone left every step of a large case without cold samples. With one kind only, it gets the part."""
    if not cold_min:
        return part, 0.0
    if not warm_min:
        return 0.0, part
    if part >= warm_min + cold_min:
        extra = (part - warm_min - cold_min) / 2
        return warm_min + extra, cold_min + extra
    warm = part * warm_min / (warm_min + cold_min)
    return warm, part - warm


@dataclass(frozen=True)
class Step:
    """One step of a timing group as the budget sees it: its cell's label (in cuts), its backend's name, its steady
    seconds a call and whether its backend is in the core comparison (``BackendSpec.core``)."""

    label: str
    name: str
    seconds: float
    core: bool


def timing_plan(
    b: Budget, part: float, cfg: TimingConfig, label: str, steps: Sequence[Step], warm: bool, flush_s: float | None
) -> tuple[TimingConfig, float, list[int], list[int]]:
    """How a group of ``steps`` (``label`` in cuts) spends its ``part`` of the timing share: the timer's settings,
    the cold samples' budget per entrant, and the indices of the steps timed (warm, when ``warm``) and of those timed
    cold (``flush_s``: each cold sample's flush; None: no cold samples); every cut said to ``b``.

    The part is split between the warm samples and the cold (:func:`split`). The core comparison (every core step:
    not the twins) is paid first, the paired test's :data:`~compare.timing.significance.MIN_PAIRS` rounds, over the
    part if it must be (the overrun is said). A twin that cannot fit its floor in what is left is not timed beyond
    its first calls. A group whose slowest step cannot fit the run's warm-up and minimum samples is given fewer
    (down to the floor and one warm-up call). The cold part pays :data:`MIN_SAMPLES` flushed calls of the cheapest
    steps first, as many as fit; the others get no cold samples."""
    everyone = list(range(len(steps)))
    cold_ix, flush = (everyone, flush_s) if flush_s is not None else ([], 0.0)
    core = [i for i in everyone if steps[i].core] if warm else []
    core_s = sum(steps[i].seconds for i in core) * CORE_CALLS
    warm_part, cold_part = split(
        part,
        max(core_s, sum(s.seconds for s in steps) * FLOOR_CALLS) if warm else 0.0,
        sum(steps[i].seconds + flush for i in cold_ix) * MIN_SAMPLES,
    )
    if core_s > warm_part:  # the core comparison first, whatever the budget: an overrun is said, no core cell cut
        if core_s > part:
            b.cut(
                f"{label}: over its part ({part:.3g} s) by {core_s - part:.3g} s, so that "
                f"{', '.join(steps[i].name for i in core)} get the paired test's {MIN_PAIRS} rounds (the budget cuts "
                "no backend of the core comparison)"
            )
        warm_part, cold_part = core_s, max(0.0, part - core_s)
    room, keep = warm_part - core_s, list(core) if warm else list(everyone)
    for i in sorted(everyone, key=lambda i: steps[i].seconds) if warm else []:
        if i in core:
            continue
        if steps[i].seconds * FLOOR_CALLS <= room:
            keep.append(i)
            room -= steps[i].seconds * FLOOR_CALLS
            continue
        b.cut(
            f"{steps[i].label}: not timed beyond its first calls ({steps[i].seconds:.3g} s a step): a twin, and what "
            f"the group's {warm_part:.3g} s of warm samples leave once the core comparison is paid is too little for "
            f"{FLOOR_CALLS} calls"
        )
    timed = sorted(keep)
    cold_ix = [i for i in cold_ix if i in keep]  # a step not timed warm is not timed cold either
    want = cfg.warmup + 2 + cfg.min_samples
    slowest = max((steps[i].seconds for i in timed), default=0.0)
    new = cfg
    if timed and warm and slowest * want * len(timed) > warm_part:
        fewest = min(cfg.min_samples, MIN_PAIRS if core else MIN_SAMPLES)
        new = replace(cfg, warmup=1, min_samples=fewest, budget_s=0.0)
        b.cut(
            f"{label}: {fewest} samples and 1 warm-up call instead of {cfg.min_samples} and "
            f"{cfg.warmup} (its slowest step takes {slowest:.3g} s; the group's part: {warm_part:.3g} s)"
        )
    elif warm:
        budget_s = min(cfg.budget_s, warm_part / max(1, len(timed)))
        if budget_s < cfg.budget_s:
            b.cut(f"{label}: {budget_s:.3g} s of samples per backend instead of {cfg.budget_s:.3g} s")
        new = replace(cfg, budget_s=budget_s)
    # the cold part goes to the cheapest steps first, as many as fit: an even split gave each step of a group whose
    # cold floor slightly exceeds its part too little, and none got cold samples
    cost = {i: (steps[i].seconds + flush) * MIN_SAMPLES for i in cold_ix}
    paid, spent = set(), 0.0
    for i in sorted(cold_ix, key=lambda i: cost[i]):
        if spent + cost[i] <= cold_part:
            paid.add(i)
            spent += cost[i]
    cold_keep = [i for i in cold_ix if i in paid]
    for i in cold_ix:
        if i not in paid:
            why = (
                f"exceed the group's {cold_part:.3g} s of cold samples"
                if cost[i] > cold_part
                else f"do not fit in what is left of the group's {cold_part:.3g} s of cold samples once its "
                f"{len(cold_keep)} cheaper {'step is' if len(cold_keep) == 1 else 'steps are'} paid"
            )
            b.cut(
                f"{steps[i].label}: no cold samples ({MIN_SAMPLES} of {steps[i].seconds:.3g} s a step, each after a "
                f"{flush:.3g} s flush, {why})"
            )
    return new, cold_part / max(1, len(cold_keep)), timed, cold_keep
