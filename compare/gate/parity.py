"""Parity rules: is a backend's tensor as close to the float64 golden as its dtype allows, and if not, how far off?

Every line is measured against ``y_plain``, the plain same-dtype computation of ``compare.problem.reference`` (float32
accumulation in a fixed order, the activation in float32 op by op, every materialised tensor rounded to the dtype:
the same bits on every machine) on the same case. With ``e = y - y_ref`` (the backend's error against the float64
reference), ``e_p = y_plain - y_ref``, ``u = 2**-p`` the dtype's unit roundoff and ``Z`` = :data:`Z_SCORE`, each check
puts a tensor in one of three tiers, and the tensor takes its worst check's:

**pass**: within what a plain computation in the dtype does. **deviates**: a real, measured difference that an
honest implementation can have (more error than the plain computation by a stated factor, or a systematic bias
beyond noise but below a unit roundoff), reported with its numbers and, where one is pinned down, its cause.
**fail**: a different function, beyond anything rounding explains.

``max``
    pass ``max|e| <= 8 max(max|e_p|, max|e_env|) + u max|y_ref|`` (:data:`MAX_FACTOR`: the largest error is an
    extreme of the data and moves by several times between seeds; a lower line would call a deviation on some seeds
    and not others); fail beyond ``8 x max(2 max|e_p| + u max|y_ref|, max|e_env|)``. ``e_env`` is the error of the
    plain computation's envelope twin (:class:`Plain`: its float32 tanh/exp 4 ulp off, in float32 cases of a model
    with an activation; elsewhere ``e_p`` itself): GELU's derivative is ill-conditioned where tanh is near -1, and
    there an ordinary float32 library moves a few elements by many times the plain computation's error, which is
    still a plain computation.
``rms``
    pass ``rms(e) <= 2.5 max(rms(e_p), rms(e_env)) + 0.1 u rms(y_ref)`` (:data:`RMS_FACTOR`, the stated factor of
    "more error than a plain computation"); fail beyond ``8 x max(2 rms(e_p) + u rms(y_ref), rms(e_env))``. It sees
    an error spread thin over every element, which the max check forgives.
``shift``
    the mean signed error ``mean(e)``, judged by its distance ``d`` from the interval between 0 and the plain
    computation's own ``mean(e_p)`` (an honest result's bias lies between a correctly rounded one's, none, and the
    plain computation's, which rounds more often than a fused kernel). Pass ``d <= Z se(d)``; fail
    ``d > Z se(d) + L rms(y_ref)`` with ``L`` = :func:`bias_fail_line` (one unit roundoff of the dtype plus 8 float32
    ulps: what a float32 transcendental 4 ulp off all one way can add). A constant offset far below one ulp per
    element is still many standard errors from rounding noise.
``scale``
    the mean signed *relative* error, weighted by ``y_ref^2`` so that elements near zero do not dominate: the
    least-squares slope ``b`` of ``e`` on ``y_ref`` (``y = (1 + b) y_ref + noise``), judged by its distance ``d``
    from the interval between 0 and the plain computation's own ``b_p``: pass within ``Z se(d)`` (the noise of
    both). The fail line is judged *paired*: ``b_p`` plus the slope of ``y - y_plain`` on ``y_ref``, whose noise is
    only what the backend's rounding adds to the plain computation's (not the plain computation's own error, which on
    heavy-tailed float32 inputs moves a slope by 0.7 unit roundoffs), fails beyond ``Z se + S u`` from the interval
    (``S`` = :data:`SCALE_FAIL_UNITS`): a wrong scale of 1.5 unit roundoffs fails in every dtype. In float32 cases of
    a model with an activation, the shapes of a float32 tanh / exp 4 ulp off all one way (:class:`Plain`'s
    ``signature``) are fitted beside that slope: such a transcendental moves y's scale by up to 2.3 unit roundoffs
    (a deviation), and the fit tells it from a wrong scale (it measures the bias in ulps and names it as a cause). An
    output 1% too small in bf16 is 2.6 unit roundoffs off: it fails; jax's bf16 GELU with its constants rounded to
    bf16 is 0.016% low: it deviates.
``where``
    where the error sits: ``w = rms(e over the tenth of elements with the smallest |y_ref|) / rms(e)``
    (:func:`small_ref_share`). Rounding error scales with ``|y_ref|``, so an honest result's error is thinnest
    there; an error that is largest there is one that did not come from rounding (the smallest outputs zeroed,
    flushed or cut off). Judged only when the rms error is beyond its pass line (an error at noise level never
    trips it, whatever its shape) and the tenth holds :data:`WHERE_MIN` elements or more: then fail beyond
    :data:`WHERE_FAIL`; otherwise pass. It has no deviates tier.
``dtype``
    every value is representable in the case dtype (a backend that returns the float64 answer, or computes in a
    wider type than it reports, cannot fake this), and the values use the dtype's precision: an output whose values
    carry no more significand bits than the next narrower type (:data:`NARROWER_BITS`; bf16 math in a float16 or
    float32 case) was computed in that type. Either fails.

Standard errors are cluster-robust: rounding errors are not independent across a tensor (an error in ``h[t, :]``
reaches every element of ``y[t, :]``; one in ``h[:, k]`` every element of ``ddown[:, k]``), so each statistic's
variance is estimated four ways (elements independent, rows as clusters, columns as clusters, both at once: Cameron,
Gelbach and Miller's two-way estimate; a tensor is viewed as ``[-1, last dim]``) and the largest is used. Checked
against the spread over seeds on heavy-tailed inputs (``tests/test_variants.py``: the z-scores of unbiased honest
variants have a spread near 1). ``Z = 5`` is fixed in advance (a two-sided false-alarm probability near 6e-7 per
check under the normal approximation). Where the lines sit is checked both ways: honest implementation differences
(``tests/variants.py``: other accumulation orders, FMA, transcendentals 4 ulp off, the activation in the dtype,
float32 intermediates) never fail, in every dtype and mode; the negative controls (``tests/test_controls.py``) do.

NaN or Inf in the backend's tensor fails. A reference whose scale is tiny next to the dtype's ``atol``
(``max|y_ref| < 100 * atol``) is refused as degenerate (it could not tell a right answer from zeros), and so is a
case whose plain computation is not finite or whose reference overflows the dtype (:func:`check_plain`). A case with a
tensor of fewer than :data:`MIN_TERMS` elements has no standard error at all: it is refused before anything runs
(:func:`check_judgeable`).

What the gate cannot see: an error below the plain computation's own noise at this case's size (how small that is
per case, dtype and tensor is measured by ``compare.gate.resolution`` and printed in the report); a wrong value in a few
elements below 8x the plain computation's worst error (a deviation at most, not a failure); a bias below a unit
roundoff of the dtype is a deviation, never a failure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import ml_dtypes
import numpy as np

from compare.formats.codec import LATER
from compare.gate.stream import (
    Clustered,
    Design,
    blocks,
    columns,
    dot,
    kth_smallest_abs,
    matrix_shape,
    rows64,
    rows_raw,
)
from compare.problem.cases import Case, InputError
from compare.problem.reference import SIGNIFICAND_BITS, TRANSCENDENTAL_ERROR_ULPS, round_to_dtype

#: ``torch.testing.assert_close`` default ``atol`` per dtype: the scale below which a reference is degenerate.
ATOL: dict[str, float] = {"float32": 1e-5, "bfloat16": 1e-5, "float16": 1e-5}
#: The rms check's pass line: a backend's rms error may be this many times the plain computation's (plus a tenth of
#: a unit roundoff of rms(ref), for a tensor the plain computation gets exactly). The stated factor of "more error
#: than a plain computation": above it a tensor deviates. Set between what honest variants and a plain eager
#: framework do (at most 1.83x: the activation op by op in the dtype) and what reducing a token sum in the low dtype
#: does (2.8x and more on a hundred tokens, growing with the count), measured over 10 seeds (tests/test_seeds.py).
RMS_FACTOR = 2.5
#: The max check's pass line: no element worse than this many times the plain computation's worst, plus one unit
#: roundoff of max|ref|. The largest error is an extreme of the data: between seeds it moves by several times where
#: the rms does not, so the line sits high enough that a deviation it calls is one on every seed.
MAX_FACTOR = 8.0
#: The base the max and rms fail lines multiply: ``PLAIN_FACTOR`` x the plain computation's error plus a unit
#: roundoff of the scale, or the envelope twin's error where that is larger.
PLAIN_FACTOR = 2.0
#: Standard errors a bias (shift or scale) may lie from the plain computation's own and still pass.
Z_SCORE = 5.0
#: The fail line of the max and rms checks, in multiples of their base: no honest implementation difference
#: (another accumulation order, FMA, a transcendental off by 4 ulp, the activation evaluated in the dtype with its
#: constants rounded) comes near it (``tests/test_variants.py`` measures how near they come).
FAIL_FACTOR = 8.0
#: The fail line of the shift (the mean, relative to rms(ref)): this many unit roundoffs of the case dtype ...
BIAS_FAIL_UNITS = 1.0
#: ... plus this many float32 ulps (``2**-23`` each): what a float32 transcendental off by up to 4 ulp may add.
TRANSCENDENTAL_ULPS = 8.0
#: The fail line of the scale, judged paired (``y - plain``, a transcendental's signature fitted beside it): this many
#: unit roundoffs of the dtype, plus 5 standard errors, beyond the interval between 0 and the plain computation's own
#: scale. A wrong scale of 1.5 unit roundoffs lies 1.07 and more beyond that interval on every committed case (the
#: least on odd's float32 SwiGLU, whose plain computation is itself 0.83 low) and 1.2 to 2.5 times its fail line; the
#: honest variants reach at most 0.18 of theirs (tests/test_calibration.py). Rounding toward zero instead of to
#: nearest would move a scale by about 0.6: a deviation.
SCALE_FAIL_UNITS = 0.75
#: Multiplies every clustered standard error: calibrated against the spread over seeds (``tests/test_variants.py``).
SE_INFLATION = 1.0
#: The verdicts, best first.
TIERS: tuple[str, ...] = ("pass", "deviates", "fail")
DEGENERATE_FACTOR = 100.0
#: Largest finite value of each dtype: a reference beyond it cannot be represented, so it is refused.
DTYPE_MAX: dict[str, float] = {
    "float32": float(np.finfo(np.float32).max),
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}
#: The ``where`` check looks at the ``ceil(n / WHERE_PART)`` elements with the smallest ``|ref|`` (the smallest tenth).
WHERE_PART = 10
#: The ``where`` check's fail line: ``rms(e over the smallest tenth of |ref|) / rms(e)`` beyond this fails, when the
#: rms error is also beyond its pass line. Measured on ``y`` of every committed case (tests/test_calibration.py):
#: the smallest tenth of the plain output zeroed gives 2.99 to 3.16 in every dtype; the honest variants
#: (tests/variants.py) and the plain computation give 0.04 to 1.24. Rounding error grows with ``|ref|``, so honest
#: errors sit below 1 on most tensors. What it cannot see: a wrong value in the small elements that is no larger
#: than rounding error elsewhere (it needs the rms error past its pass line), an error spread evenly over every
#: element (ratio 1: that is the rms check's), and a wrong set of elements that are not among the smallest tenth.
WHERE_FAIL = 2.0
#: The ``where`` check is judged only when the smallest tenth holds at least this many elements (a tensor of 631 or
#: more): over fewer, one element decides the ratio. A bias gradient summed over the tokens in a 16-bit dtype (96
#: elements: JAX's GPT-2 MLP ``db2`` on ``tiny`` float16) has its errors spread evenly (ratio 1.0 at the median,
#: 1.61 the largest of 600 fresh draws), but once put its largest error on one of the 10 smallest values: 2.17, a
#: fail in CI. What it gives up: the ``where`` check on such small tensors (max and rms still judge them).
WHERE_MIN = 64
#: Fewest terms a sample variance needs (``g / (g - 1)``): over fewer elements (or clusters: rows, columns) the
#: clustered variance is 0, so a tensor of fewer elements has shift and scale standard errors of 0 and every bias
#: lies infinitely many of them from noise (a pass line of 0). :func:`check_judgeable` refuses such a case up front.
MIN_TERMS = 2


class DegenerateGolden(ValueError):
    """The reference is too small for its tolerance to mean anything."""


class UnusableCase(ValueError):
    """The plain computation or the reference of a case is not finite in its dtype: nothing can be judged."""


@dataclass(frozen=True)
class Check:
    """One statistic of one tensor: its value (for the signed ones, the absolute difference from the plain
    computation's), the plain computation's, the pass line (``bound``), the fail line (``fail``), the standard error
    (shift and scale) and the tier (``pass``, ``deviates``, ``fail``)."""

    name: str
    value: float
    plain: float
    bound: float
    fail: float
    tier: str
    se: float | None = None
    signed: float | None = None

    @property
    def ratio(self) -> float:
        if self.bound > 0:
            return self.value / self.bound
        return 0.0 if self.value == 0 else math.inf


def _tier(value: float, bound: float, fail: float) -> str:
    return "pass" if value <= bound else ("deviates" if value <= fail else "fail")


@dataclass(frozen=True)
class TensorParity:
    """Numbers for one tensor. ``max_rel_err`` is norm-wise: ``max_abs_err / max|y_ref|``; ``bound`` and ``ratio`` are
    the max check's pass line and value/line; ``worst_ratio`` is the largest value/pass line over every check (how
    close the tensor came to leaving ``pass``). ``tier`` is the worst check's: ``pass``, ``deviates`` or ``fail``;
    ``failed`` names the checks in the fail tier, ``deviated`` those in the deviates tier; ``*_fail`` are the fail
    lines; ``cause`` is what the checks measured about a deviation or failure (:func:`cause`; empty on a pass).
    ``passed`` is ``tier == "pass"``."""

    tensor: str
    n: int
    max_abs_err: float
    max_rel_err: float
    bound: float
    ratio: float
    plain_err: float
    rms_err: float
    rms_plain: float
    rms_bound: float
    mean_err: float
    mean_plain: float
    mean_se: float
    mean_bound: float
    scale_err: float
    scale_plain: float
    scale_se: float
    scale_bound: float
    not_representable: int
    worst_ratio: float
    worst_index: list[int]
    nonfinite: int
    passed: bool
    failed: list[str]
    why: str
    tier: str = "fail"
    deviated: list[str] = field(default_factory=list)
    max_fail: float = math.nan
    rms_fail: float = math.nan
    mean_fail: float = math.nan
    scale_fail: float = math.nan
    cause: str = ""
    #: ``rms(e over the smallest tenth of |ref|) / rms(e)`` (the ``where`` check); None in documents written before it
    #: (and then left out of the JSON, as it was).
    where_ratio: float | None = field(default=None, metadata=LATER)
    #: The paired scale's distance beyond the honest interval, judged against ``scale_fail`` (the ``scale`` check);
    #: None in documents written before it.
    scale_paired: float | None = field(default=None, metadata=LATER)

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"unknown parity tier {self.tier!r}; known: {', '.join(TIERS)}")


def judged_shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor the gate can judge on ``case``, by the names ``compare.problem.reference`` gives
    them: the output ``y``, and the gradients ``dx`` and ``d<weight>`` of each weight (``Case.weight_shapes``)."""
    shapes: dict[str, tuple[int, ...]] = {"y": case.output_shape(), "dx": case.input_shape()}
    shapes.update({f"d{k}": shape for k, shape in case.weight_shapes().items()})
    return shapes


