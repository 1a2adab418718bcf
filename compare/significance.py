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
3. when both sides have at least :data:`MIN_SAMPLES_FOR_TEST` samples: a one-sided Mann-Whitney U test says the
   new samples tend to be larger with ``p < alpha`` (default 0.01); exact distribution for small tie-free samples,
   else the normal approximation with tie and continuity corrections.

**Faster** is the mirror image (``ratio < 1 / (1 + tol)``, ``new q3 < old q1``, the test the other way); anything
else is **within noise**. Pure Python: no framework, no report.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compare.cases import InputError
from compare.timing import Timing, quartiles

#: A timing record: typed, or as stored (``Timing.to_dict``'s object, or just ``median_s`` and ``iqr_s``).
TimingLike = Timing | Mapping[str, Any]


def _timing(t: TimingLike) -> Timing:
    return t if isinstance(t, Timing) else Timing.from_dict(t)


THRESHOLD = 0.05
NOISE_K = 1.0
ALPHA = 0.01
#: Below this many samples on either side, the rank test is skipped (rules 1 and 2 decide alone).
MIN_SAMPLES_FOR_TEST = 5
#: Largest sample sizes (each side) for which the exact U distribution is used when there are no ties.
EXACT_MAX = 20
#: The verdicts, from ``new``'s point of view.
SLOWER, FASTER, WITHIN_NOISE = "slower", "faster", "within noise"


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


# --- Mann-Whitney U, by hand ---------------------------------------------------------------------------------


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based) of ``values`` and the sizes of their tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


@functools.cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of orderings of ``m`` x's and ``n`` y's (no ties) with each value of U_x = #{(x, y): x > y}."""
    if m == 0 or n == 0:
        return (1,)
    out = [0] * (m * n + 1)
    for u, c in enumerate(_u_counts(m - 1, n)):  # the largest value is an x: it beats all n y's
        out[u + n] += c
    for u, c in enumerate(_u_counts(m, n - 1)):  # the largest value is a y
        out[u] += c
    return tuple(out)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``x`` tends to be larger than ``y``: returns (U_x, p-value).

    Exact when both samples have at most :data:`EXACT_MAX` values and no value repeats; otherwise the normal
    approximation with tie correction and continuity correction.
    """
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    ranks, ties = _ranks([*x, *y])
    u = sum(ranks[:m]) - m * (m + 1) / 2
    if m <= EXACT_MAX and n <= EXACT_MAX and all(t == 1 for t in ties):
        counts = _u_counts(m, n)
        return u, sum(counts[math.ceil(u - 1e-9) :]) / math.comb(m + n, m)
    total = m + n
    tie_term = sum(t**3 - t for t in ties) / (total * (total - 1))
    var = m * n / 12 * ((total + 1) - tie_term)
    if var <= 0:  # every value equal
        return u, 1.0
    z = (u - m * n / 2 - 0.5) / math.sqrt(var)
    return u, 0.5 * math.erfc(z / math.sqrt(2))


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
    verdict: str  # SLOWER, FASTER or WITHIN_NOISE

    @property
    def regression(self) -> bool:
        return self.verdict == SLOWER

    @property
    def significant(self) -> bool:
        return self.verdict != WITHIN_NOISE


def compare_timing(
    old: TimingLike, new: TimingLike, threshold: float = THRESHOLD, k: float = NOISE_K, alpha: float = ALPHA
) -> TimingVerdict:
    """Apply the module's rule to two timing records (``median_s`` and ``iqr_s``, ``samples_s`` when present)."""
    a, b = spread(old), spread(new)
    if a.median <= 0 or b.median <= 0:
        raise InputError(f"a timing median must be positive, got {a.median} and {b.median}")
    ratio = b.median / a.median
    tol = max(threshold, k * math.hypot(a.rel_iqr, b.rel_iqr))
    p_slower = p_faster = None
    if min(len(a.samples), len(b.samples)) >= MIN_SAMPLES_FOR_TEST:
        p_slower = mann_whitney_greater(b.samples, a.samples)[1]
        p_faster = mann_whitney_greater(a.samples, b.samples)[1]
    if ratio > 1 + tol and b.q1 > a.q3 and (p_slower is None or p_slower < alpha):
        verdict = SLOWER
    elif ratio < 1 / (1 + tol) and b.q3 < a.q1 and (p_faster is None or p_faster < alpha):
        verdict = FASTER
    else:
        verdict = WITHIN_NOISE
    return TimingVerdict(a, b, ratio, tol, p_slower, p_faster, verdict)


def speedup(baseline: TimingLike, timing: TimingLike) -> tuple[float, str]:
    """``baseline median / this median`` and the verdict of ``timing`` against ``baseline`` ("faster": it is)."""
    v = compare_timing(baseline, timing)
    return 1.0 / v.ratio, v.verdict
