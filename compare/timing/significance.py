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

No framework and no report: the rank tests are ``scipy.stats``', imported on first use (about a second).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    design: str = UNPAIRED  # PAIRED or UNPAIRED: which rule decided
    pairs: int | None = None  # PAIRED: the rounds both sides timed; None when unpaired

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
        return WITHIN_NOISE if self.verdict == WITHIN_NOISE else not_tested(self.pairs)


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
