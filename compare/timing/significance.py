"""When is one timing really different from another? The one significance rule of every derived figure.

``compare diff`` (old run against new), the speedups against the baseline in the report, the time fusion is
measured to save, and the calls a compile takes to pay back all ask the same question of two timing records, and
all answer it here, so that a difference inside the runs' own noise is never printed as a number.

Each side's quartiles (q1, median, q3) come from its per-sample times ``timing["samples_s"]`` when it has at least
two, else from ``median_s`` -/+ ``iqr_s``/2. With ``ratio = new median / old median`` and the combined relative
spread ``noise = sqrt((old IQR / old median)^2 + (new IQR / new median)^2)``, the band is
``tol = max(threshold, k * noise)`` (defaults: threshold 5%, k 1). ``new`` is **slower** only if all of these hold:

1. ``ratio > 1 + tol``: slower by more than the threshold and more than the runs' own spread;
2. ``new q1 > old q3``: the middle halves of the two sample sets do not overlap;
3. when both sides have at least :data:`MIN_SAMPLES_FOR_TEST` samples: a one-sided Mann-Whitney U test
   (``scipy.stats.mannwhitneyu``, :func:`mann_whitney_greater`) says the new samples tend to be larger with
   ``p < alpha`` (default 0.01). ``method="exact"`` when neither side has more than :data:`EXACT_MAX` samples and no
   value repeats: the exact U distribution, cheap at these sizes, holds only without ties. Else ``"asymptotic"``:
   the normal approximation with tie and continuity corrections, which is accurate there.

**Faster** is the mirror image (``ratio < 1 / (1 + tol)``, ``new q3 < old q1``, the test the other way); anything
else is **within noise**.

**Paired** (both timings from one interleaved group, ``compare.timing.timer.measure_interleaved``): rules 2 and 3 are
replaced by one exact test that respects the time structure. Each round gives one difference
``d = log(new sample) - log(old sample)``; under "no difference" the random order within each round makes every
``d`` as likely to have either sign whatever the load did over time, so the Wilcoxon signed-rank statistic's exact
sign-flip distribution gives the p-value: valid at the nominal rate under drift, bursts and bimodal samples, which
Mann-Whitney on two separate windows is not (it takes time-correlated samples as independent). Rule 1 stays, with
the noise of the ratio itself: ``noise`` is the IQR of the ``d`` (a relative spread, as the log differences are),
not the two sides' spreads, which hold the load's drift both sides shared and the pairing takes out. On a 2-core
CI machine two sides whose rounds each spread +/-27% made a band of +/-38% that hid a second thread's gain, slower
in 10 of 10 rounds.
The test is ``scipy.stats.wilcoxon(d, method="exact")`` (:func:`signed_rank_greater`; zero ``d`` dropped) for every
``n``: cheap at a hundred rounds, where scipy's ``"auto"`` would turn to the normal approximation; with tied ``|d|``
``"auto"`` would run a permutation test (seconds at 13 pairs) or the normal approximation. Tied ``|d|`` (the timer's
resolution) get mid-ranks, and scipy takes the tail of the tie-free distribution from W+ rounded down, not the exact
distribution of the sign flips of those mid-ranks: the smallest p stays ``2^-n`` and p is the exact one when every
``d`` has one sign; with mixed signs it is mostly a little larger (more cautious), rarely a little smaller. Fewer
than :data:`MIN_PAIRS` rounds can never reach ``alpha``: the test is not run and the verdict is **not tested** (never
"within noise", which says a test ran and found no difference); the verdict's ``pairs`` says how many rounds there
were.
Timings of two runs (``compare diff``) or of separate windows (tensor-parallel groups, sweep cells) cannot be paired:
they get the unpaired rule, and the verdict's ``design`` says which one was used.

**Between processes** (``ab``, ``diff``, ``history``: the sides are other processes). Rounds interleaved inside one
pair of processes cannot take out what differs between the processes themselves (XLA's thread pool placement, the
memory layout, the compile): A/A of the jitted JAX backend on ``cpu-mlp`` on a quiet 2-core VM, one worker a side, had
one worker at 32-34 ms and the other at about 40 ms for a whole trial, and the paired test called 3 of 8 trials
different (0.79x to 1.21x at p < 0.001). There the process is the unit of replication:

- ``ab`` runs K processes a side (``--workers``), all in one interleaved group. :func:`compare_processes` takes each
  process's median, ``a_i`` and ``b_i`` their logs, and calls B **slower** only if both hold:

  1. ``ratio = exp(mean(b) - mean(a)) > 1 + tol``, ``tol = max(threshold, k * spread)``, ``spread`` the between-process
     spread: the largest relative range ``max / min - 1`` of the per-process medians within one side
     (:func:`process_spread`). A side whose processes sit at 32 and 40 ms makes a band of 25%, not a finding;
  2. the one-sided two-sample t-test on the log medians (``scipy.stats.ttest_ind``, pooled variance, ``2K - 2``
     degrees of freedom) at ``p < alpha``: the difference of the sides' means against the between-process
     variance, with the processes as the samples.

  **Faster** is the mirror image. False-alarm rate and power, by simulation (200,000 trials of K = 3 a side, each
  process's log median drawn around its side's level): A/A calls B slower in 1.0% of trials with a lognormal
  between-process SD of 10% (rule 2's nominal rate) and 0.07% with 2% (rule 1 takes it lower); 1.6% (``2^-6``) where
  each process falls on one of two levels 25% apart with equal chance (32 or 40 ms: all of one side on the lower
  level, all of the other on the upper, which no rule on 3 + 3 processes can tell from a difference; K = 4: 0.4%,
  K = 2: 6%). Faster is the same. Power (called slower): 1.84x (one thread of two) at a 10% between-process SD 99%,
  1.5x at 10% 81%, 1.25x at 5% 88%, 1.10x at 2% 92% (K = 2: 53%, 29%, 34%, 37%). Measured A/A (``ab --preset
  cpu-mlp`` with the eager torch and jitted JAX backends, 3 a side, 4 trials on the 2-core VM while others held 50-75%
  of its cores): no pair called; the sides' per-process ranges were 5-42% (JAX) and 3-25% (torch-eager) there.
  Fewer than :data:`MIN_PROCESSES` processes a side measure no spread: the within-process rule, then the floor.
- ``diff`` and ``history`` compare runs of one process each. Where a history holds :data:`MIN_RUNS` or more earlier
  runs of the same build (commit and package versions) of a cell, their relative range is the spread
  (``history``); else the spread is not measured and no difference at or below :data:`BETWEEN_FLOOR` is called
  (:func:`beyond_processes`). The floor is this project's measured A/A between-process spread on its 2-core
  development VM (:data:`BETWEEN_FLOOR`'s note): it depends on the machine and the backend, and bounds what one run
  against another can tell there.

No framework and no report: the rank tests are ``scipy.stats``', imported on first use (about a second).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compare.formats.codec import from_json
from compare.problem.cases import InputError
from compare.timing.timer import INTERLEAVED, Timing, quartiles

#: A timing record: typed, or as stored (its JSON, or just ``median_s`` and ``iqr_s``).
TimingLike = Timing | Mapping[str, Any]


def _timing(t: TimingLike) -> Timing:
    return t if isinstance(t, Timing) else from_json(Timing, t)


THRESHOLD = 0.05
NOISE_K = 1.0
ALPHA = 0.01
#: Below this many samples on either side, the rank test is skipped (rules 1 and 2 decide alone).
MIN_SAMPLES_FOR_TEST = 5
#: Largest sample sizes (each side) for which the exact U distribution is used when there are no ties.
EXACT_MAX = 20
#: The verdicts, from ``new``'s point of view. ``NOT_TESTED``: paired, with too few rounds for the test to run.
SLOWER, FASTER, WITHIN_NOISE, NOT_TESTED = "slower", "faster", "within noise", "not tested"
#: The designs a verdict comes from: samples paired by round (one interleaved group) or two separate windows.
PAIRED, UNPAIRED = "paired by round", "unpaired"
#: Below this many common rounds the paired test is not run (2^-7 < 0.01: 8 rounds is the least that can reach it).
MIN_PAIRS = 8
#: The design of a verdict over K processes a side (``ab --workers K``, :func:`compare_processes`).
PROCESSES = "between processes"
#: The fewest processes a side whose spread :func:`process_spread` measures.
MIN_PROCESSES = 2
#: The fewest earlier runs of one build whose spread the history measures (``compare.report.history``).
MIN_RUNS = 3
#: The relative difference between two single processes (two runs, or one worker a side) at or below which no
#: difference is called where the between-process spread is not measured. Where it comes from: A/A between processes
#: of one build on the project's 2-core development VM, quiet, the jitted JAX backend on ``cpu-mlp`` fwd: one worker at
#: 32-34 ms and the other at 40 ms for whole trials (called 0.79x, 0.82x and 1.21x: up to 27% apart), and two identical
#: ``run --history`` runs 34.2 -> 39.4 ms (15%); rounded up. Busy (others holding 50-75% of both cores), the range of
#: three workers of one side reached 42% for JAX and 25% for torch-eager in 3 trials: a busy machine's spread is
#: wider still, and there the load rule (``compare.results.load``) already makes such a change ambiguous. It depends
#: on the machine and the backend: a history with MIN_RUNS runs of one build measures it instead.
BETWEEN_FLOOR = 0.30


@dataclass(frozen=True)
class Spread:
    """Quartiles, extremes and samples of one side's timing, in seconds per call."""

    q1: float
    median: float
    q3: float
    samples: tuple[float, ...]

    @property
    def rel_iqr(self) -> float:
        return (self.q3 - self.q1) / self.median if self.median > 0 else math.inf