def check_judgeable(case: Case, tensors: Iterable[str] | None = None) -> Case:
    """Return ``case`` if each of its ``tensors`` the gate judges (default: every one, :func:`judged_shapes`) has at
    least :data:`MIN_TERMS` elements; else raise an :class:`~compare.problem.cases.InputError` naming the case, the
    tensor and the smallest size allowed (the gate's verdict on a smaller one would be meaningless)."""
    shapes = judged_shapes(case)
    for name in shapes if tensors is None else tensors:
        n = math.prod(shapes[name])
        if n < MIN_TERMS:
            raise InputError(
                f"case {case.name} is too small for the parity gate: its tensor {name!r} has shape "
                f"{list(shapes[name])}, {n} element{'' if n == 1 else 's'}; every tensor the gate judges needs at "
                f"least {MIN_TERMS} elements (a standard error needs {MIN_TERMS} terms: with fewer, any bias is "
                "infinitely many standard errors from noise); use a larger shape"
            )
    return case


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


#: The next narrower significand below each dtype's (bits, with the implicit one): float16's 11 below float32's 24,
#: bfloat16's 8 below float16's 11, fp8 e4m3's 4 below bfloat16's 8.
NARROWER_BITS: dict[str, int] = {"float32": 11, "float16": 8, "bfloat16": 4}
#: Fewest normal nonzero values for the narrow-precision test to say anything.
NARROW_MIN_VALUES = 64
#: An honest output has about ``1 - 2**-(p - p_narrow)`` (87.5% and more) of its values using more significand bits
#: than the narrower type has; one computed in the narrower type has none. Below this fraction it was.
NARROW_FRACTION = 0.01
#: Each dtype's numpy type (``ml_dtypes`` for bfloat16), its explicit fraction bits and its exponent field's mask:
#: an output held in its case dtype's type (``compare.gate.fresh.compact``) is representable by construction, and its
#: significand bits are read off its bit pattern.
_HELD: dict[str, tuple[Any, type[np.unsignedinteger[Any]], int, int]] = {
    "bfloat16": (ml_dtypes.bfloat16, np.uint16, 7, 0x7F80),
    "float16": (np.float16, np.uint16, 10, 0x7C00),
    "float32": (np.float32, np.uint32, 23, 0x7F800000),
}


def _dtype_counts(raw: np.ndarray, y64: np.ndarray, dtype: str) -> tuple[int, int, int, int]:
    """Of one block of an output (``raw`` as held, ``y64`` its float64 values, all finite): ``(values not of dtype,
    the first such's index in the block or -1, normal nonzero values, those of them with more significand bits than
    the next narrower type)``."""
    held, uint, frac, exp_mask = _HELD[dtype]
    extra = frac - (NARROWER_BITS[dtype] - 1)  # fraction bits the narrower type lacks
    if raw.dtype == held:  # representable by construction: the bits say the rest
        bits = raw.ravel().view(uint)
        normal = (bits & uint(exp_mask)) != 0
        more = (bits & uint((1 << extra) - 1)) != 0
        return 0, -1, int(np.count_nonzero(normal)), int(np.count_nonzero(normal & more))
    flat = y64.ravel()
    bad = round_to_dtype(flat, dtype).astype(np.float64) != flat
    n_bad = int(np.count_nonzero(bad))
    tiny = float(np.finfo(np.float16).tiny) if dtype == "float16" else float(np.finfo(np.float32).tiny)
    v = flat[np.abs(flat) >= tiny]
    m, _ = np.frexp(v)  # |m| in [0.5, 1): m * 2**bits is an integer exactly when v has at most ``bits`` bits
    scaled = np.abs(m) * 2.0 ** NARROWER_BITS[dtype]
    return n_bad, int(np.argmax(bad)) if n_bad else -1, int(v.size), int(np.count_nonzero(scaled != np.floor(scaled)))


def _narrow(normal: int, more: int, dtype: str) -> tuple[int, float] | None:
    """``(bits, fraction)`` when an output's values carry no more significand bits than the next narrower type
    (:data:`NARROWER_BITS`): ``fraction`` (``more / normal``) of its normal nonzero values use more (below
    :data:`NARROW_FRACTION`: computed in a narrower type, e.g. bfloat16 math in a float16 case); None when not, or
    too few values to tell."""
    if normal < NARROW_MIN_VALUES:
        return None
    frac = more / normal
    return (NARROWER_BITS[dtype], frac) if frac < NARROW_FRACTION else None


@dataclass
class _Fit:
    """One least-squares fit of a target on a :class:`~compare.gate.stream.Design` over a stream of blocks: ``xt``
    (``X^T t``) in the first pass, the coefficients' clustered variances over the residuals in the second."""

    design: Design
    cols: int
    xt: np.ndarray = field(init=False)
    coef: np.ndarray = field(init=False)
    spread: list[Clustered] = field(init=False)

    def __post_init__(self) -> None:
        self.xt = np.zeros(self.design.m.shape[0])
        self.spread = [Clustered(self.cols) for _ in self.design.rows]

    def first(self, x: list[np.ndarray], t: np.ndarray) -> None:
        """``x``: the block's columns (``compare.gate.stream.columns``), ``t`` its target."""
        self.xt += [dot(c, t) for c in x]

    def solve(self) -> None:
        self.coef = self.design.m @ self.xt

    def second(self, x: list[np.ndarray], t: np.ndarray) -> None:
        resid = t.ravel() - self.coef[0] * x[0]
        for c, b in zip(x[1:], self.coef[1:], strict=True):
            resid -= b * c
        for row, acc in zip(self.design.rows, self.spread, strict=True):
            w = row[0] * x[0]
            for c, b in zip(x[1:], row[1:], strict=True):
                w += b * c
            acc.add((w * resid).reshape(-1, self.cols))

    def result(self) -> tuple[float, float, tuple[float, float] | None]:
        """The slope on ``ref`` and its standard error; with directions, the transcendental's bias in ulps and its
        standard error (:func:`slope_fit`)."""
        se = [SE_INFLATION * math.sqrt(acc.var()) for acc in self.spread]
        extra = None if len(se) == 1 else (float(self.design.rows[-1] @ self.xt), se[-1])
        return float(self.coef[0]), se[0], extra