def spread(t: TimingLike) -> Spread:
    """The :class:`Spread` of a timing record (samples when present, else median and IQR)."""
    t = _timing(t)
    samples = tuple(float(x) for x in t.samples_s)
    if len(samples) >= 2:
        q1, med, q3 = quartiles(sorted(samples))
        return Spread(q1, med, q3, samples)
    med, iqr = float(t.median_s), float(t.iqr_s or 0.0)
    return Spread(med - iqr / 2, med, med + iqr / 2, samples)


# --- the rank tests (scipy.stats) -----------------------------------------------------------------------------


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``x`` tends to be larger than ``y``: (U_x, p-value), exact or asymptotic
    as the module docstring says."""
    from scipy import stats  # on first use: about a second to import, and the harness imports this module

    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    exact = max(m, n) <= EXACT_MAX and len({*x, *y}) == m + n
    res = stats.mannwhitneyu(x, y, alternative="greater", method="exact" if exact else "asymptotic")
    return float(res.statistic), float(res.pvalue)


def signed_rank_greater(d: Sequence[float]) -> tuple[float, float]:
    """One-sided Wilcoxon signed-rank test that the differences ``d`` tend to be positive: (W+, p-value).

    ``scipy.stats.wilcoxon`` with ``method="exact"`` on the ``n`` non-zero ``d`` (zeros dropped here, as Wilcoxon
    did): the p-value is the share of the ``2^n`` sign flips of the ranks 1..n whose positive rank sum reaches W+.
    Tied ``|d|`` get mid-ranks, and scipy rounds a half-integer W+ down before taking that tail."""
    from scipy import stats

    nonzero = [x for x in d if x != 0]
    if not nonzero:  # no information: p = 1 (scipy would answer NaN, with a warning)
        return 0.0, 1.0
    res = stats.wilcoxon(nonzero, alternative="greater", method="exact")
    return float(res.statistic), float(res.pvalue)


def _iqr(xs: Sequence[float]) -> float:
    """The interquartile range of ``xs`` (``quartiles``' interpolation); of log differences, a relative spread."""
    q1, _, q3 = quartiles(sorted(xs))
    return q3 - q1


def paired_differences(old: Timing, new: Timing) -> list[float] | None:
    """``log(new) - log(old)`` of every round both timed, when both come from one interleaved group; else None."""
    if old.design != INTERLEAVED or new.design != INTERLEAVED or not old.group or old.group != new.group:
        return None
    by_round = dict(zip(old.rounds, old.samples_s, strict=True))
    return [
        math.log(t) - math.log(by_round[r]) for r, t in zip(new.rounds, new.samples_s, strict=True) if r in by_round
    ]


# --- verdicts --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingVerdict:
    """How ``new`` compares with ``old``: ratio, the noise band, the rank test's p-values and the verdict."""

    old: Spread
    new: Spread
    ratio: float
    tol: float
    p_slower: float | None
    p_faster: float | None
    verdict: str  # SLOWER, FASTER, WITHIN_NOISE or NOT_TESTED (paired, fewer than MIN_PAIRS rounds)
    design: str = UNPAIRED  # PAIRED, UNPAIRED or PROCESSES: which rule decided
    pairs: int | None = None  # PAIRED: the rounds both sides timed; None when unpaired
    #: across processes (:func:`beyond_processes`, :func:`compare_processes`): the between-process band, relative
    #: (the measured spread, or :data:`BETWEEN_FLOOR`); None: not a comparison across processes
    between: float | None = None
    #: whether ``between`` was measured (processes a side, earlier runs of the build) or is the floor
    between_measured: bool = False

    @property
    def regression(self) -> bool:
        return self.verdict == SLOWER

    @property
    def significant(self) -> bool:
        return self.verdict in (SLOWER, FASTER)

    def said(self, figure: str) -> str:
        """``figure`` (the difference as a number) where the verdict is significant, else what was found: "within
        noise" (a test ran) or "not tested (N rounds)" (too few rounds for the paired test to run)."""
        if self.significant:
            return figure
        if self.verdict == NOT_TESTED:
            return not_tested(self.pairs)
        return WITHIN_NOISE + (f" ({self.between_words()})" if self.between is not None else "")

    def between_words(self) -> str:
        """What bounded the comparison across processes: ``between-process spread 12%`` or ``between-process spread
        not measured: floor 30%``."""
        if self.between is None:
            return ""
        if self.between_measured:
            return f"between-process spread {self.between:.0%}"
        return f"between-process spread not measured: floor {self.between:.0%}"


def not_tested(pairs: int | None) -> str:
    """The words for a paired comparison whose test could not run: how many rounds there were."""
    return f"{NOT_TESTED} ({pairs} rounds)"


def compare_timing(
    old: TimingLike, new: TimingLike, threshold: float = THRESHOLD, k: float = NOISE_K, alpha: float = ALPHA
) -> TimingVerdict:
    """Apply the module's rule to two timing records (``median_s`` and ``iqr_s``, ``samples_s`` when present): the
    paired rule when both come from one interleaved group, else the unpaired one."""
    a, b = spread(old), spread(new)
    if a.median <= 0 or b.median <= 0:
        raise InputError(f"a timing median must be positive, got {a.median} and {b.median}")
    ratio = b.median / a.median
    p_slower = p_faster = None
    d = paired_differences(_timing(old), _timing(new))
    tol = max(threshold, k * (_iqr(d) if d else math.hypot(a.rel_iqr, b.rel_iqr)))
    if d is not None:
        if len(d) < MIN_PAIRS:
            return TimingVerdict(a, b, ratio, tol, None, None, NOT_TESTED, PAIRED, len(d))
        p_slower, p_faster = signed_rank_greater(d)[1], signed_rank_greater([-x for x in d])[1]
    elif min(len(a.samples), len(b.samples)) >= MIN_SAMPLES_FOR_TEST:
        p_slower = mann_whitney_greater(b.samples, a.samples)[1]
        p_faster = mann_whitney_greater(a.samples, b.samples)[1]
    # paired, the signed-rank test replaces the overlap rule (and always runs); unpaired, both hold
    if ratio > 1 + tol and (d is not None or b.q1 > a.q3) and (p_slower is None or p_slower < alpha):
        verdict = SLOWER
    elif ratio < 1 / (1 + tol) and (d is not None or b.q3 < a.q1) and (p_faster is None or p_faster < alpha):
        verdict = FASTER
    else:
        verdict = WITHIN_NOISE
    if d is not None:
        return TimingVerdict(a, b, ratio, tol, p_slower, p_faster, verdict, PAIRED, len(d))
    return TimingVerdict(a, b, ratio, tol, p_slower, p_faster, verdict)


def speedup(baseline: TimingLike, timing: TimingLike) -> tuple[float, TimingVerdict]:
    """``baseline median / this median`` and the verdict of ``timing`` against ``baseline`` ("faster": it is)."""
    v = compare_timing(baseline, timing)
    return 1.0 / v.ratio, v


# --- across processes ------------------------------------------------------------------------------------------


def process_spread(sides: Sequence[Sequence[float]]) -> float | None:
    """The between-process spread of per-process medians (seconds), one sequence a side: the largest relative range
    ``max / min - 1`` over the sides with :data:`MIN_PROCESSES` or more; None when no side has."""
    ranges = [max(m) / min(m) - 1 for m in sides if len(m) >= MIN_PROCESSES]
    return max(ranges) if ranges else None


def beyond_processes(v: TimingVerdict, spread: float | None, k: float = NOISE_K) -> TimingVerdict:
    """``v`` (one process against another) with a difference called only beyond the between-process band: ``k *
    spread`` when measured, else :data:`BETWEEN_FLOOR` (module docstring); a difference inside it is within noise."""
    band = BETWEEN_FLOOR if spread is None else k * spread
    inside = v.significant and max(v.ratio, 1 / v.ratio) <= 1 + band
    return replace(v, verdict=WITHIN_NOISE if inside else v.verdict, between=band, between_measured=spread is not None)


def _process_spread(medians: Sequence[float]) -> Spread:
    q1, med, q3 = quartiles(sorted(medians))
    return Spread(q1, med, q3, tuple(medians))


def compare_processes(
    old: Sequence[TimingLike],
    new: Sequence[TimingLike],
    threshold: float = THRESHOLD,
    k: float = NOISE_K,
    alpha: float = ALPHA,
) -> TimingVerdict:
    """``new``'s processes against ``old``'s, one timing each (module docstring, "Between processes"): with
    :data:`MIN_PROCESSES` or more a side, the t-test on the log medians beyond the between-process band (``old`` and
    ``new`` in the verdict: the quartiles of the per-process medians; ``ratio`` the ratio of their geometric means);
    with fewer, the first timings by :func:`compare_timing` (paired when they share a group) beyond the floor."""
    if not old or not new:
        raise ValueError("compare_processes needs a timing a side")
    if min(len(old), len(new)) < MIN_PROCESSES:
        return beyond_processes(compare_timing(old[0], new[0], threshold, k, alpha), None, k)
    from scipy import stats

    ma, mb = ([spread(t).median for t in side] for side in (old, new))
    if min(ma + mb) <= 0:
        raise InputError(f"a timing median must be positive, got {ma} and {mb}")
    la, lb = np.log(ma), np.log(mb)
    ratio = float(np.exp(lb.mean() - la.mean()))
    between = process_spread([ma, mb])
    assert between is not None
    tol = max(threshold, k * between)

    def p(way: str) -> float:  # NaN when no side varies at all: no evidence either way
        got = float(stats.ttest_ind(lb, la, alternative=way).pvalue)
        return 1.0 if math.isnan(got) else got

    p_slower, p_faster = p("greater"), p("less")
    if ratio > 1 + tol and p_slower < alpha:
        verdict = SLOWER
    elif ratio < 1 / (1 + tol) and p_faster < alpha:
        verdict = FASTER
    else:
        verdict = WITHIN_NOISE
    a, b = _process_spread(ma), _process_spread(mb)
    return TimingVerdict(a, b, ratio, tol, p_slower, p_faster, verdict, PROCESSES, None, between, True)