def _with(r: np.ndarray, directions: Any | None, i0: int, i1: int) -> list[np.ndarray]:
    """The fit's columns of rows ``[i0, i1)`` (``compare.gate.stream.columns``) with ``ref``'s, ``r``, already read."""
    return [r.ravel()] + ([] if directions is None else [rows64(d, i0, i1).ravel() for d in directions])


def slope_fit(
    t: np.ndarray, ref: Any, directions: Any | None = None, design: Design | None = None
) -> tuple[float, float, tuple[float, float] | None]:
    """Least-squares slope ``b`` of ``t`` on ``ref`` (the ref^2-weighted mean relative error of an error ``t``) and
    its standard error; with ``directions`` (``[k, *ref.shape]``: a transcendental's signatures, :class:`PlainStats`)
    fitted beside it, the third value is the transcendental's fitted bias in float32 ulps (up minus down,
    ``directions`` being 4 ulp down and up) and its standard error; None without. Each coefficient is ``w . t`` with
    ``w`` a row of the pseudo-inverse, so its variance is the clustered variance of ``w * residual``. Two passes over
    blocks of rows (``compare.gate.stream``); ``design``: the fit's :class:`~compare.gate.stream.Design` when the
    caller has it."""
    design = design if design is not None else Design.of(ref, directions, TRANSCENDENTAL_ERROR_ULPS)
    fit = _Fit(design, matrix_shape(ref.shape)[1])
    for i0, i1 in blocks(ref.shape):
        fit.first(columns(ref, directions, i0, i1), rows64(t, i0, i1))
    fit.solve()
    for i0, i1 in blocks(ref.shape):
        fit.second(columns(ref, directions, i0, i1), rows64(t, i0, i1))
    return fit.result()


def _fail(name: str, n: int, why: str, **kw: object) -> TensorParity:
    # the errors were not measured (NaN); the plain computation's figures and the lines are 0
    base: dict[str, object] = dict.fromkeys(
        ("max_abs_err", "max_rel_err", "ratio", "rms_err", "mean_err", "scale_err"), math.nan
    )
    base |= dict.fromkeys(("bound", "plain_err", "rms_plain", "rms_bound", "mean_plain", "mean_se", "mean_bound"), 0.0)
    base |= dict.fromkeys(("scale_plain", "scale_se", "scale_bound"), 0.0)
    base |= {
        "not_representable": 0,
        "worst_ratio": math.inf,
        "worst_index": [],
        "nonfinite": 0,
        "failed": ["finite"],
        "cause": "not a number: NaN or Inf in the output",
    }
    base.update(kw)
    # ``base`` holds one value per remaining field, of the field's type: a dict of mixed types to mypy
    return TensorParity(tensor=name, n=n, passed=False, why=why, tier="fail", **base)  # type: ignore[arg-type]


def _fmt_index(idx: Iterable[Any]) -> list[int]:
    return [int(i) for i in idx]


class Plain(dict[str, np.ndarray]):
    """The plain same-dtype computation's tensors (``compare.problem.reference``, ``Arith.plain``), and its ``envelope``
    twin where there is one: the same computation with its float32 transcendentals a few ulp off
    (``compare.problem.reference.envelope_activations``; float32 cases of a model with an activation, else None). The
    pass lines come from the plain tensors, the max and rms fail lines from the worse of the two."""

    def __init__(
        self,
        tensors: dict[str, np.ndarray],
        envelope: dict[str, np.ndarray] | None = None,
        unrounded: dict[str, np.ndarray] | None = None,
        signature: dict[str, np.ndarray] | None = None,
    ) -> None:
        super().__init__(tensors)
        self.envelope = envelope
        #: The same tensors before their last rounding to the dtype (float32): where ``compare.gate.resolution`` injects
        #: an error, as a backend would make it.
        self.unrounded = unrounded
        #: Per tensor ``[2, *shape]``: the shapes of a float32 transcendental 4 ulp off all one way, down and up
        #: (``compare.problem.reference.plain_run``; where there is an envelope twin, else None): fitted beside the
        #: ``scale`` check's slope.
        self.signature = signature
        #: :func:`tensor_stats` per tensor, with the reference array they were computed against: every output
        #: judged against the same reference reuses them (5.2 s for one 58.7M-element tensor).
        self.stats: dict[str, tuple[np.ndarray, PlainStats]] = {}


@dataclass(frozen=True)
class PlainStats:
    """The plain same-dtype computation's error statistics on one tensor, and the reference's scale: every bound of
    the gate is built from these. They do not depend on the backend, so a caller judging many outputs against the
    same reference (``compare.gate.resolution``'s bisection) computes them once."""

    scale: float  # max|ref|
    rms_ref: float
    plain_err: float  # max|e_p|
    rms_plain: float
    mean: float
    mean_se: float
    slope: float
    slope_se: float
    envelope_err: float  # max|e| of the envelope twin (the plain computation's own where there is none)
    rms_envelope: float
    #: ``[2, *ref.shape]``: the shapes of a transcendental biased all one way (:class:`Plain`'s ``signature``), fitted
    #: beside the scale (None: no activation, or a 16-bit dtype where a float32 transcendental's bias is far below a
    #: unit roundoff)
    directions: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: the fits of the scale check (``compare.gate.stream.Design``): on ``ref`` alone, and paired (on ``ref`` and the
    #: ``directions``, where there are)
    ref_design: Design | None = field(default=None, compare=False, repr=False)
    paired_design: Design | None = field(default=None, compare=False, repr=False)
    #: the ``where`` check's smallest tenth of ``|ref|``: ``(t, below, k)``, the ``k``-th smallest ``|ref|`` and how
    #: many lie below it (the ``k - below`` first elements equal to ``t``, in order, complete it)
    small: tuple[float, int, int] = field(default=(0.0, 0, 0), compare=False, repr=False)


def plain_stats(ref: Any, plain: Any, envelope: Any | None = None, signature: Any | None = None) -> PlainStats:
    """The :class:`PlainStats` of ``plain`` (and its ``envelope`` and ``signature`` twins, :class:`Plain`) against the
    float64 ``ref`` (same shape), a block of rows at a time (``compare.gate.stream``)."""
    rows, cols = matrix_shape(ref.shape)
    n = rows * cols
    ref_design = Design.of(ref)
    paired = ref_design if signature is None else Design.of(ref, signature, TRANSCENDENTAL_ERROR_ULPS)
    fit, shift = _Fit(ref_design, cols), Clustered(cols)
    scale = plain_err = env_err = 0.0
    sum_ref = sum_plain = sum_env = 0.0
    for i0, i1 in blocks(ref.shape):
        r = rows64(ref, i0, i1)
        e_p = rows64(plain, i0, i1) - r
        if r.size:
            scale, plain_err = max(scale, float(np.max(np.abs(r)))), max(plain_err, float(np.max(np.abs(e_p))))
        sum_ref, sum_plain = sum_ref + dot(r, r), sum_plain + dot(e_p, e_p)
        shift.add(e_p)
        fit.first([r.ravel()], e_p)
        if envelope is not None:
            e_env = rows64(envelope, i0, i1) - r
            if e_env.size:
                env_err = max(env_err, float(np.max(np.abs(e_env))))
            sum_env += dot(e_env, e_env)
    fit.solve()
    for i0, i1 in blocks(ref.shape):
        r = rows64(ref, i0, i1)
        fit.second([r.ravel()], rows64(plain, i0, i1) - r)
    b_p, b_p_se, _ = fit.result()
    k = -(-n // WHERE_PART)
    t, below = kth_smallest_abs(ref, k) if n else (0.0, 0)

    def rms(total: float) -> float:
        return math.sqrt(total / n) if n else 0.0

    return PlainStats(
        scale=scale,
        rms_ref=rms(sum_ref),
        plain_err=plain_err,
        rms_plain=rms(sum_plain),
        mean=shift.total / n if n else 0.0,
        mean_se=SE_INFLATION * math.sqrt(shift.var()) / max(n, 1),
        slope=b_p,
        slope_se=b_p_se,
        envelope_err=plain_err if envelope is None or not n else env_err,
        rms_envelope=rms(sum_plain) if envelope is None else rms(sum_env),
        directions=signature,
        ref_design=ref_design,
        paired_design=paired,
        small=(t, below, k),
    )


def _beyond(value: float, plain: float) -> float:
    """How far ``value`` lies outside the interval between 0 and ``plain`` (0 inside it)."""
    return max(min(0.0, plain) - value, value - max(0.0, plain), 0.0)


def bias_fail_line(dtype: str) -> float:
    """The relative bias of the mean (in units of ``rms(ref)``; the scale has its own paired line) beyond which no
    rounding explains it: :data:`BIAS_FAIL_UNITS` unit roundoffs of the dtype + :data:`TRANSCENDENTAL_ULPS` ulps."""
    return BIAS_FAIL_UNITS * 2.0 ** -SIGNIFICAND_BITS[dtype] + TRANSCENDENTAL_ULPS * 2.0**-23


def _statistic(c: Check, dtype: str, envelope: float | None) -> str:
    """One deviating check in numbers: a max or rms error with its ratio to the plain computation's (and to the
    envelope twin's, ``envelope``, where there is one), a shift or scale as its bias beyond the honest interval."""
    if c.name == "shift":
        return (
            f"a constant shift: mean error {c.signed or 0.0:+.3g} lies {c.value / max(c.se or 0.0, 1e-300):.3g} "
            "standard errors beyond the plain computation's (or zero)"
        )
    if c.name == "scale":
        # the signed distance beyond the interval between 0 and the plain computation's slope has the slope's sign
        bias = math.copysign(c.value, c.signed or 0.0)
        return f"a systematic bias of {bias / 2.0 ** -SIGNIFICAND_BITS[dtype]:+.2g} unit roundoffs of {dtype}"
    plain = "where the plain computation's is 0"
    if c.plain:
        plain = f"{c.value / c.plain:.3g}x the plain computation's {c.plain:.3g}"
    twin = f", {c.value / envelope:.3g}x the envelope twin's {envelope:.3g}" if envelope else ""
    return f"{c.name} error {c.value:.3g}, {plain}{twin}"


def cause(
    dtype: str,
    tier: str,
    checks: list[Check],
    envelope: tuple[float, float] | None = None,
    transcendental: tuple[float, float] | None = None,
) -> str:
    """What the checks measured about a deviation or failure (empty on a pass), from ``checks`` (each with its tier),
    the envelope twin's max and rms error (``envelope``: the plain computation with its float32 transcendentals 4 ulp
    off, where that differs from the plain computation's) and the fitted transcendental signature
    (``transcendental``: coefficient and standard error, :func:`_scale`).

    A cause is named only where a fit measures it: the transcendental's signature. Any other deviation is an
    ``unexplained deviation`` with the statistics that deviated, in numbers; no rule of thumb stands in for a twin
    computation with the cause in it (a bias gradient with a few elements zeroed and one summed over the tokens in
    the low dtype both have more error than the plain computation, and nothing here tells them apart). An error
    within the envelope twin's never deviates: the max and rms pass lines are built from it (at 8x and 2.5x)."""
    if tier == "pass":
        return ""
    tiers = {c.name: c.tier for c in checks}
    if tiers.get("dtype") == "fail":
        return "values that do not fit the dtype's precision: computed in (or returned from) a wider or narrower type"
    if tier == "fail":
        if tiers.get("scale") == "fail" or tiers.get("shift") == "fail":
            return "a different function: a systematic error beyond any rounding (a wrong scale, shift or formula)"
        if tiers.get("where") == "fail":
            return "a different function: an error gathered on the smallest outputs, where rounding puts the least"
        return "a different function: an error beyond any rounding (a wrong formula, operand or precision)"
    if transcendental is not None and abs(transcendental[0]) > Z_SCORE * transcendental[1]:
        coef, se = transcendental
        return (
            f"measured: the fitted shape of a float32 tanh / exp {coef:+.2g} ulp off all one way, "
            f"{abs(coef) / se:.3g} standard errors from none (an approximate transcendental)"
        )
    twin = dict(zip(("max", "rms"), envelope, strict=True)) if envelope is not None else {}
    # not named: a cause (the activation in the dtype with its constants rounded, a token sum in the low dtype,
    # another accumulation order) is named only where a twin computation with that cause in it predicts the size and
    # shape of what was measured; the only twins computed are the envelope (its error is in the pass lines and the
    # ratios) and the transcendental's signature (fitted above)
    return "unexplained deviation: " + "; ".join(
        _statistic(c, dtype, twin.get(c.name)) for c in checks if c.tier == "deviates"
    )


@dataclass
class _Pass:
    """What the first pass of :func:`check_tensor` gathers over an output's blocks."""

    nonfinite: int = 0
    first_nonfinite: int = -1
    err: float = -1.0
    worst: int = 0
    got: float = 0.0
    want: float = 0.0
    sum_e2: float = 0.0
    small_e2: float = 0.0
    ties_left: int = 0
    n_bad: int = 0
    first_bad: int = -1
    bad_value: Any = None
    normal: int = 0
    more: int = 0


def check_tensor(name: str, y: Any, ref: Any, plain: Any, dtype: str, stats: PlainStats | None = None) -> TensorParity:
    """Compare ``y`` with the float64 ``ref``; ``plain`` is the same-dtype computation. All the same shape; each an
    array of any float type or an object with ``read_rows`` (``compare.gate.stream``): every statistic is gathered a
    block of rows at a time, in two passes (the second for the scale check's residuals), with float64 work arrays
    the size of a block.

    ``stats`` is ``plain_stats(ref, plain)`` when the caller already has it (it is computed here otherwise)."""
    if tuple(y.shape) != tuple(ref.shape):
        return _fail(
            name,
            int(np.prod(y.shape)),
            f"shape {list(y.shape)} differs from the reference's {list(ref.shape)}",
            failed=["shape"],
            cause="a different output: the wrong shape",
        )
    ps = stats if stats is not None else plain_stats(ref, plain)
    scale = ps.scale
    if not np.isfinite(scale) or scale < DEGENERATE_FACTOR * ATOL[dtype]:
        raise DegenerateGolden(
            f"reference {name!r} is degenerate: max|ref| = {scale:.3g} < {DEGENERATE_FACTOR:g} x atol ({ATOL[dtype]:g})"
        )
    u = 2.0 ** -SIGNIFICAND_BITS[dtype]
    rows, cols = matrix_shape(ref.shape)
    n = rows * cols
    plain_err = ps.plain_err
    # the pass lines allow what the plain computation or its envelope twin does (an ordinary float32 library's tanh
    # or exp, 4 ulp off, is still a plain computation); the twin differs only where an activation's derivative is
    # ill-conditioned (float32 cases of a model with an activation)
    bound = MAX_FACTOR * max(plain_err, ps.envelope_err) + u * scale
    max_base = PLAIN_FACTOR * plain_err + u * scale
    ref_design = ps.ref_design if ps.ref_design is not None else Design.of(ref)
    paired_design = ps.paired_design if ps.paired_design is not None else ref_design
    fit_e, fit_d, shift = _Fit(ref_design, cols), _Fit(paired_design, cols), Clustered(cols)
    if ps.small[2]:
        t_small, below, k_small = ps.small
    else:
        k_small = -(-n // WHERE_PART)
        t_small, below = kth_smallest_abs(ref, k_small) if n else (0.0, 0)
    p = _Pass(ties_left=max(k_small - below, 0))
    for i0, i1 in blocks(ref.shape):
        raw = rows_raw(y, i0, i1)
        y64 = np.asarray(raw, dtype=np.float64)
        at = i0 * cols
        finite = np.isfinite(y64)
        if not finite.all():
            if not p.nonfinite:
                p.first_nonfinite = at + int(np.argmax(~finite.ravel()))
            p.nonfinite += int(finite.size - np.count_nonzero(finite))
        if p.nonfinite:  # the output fails as not finite: nothing else is measured
            continue
        r = rows64(ref, i0, i1)
        e = y64 - r
        flat = int(np.argmax(np.abs(e))) if e.size else 0
        if e.size and abs(float(e.flat[flat])) > p.err:
            p.err, p.worst = abs(float(e.flat[flat])), at + flat
            p.got, p.want = float(y64.flat[flat]), float(r.flat[flat])
        ev = e.ravel()
        p.sum_e2 += dot(ev, ev)
        shift.add(e)
        fit_e.first([r.ravel()], e)
        fit_d.first(_with(r, ps.directions, i0, i1), y64 - rows64(plain, i0, i1))
        mag = np.abs(r.ravel())
        small = ev[mag < t_small]
        p.small_e2 += dot(small, small)
        if p.ties_left:
            tied = ev[np.flatnonzero(mag == t_small)[: p.ties_left]]
            p.small_e2, p.ties_left = p.small_e2 + dot(tied, tied), p.ties_left - tied.size
        n_bad, first_bad, normal, more = _dtype_counts(raw, y64, dtype)
        if n_bad and not p.n_bad:
            p.first_bad, p.bad_value = at + first_bad, y64.flat[first_bad]
        p.n_bad, p.normal, p.more = p.n_bad + n_bad, p.normal + normal, p.more + more
    if p.nonfinite:
        worst = _fmt_index(np.unravel_index(p.first_nonfinite, tuple(y.shape)))
        return _fail(
            name,
            n,
            f"{p.nonfinite} NaN/Inf values, first at {worst}",
            bound=bound,
            plain_err=plain_err,
            worst_index=worst,
            nonfinite=p.nonfinite,
        )
    fit_e.solve()
    fit_d.solve()
    for i0, i1 in blocks(ref.shape):
        y64, r = rows64(y, i0, i1), rows64(ref, i0, i1)
        fit_e.second([r.ravel()], y64 - r)
        fit_d.second(_with(r, ps.directions, i0, i1), y64 - rows64(plain, i0, i1))
    worst = _fmt_index(np.unravel_index(p.worst, tuple(y.shape)))
    err = max(p.err, 0.0)
    rms_err, rms_plain = (math.sqrt(p.sum_e2 / n) if n else 0.0), ps.rms_plain
    rms_bound = RMS_FACTOR * max(rms_plain, ps.rms_envelope) + 0.1 * u * ps.rms_ref
    rms_base = PLAIN_FACTOR * rms_plain + u * ps.rms_ref
    m, m_se = shift.total / n, SE_INFLATION * math.sqrt(shift.var()) / n
    m_p, m_p_se = ps.mean, ps.mean_se
    # the mean is judged as a difference from the plain computation's own, against the noise of both
    d_mean_se = math.hypot(m_se, m_p_se)
    mean_bound = Z_SCORE * d_mean_se
    mean_fail = mean_bound + bias_fail_line(dtype) * ps.rms_ref
    # the scale deviates when its error against the reference lies beyond the plain computation's, against the
    # noise of both; it fails on the paired slope of y - plain, whose noise is only what this output's rounding adds
    # to the plain computation's, with a transcendental biased all one way fitted beside it (``directions``)
    (b, b_se, _), b_p = fit_e.result(), ps.slope
    d_scale_se = math.hypot(b_se, ps.slope_se)
    scale_bound = Z_SCORE * d_scale_se
    b_d, pair_se, transcendental = fit_d.result()
    paired = _beyond(b_p + b_d, b_p)
    scale_fail = Z_SCORE * pair_se + SCALE_FAIL_UNITS * u
    max_fail = FAIL_FACTOR * max(max_base, ps.envelope_err)
    rms_fail = FAIL_FACTOR * max(rms_base, ps.rms_envelope)
    n_bad = p.n_bad
    narrow = None if n_bad else _narrow(p.normal, p.more, dtype)
    # an honest bias lies between none (a correctly rounded result) and the plain computation's own (which rounds
    # more often than a fused kernel): a bias is judged by its distance from that interval
    dm, db = _beyond(m, m_p), _beyond(b, b_p)
    scale_tier = "fail" if paired > scale_fail else ("deviates" if db > scale_bound else "pass")
    # ``where``: rms(e over the smallest tenth of |ref|) / rms(e) (0 when e is all zeros): 1 for an error spread
    # evenly, below 1 for rounding error (it grows with |ref|), above 1 for an error gathered on the smallest outputs
    w = math.sqrt(p.small_e2 / k_small) / rms_err if rms_err > 0 and k_small else 0.0
    gathered = w > WHERE_FAIL and k_small >= WHERE_MIN  # beyond the line, over enough elements
    checks = [
        Check("max", err, plain_err, bound, max_fail, _tier(err, bound, max_fail)),
        Check("rms", rms_err, rms_plain, rms_bound, rms_fail, _tier(rms_err, rms_bound, rms_fail)),
        Check("shift", dm, abs(m_p), mean_bound, mean_fail, _tier(dm, mean_bound, mean_fail), se=d_mean_se, signed=m),
        Check("scale", db, abs(b_p), scale_bound, scale_fail, scale_tier, se=d_scale_se, signed=b),
        # judged only past the rms pass line: at noise level the ratio of two small rms errors says nothing
        Check("where", w, 0.0, WHERE_FAIL, WHERE_FAIL, "fail" if rms_err > rms_bound and gathered else "pass"),
        Check("dtype", float(n_bad), 0.0, 0.0, 0.0, "fail" if n_bad or narrow else "pass"),
    ]
    whys = []
    for c in checks:
        if c.tier == "pass":
            continue
        beyond = "fail line" if c.tier == "fail" else "pass line"
        if c.name == "max":
            whys.append(
                f"max abs error {err:.3g} at {worst} (got {p.got:.6g}, want {p.want:.6g}) is "
                f"{err / bound:.3g}x the pass line {bound:.3g} = {MAX_FACTOR:g} x plain {dtype} error "
                f"{plain_err:.3g} + eps (fail line {max_fail:.3g})"
            )
        elif c.name == "rms":
            whys.append(
                f"rms error {rms_err:.3g} is {rms_err / rms_bound:.3g}x the pass line {rms_bound:.3g} = "
                f"{RMS_FACTOR:g} x plain {dtype} rms error {rms_plain:.3g} + eps (fail line {rms_fail:.3g})"
            )
        elif c.name == "shift":
            z = dm / max(d_mean_se, 1e-300)
            whys.append(
                f"mean error {m:.3g} lies {z:.3g} standard errors ({d_mean_se:.2g}) beyond the plain computation's "
                f"{m_p:.2g} (or zero) = {dm / (u * ps.rms_ref):.3g} unit roundoffs of {dtype} x rms(ref), beyond "
                f"the {beyond}"
            )
        elif c.name == "scale" and c.tier == "fail":
            whys.append(
                f"scale error {b_p + b_d:+.3g} (output = {1 + b_p + b_d:.5g} x reference, paired: the plain "
                f"computation's {b_p:+.2g} plus the slope of the difference from it, net of a transcendental's fit) "
                f"lies {paired / u:.3g} unit roundoffs of {dtype} beyond the plain computation's (or zero), past the "
                f"fail line {scale_fail / u:.3g} = {Z_SCORE:g} standard errors ({pair_se:.2g}) + {SCALE_FAIL_UNITS:g}"
            )
        elif c.name == "scale":
            whys.append(
                f"scale error {b:+.3g} (output = {1 + b:.5g} x reference) lies {db / max(d_scale_se, 1e-300):.3g} "
                f"standard errors ({d_scale_se:.2g}) beyond the plain computation's {b_p:+.2g} (or zero) = "
                f"{db / u:.3g} unit roundoffs of {dtype}, beyond the {beyond}"
            )
        elif c.name == "where":
            whys.append(
                f"the rms error over the tenth of elements with the smallest |ref| is {w:.3g}x the rms error over "
                f"all, beyond the fail line {WHERE_FAIL:g}: the error sits where rounding puts the least"
            )
        elif narrow is not None:
            whys.append(
                f"only {narrow[1]:.2%} of the values use more than {narrow[0]} significand bits (an honest {dtype} "
                f"result: most of them): the output was computed in a narrower type than {dtype}"
            )
        else:
            first = _fmt_index(np.unravel_index(p.first_bad, tuple(y.shape)))
            whys.append(
                f"{n_bad} of {n} values are not {dtype} values (first at {first}: {p.bad_value!r}): "
                f"the output was not computed in {dtype}"
            )
    tiers = {c.name: c.tier for c in checks}
    tier = "fail" if "fail" in tiers.values() else ("deviates" if "deviates" in tiers.values() else "pass")
    # ``where`` has no pass line of its own (it is judged only past the rms check's): it adds no ratio
    finite_ratios = [c.ratio for c in checks if c.name not in ("where", "dtype")]
    worst_ratio = max([*finite_ratios, math.inf if n_bad or narrow else 0.0])
    return TensorParity(
        tensor=name,
        n=n,
        max_abs_err=err,
        max_rel_err=err / scale,
        bound=bound,
        ratio=err / bound if bound else math.inf,
        plain_err=plain_err,
        rms_err=rms_err,
        rms_plain=rms_plain,
        rms_bound=rms_bound,
        mean_err=m,
        mean_plain=m_p,
        mean_se=m_se,
        mean_bound=mean_bound,
        scale_err=b,
        scale_plain=b_p,
        scale_se=d_scale_se,
        scale_bound=scale_bound,
        not_representable=n_bad,
        worst_ratio=worst_ratio,
        worst_index=worst,
        nonfinite=0,
        passed=tier == "pass",
        failed=[c.name for c in checks if c.tier == "fail"],
        why="; ".join(whys),
        tier=tier,
        deviated=[c.name for c in checks if c.tier == "deviates"],
        max_fail=max_fail,
        rms_fail=rms_fail,
        mean_fail=mean_fail,
        scale_fail=scale_fail,
        scale_paired=paired,
        where_ratio=w,
        cause=cause(
            dtype,
            tier,
            checks,
            (ps.envelope_err, ps.rms_envelope) if ps.envelope_err > ps.plain_err else None,
            transcendental,
        ),
    )


def worst_tier(tiers: Iterable[str]) -> str:
    """``fail`` over ``deviates`` over ``pass`` (``pass`` for none)."""
    ts = set(tiers)
    return next((t for t in reversed(TIERS) if t in ts), "pass")


@dataclass(frozen=True)
class RoutingCheck:
    """The verdict on a mixture-of-experts step's routing (``compare.gate.routing``): of its ``tokens``, how many
    have a ``near_tie`` (another choice of experts is a top-k choice of logits within ``tol`` of the golden's:
    ``compare.problem.moe.routable``), how many the step ``rerouted`` (other experts than the golden's, every one
    within the tolerance: its tensors judged against the golden of its own routing), the largest per-token
    tolerance ``tol`` (``compare.gate.routing.tolerance``), and where it routed a token to experts no logits within
    the tolerance choose, the count of such tokens (``wrong_tokens``) and the reason naming the first ones
    (``wrong``): a wrong router, which fails the step."""

    tokens: int
    near_ties: int
    rerouted: int
    tol: float
    wrong_tokens: int = 0
    wrong: str = ""


@dataclass(frozen=True)
class VariantCheck:
    """What a failing or deviating step computes instead (``compare.gate.near_variants``): the words of each near
    variant of its model whose golden its ``y`` passes against (``computes``: the first is named, the others were not
    told apart from it on these inputs; none: unexplained), the names of the variants ``tried`` and of those
    ``unseen`` (not told apart from the model itself on these inputs, so never named), and a ``note`` where none was
    judged."""

    computes: tuple[str, ...]
    tried: tuple[str, ...]
    unseen: tuple[str, ...] = ()
    #: why none was checked against (its ``y`` passes: the variants are told apart on ``y`` alone)
    note: str = ""

    @property
    def short(self) -> str:
        """``computes <variant>`` (the first), else ``unexplained``: a report cell's."""
        return f"computes {self.computes[0]}" if self.computes else "unexplained"

    @property
    def words(self) -> str:
        """The finding a row's reason adds: ``computes <variant>`` (``or`` the others), else ``unexplained`` and
        why."""
        if not self.computes:
            unseen = f"; not told apart from the model on these inputs: {', '.join(self.unseen)}" if self.unseen else ""
            why = self.note or f"none of its {len(self.tried)} near variants explains it{unseen}"
            return f"unexplained ({why})"
        first, *more = self.computes
        return f"computes {first}" + (f" (or {' or '.join(more)}: not told apart here)" if more else "")


@dataclass(frozen=True)
class Parity:
    """Parity of every tensor a backend produced in one mode (``y`` and/or gradients); for a mixture-of-experts step
    also the verdict on its ``routing`` (:class:`RoutingCheck`; None for any other), a wrong router failing it; for a
    failing or deviating step what it computes instead (:class:`VariantCheck`; None where not checked)."""

    tensors: tuple[TensorParity, ...]
    routing: RoutingCheck | None = None
    variants: VariantCheck | None = None

    @property
    def tier(self) -> str:
        """The worst tensor's tier (``fail`` when there is no tensor at all, or the routing is a wrong router's)."""
        if self.routing is not None and self.routing.wrong_tokens:
            return "fail"
        return worst_tier(t.tier for t in self.tensors) if self.tensors else "fail"

    @property
    def passed(self) -> bool:
        """Every tensor in the ``pass`` tier."""
        return self.tier == "pass"

    @property
    def worst(self) -> TensorParity:
        return max(self.tensors, key=lambda t: t.worst_ratio if np.isfinite(t.worst_ratio) else np.inf)

    def failures(self) -> list[str]:
        """The tensors in the fail tier, with why; a wrong router's routing first."""
        wrong = [f"routing: {self.routing.wrong}"] if self.routing is not None and self.routing.wrong_tokens else []
        named = [self.variants.words] if self.variants is not None and self.tier == "fail" else []
        return wrong + [f"{t.tensor}: {t.why}" for t in self.tensors if t.tier == "fail"] + named

    def deviations(self) -> list[str]:
        """The tensors in the deviates tier, with why and the cause (:func:`cause`)."""
        named = [self.variants.words] if self.variants is not None and self.tier == "deviates" else []
        return [f"{t.tensor}: {t.why} ({t.cause})" for t in self.tensors if t.tier == "deviates"] + named


def check_all(
    got: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
) -> Parity:
    """Check every tensor in ``got`` (a backend's outputs and gradients) against the reference; ``plain`` is the plain
    computation's tensors (a :class:`Plain` with its envelope twin, or a plain dict without one)."""
    missing = [k for k in got if k not in ref]
    if missing:
        raise KeyError(f"backend returned tensors {missing} that have no reference; known: {sorted(ref)}")
    return Parity(tuple(check_tensor(k, got[k], ref[k], plain[k], dtype, tensor_stats(ref, plain, k)) for k in got))


def tensor_stats(ref: Mapping[str, np.ndarray], plain: dict[str, np.ndarray], k: str) -> PlainStats:
    """:func:`plain_stats` of tensor ``k``, with the twins of ``plain`` where it is a :class:`Plain` that has them,
    computed once per :class:`Plain` and reference array (:attr:`Plain.stats`)."""
    r = ref[k]
    if isinstance(plain, Plain) and k in plain.stats and plain.stats[k][0] is r:
        return plain.stats[k][1]
    env, sig = getattr(plain, "envelope", None), getattr(plain, "signature", None)
    stats = plain_stats(r, plain[k], None if env is None else env[k], None if sig is None else sig[k])
    if isinstance(plain, Plain):
        plain.stats[k] = (r, stats)
    return stats


#: :class:`PlainStats`' fields a :func:`stats_record` holds as they are (floats).
_RECORD_SKIPS = ("directions", "ref_design", "paired_design", "small")


def stats_record(s: PlainStats) -> dict[str, Any]:
    """``s`` as a JSON record (:func:`stats_of_record` reads it back, every float exact: JSON writes a float's
    shortest repr), less its ``directions`` (the plain computation's signature, handed back on reading)."""
    out: dict[str, Any] = {f.name: getattr(s, f.name) for f in fields(PlainStats) if f.name not in _RECORD_SKIPS}
    for name in ("ref_design", "paired_design"):
        d = getattr(s, name)
        out[name] = None if d is None else {"m": d.m.tolist(), "rows": d.rows.tolist()}
    out["small"] = list(s.small)
    return out


def stats_of_record(r: dict[str, Any], directions: np.ndarray | None) -> PlainStats:
    """The :class:`PlainStats` of a :func:`stats_record` with its ``directions``; a record of another layout raises
    ``KeyError``, ``TypeError`` or ``ValueError``."""
    ref_design, paired_design = (
        None if r[name] is None else Design(np.array(r[name]["m"], dtype=np.float64), np.array(r[name]["rows"]))
        for name in ("ref_design", "paired_design")
    )
    t, below, k = r["small"]
    scalars = {f.name: float(r[f.name]) for f in fields(PlainStats) if f.name not in _RECORD_SKIPS}
    return PlainStats(
        **scalars,
        directions=directions,
        ref_design=ref_design,
        paired_design=paired_design,
        small=(float(t), int(below), int(k)),
    )


def check_plain(case_name: str, dtype: str, ref: Mapping[str, Any], plain: dict[str, Any]) -> None:
    """Refuse a case the gate cannot judge: a reference beyond the dtype's range, or a plain computation with
    NaN/Inf (its bounds would be NaN or infinite, and ``err > nan`` is False), for the tensors the plain computation
    made (the ones a run judges), read a block of rows at a time. Raises :class:`UnusableCase`."""
    for k in plain:
        r = ref[k]
        tops = [float(np.max(np.abs(rows64(r, i0, i1)))) for i0, i1 in blocks(r.shape)] if r.size else []
        top = math.nan if any(math.isnan(t) for t in tops) else max(tops, default=0.0)
        if r.size and (not np.isfinite(top) or top > DTYPE_MAX[dtype]):
            raise UnusableCase(
                f"case {case_name}: the reference {k!r} reaches {top:.4g}, beyond {dtype}'s largest "
                f"finite value {DTYPE_MAX[dtype]:.6g}; no {dtype} computation can represent it"
            )
    for k, p in plain.items():
        bad = sum(int(np.count_nonzero(~np.isfinite(rows64(p, i0, i1)))) for i0, i1 in blocks(p.shape))
        if bad:
            raise UnusableCase(
                f"case {case_name}: the plain {dtype} computation of {k!r} has {bad} NaN/Inf values "
                f"(it overflows {dtype}), so no bound can be derived from it; use smaller inputs or "
                f"a wider dtype"
            )
