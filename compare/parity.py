"""Parity rules: is a backend's tensor as close to the float64 golden as its dtype allows?

Every bound is measured against ``y_plain``, the plain same-dtype computation of ``compare.reference`` (float32
accumulation, every materialised tensor rounded to the dtype) on the same case: a backend may be as inaccurate as
an ordinary computation in its dtype, and the gate asks whether it is *more* wrong than that, or wrong in a
*different way*. With ``e = y - y_ref`` (the backend's error against the float64 reference), ``e_p = y_plain - y_ref``,
``u = 2**-p`` the dtype's unit roundoff and ``Z`` = :data:`Z_SCORE`, a tensor passes only if every check holds:

``max``
    ``max|e| <= 2 max|e_p| + u max|y_ref|``: no element worse than twice the plain computation's worst, plus one
    unit roundoff of the scale (what rounding the exact answer once may cost).
``rms``
    ``rms(e) <= 2 rms(e_p) + u rms(y_ref)``: the whole error distribution no wider than twice the plain one. It
    sees an error that is spread thin (every element a little off), which the max test forgives.
``shift``
    the mean signed error ``mean(e)``, judged against its standard error: ``|mean(e)| <= |mean(e_p)| +
    Z sqrt(se(e)^2 + se(e_p)^2)``. A constant offset far below one ulp per element is still many standard errors
    away from rounding noise, whose mean is zero (or the plain computation's own, at most).
``scale``
    the mean signed *relative* error, weighted by ``y_ref^2`` so that elements near zero do not dominate: the
    least-squares slope ``b = sum(e y_ref) / sum(y_ref^2)`` (``y = (1 + b) y_ref + noise``), judged the same way:
    ``|b| <= |b_p| + Z sqrt(se(b)^2 + se(b_p)^2)``. An output 1% too small has ``b = -0.01``; rounding noise over
    ``n`` elements has a standard error near ``rms(e) / (rms(y_ref) sqrt(n))``: 1% over 10k elements of bf16
    noise is hundreds of standard errors.
``dtype``
    every value is representable in the case dtype: a backend that claims to compute in bfloat16 hands back
    bfloat16 values. This is what a backend that returns the float64 answer (or computes in a wider dtype than it
    reports) cannot fake.

Standard errors are cluster-robust: rounding errors are not independent across a tensor (an error in ``h[t, :]``
reaches every element of ``y[t, :]``; one in ``h[:, k]`` every element of ``ddown[:, k]``), so each statistic's
variance is estimated three ways (elements independent, rows as clusters, columns as clusters; a tensor is viewed
as ``[-1, last dim]``) and the largest is used. ``Z = 5`` is a significance level fixed in advance (a two-sided
false-alarm probability near 6e-7 per check under the normal approximation), not fitted to the backends; every
other constant is the plain computation's own statistic on the same case, or the dtype's unit roundoff.

NaN or Inf in the backend's tensor fails. A reference whose scale is tiny next to the dtype's ``atol``
(``max|y_ref| < 100 * atol``) is refused as degenerate (it could not tell a right answer from zeros), and so is a
case whose plain computation is not finite or whose reference overflows the dtype (:func:`check_plain`).

The earlier "independent sanity check" (``atol + rtol sqrt(K) max|y_ref|``, the ``torch.testing.assert_close``
defaults widened by the accumulation length) is dropped: in bfloat16 its bound was near ``max|y_ref|`` itself (an
all-zeros output passed it at blog size), so it could not fail where it mattered; the rms, shift and scale checks
replace it and fail in every dtype (``tests/test_parity.py`` runs the negative controls in all three).

What the gate cannot see: an error below the plain computation's own noise at this case's size. How small that is
per case, dtype and tensor is measured by ``compare.resolution`` and printed in the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from compare.jsonfields import Obj, flag, integer, integers, number, text, texts
from compare.reference import SIGNIFICAND_BITS, round_to_dtype

#: ``torch.testing.assert_close`` default ``atol`` per dtype: the scale below which a reference is degenerate.
ATOL: dict[str, float] = {"float32": 1e-5, "bfloat16": 1e-5, "float16": 1e-5}
#: A backend may be this many times as wrong as the plain computation (max and rms checks).
PLAIN_FACTOR = 2.0
#: Standard errors a bias (shift or scale) may lie beyond the plain computation's own.
Z_SCORE = 5.0
DEGENERATE_FACTOR = 100.0
#: Largest finite value of each dtype: a reference beyond it cannot be represented, so it is refused.
DTYPE_MAX: dict[str, float] = {
    "float32": float(np.finfo(np.float32).max),
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}
CHECKS: tuple[str, ...] = ("max", "rms", "shift", "scale", "dtype")


class DegenerateGolden(ValueError):
    """The reference is too small for its tolerance to mean anything."""


class UnusableCase(ValueError):
    """The plain computation or the reference of a case is not finite in its dtype: nothing can be judged."""


@dataclass(frozen=True)
class Check:
    """One statistic of one tensor: its value (the absolute value for the signed ones), the plain computation's,
    the bound, the standard error (shift and scale) and the verdict."""

    name: str
    value: float
    plain: float
    bound: float
    passed: bool
    se: float | None = None
    signed: float | None = None

    @property
    def ratio(self) -> float:
        if self.bound > 0:
            return self.value / self.bound
        return 0.0 if self.value == 0 else math.inf


@dataclass(frozen=True)
class TensorParity:
    """Numbers for one tensor. ``max_rel_err`` is norm-wise: ``max_abs_err / max|y_ref|``; ``bound`` and ``ratio`` are
    the max check's; ``worst_ratio`` is the largest value/bound over every check (how close the tensor came to
    failing); ``failed`` names the checks that failed."""

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

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Obj) -> TensorParity:
        """The inverse of :meth:`to_dict`: every field is required (``results.json`` stores them all)."""
        return TensorParity(
            tensor=text(d, "tensor"),
            n=integer(d, "n"),
            max_abs_err=number(d, "max_abs_err"),
            max_rel_err=number(d, "max_rel_err"),
            bound=number(d, "bound"),
            ratio=number(d, "ratio"),
            plain_err=number(d, "plain_err"),
            rms_err=number(d, "rms_err"),
            rms_plain=number(d, "rms_plain"),
            rms_bound=number(d, "rms_bound"),
            mean_err=number(d, "mean_err"),
            mean_plain=number(d, "mean_plain"),
            mean_se=number(d, "mean_se"),
            mean_bound=number(d, "mean_bound"),
            scale_err=number(d, "scale_err"),
            scale_plain=number(d, "scale_plain"),
            scale_se=number(d, "scale_se"),
            scale_bound=number(d, "scale_bound"),
            not_representable=integer(d, "not_representable"),
            worst_ratio=number(d, "worst_ratio"),
            worst_index=list(integers(d, "worst_index")),
            nonfinite=integer(d, "nonfinite"),
            passed=flag(d, "passed"),
            failed=list(texts(d, "failed")),
            why=text(d, "why"),
        )


def _matrix(a: np.ndarray) -> np.ndarray:
    """A tensor as ``[rows, columns]`` (``[-1, last dim]``; a vector is one column)."""
    return a.reshape(-1, 1) if a.ndim <= 1 else a.reshape(-1, a.shape[-1])


def _clustered_var(contrib: np.ndarray) -> float:
    """Variance of ``contrib.sum()`` (``contrib`` 2-D, one term per element), the largest of three estimates: every
    element independent, rows as clusters, columns as clusters (clusters of one group are skipped)."""
    out = 0.0
    for sums in (contrib.ravel(), contrib.sum(axis=1), contrib.sum(axis=0)):
        g = sums.size
        if g >= 2:
            out = max(out, g / (g - 1) * float(np.sum((sums - sums.mean()) ** 2)))
    return out


def _shift(e: np.ndarray) -> tuple[float, float]:
    """Mean signed error and its standard error."""
    m = _matrix(e)
    return float(m.mean()), math.sqrt(_clustered_var(m)) / m.size


def _scale(e: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of ``e`` on ``ref`` (the ref^2-weighted mean relative error) and its standard error."""
    me, mr = _matrix(e), _matrix(ref)
    rr = float(np.sum(mr * mr))
    b = float(np.sum(me * mr)) / rr
    return b, math.sqrt(_clustered_var(mr * (me - b * mr))) / rr


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def not_representable(y64: np.ndarray, dtype: str) -> np.ndarray:
    """Mask of the finite values of ``y64`` that are not values of ``dtype``."""
    back = round_to_dtype(y64, dtype).astype(np.float64)
    return np.isfinite(y64) & (back != y64)


def _fail(name: str, n: int, why: str, **kw: object) -> TensorParity:
    nan = float("nan")
    base: dict[str, object] = {
        "max_abs_err": nan,
        "max_rel_err": nan,
        "bound": 0.0,
        "ratio": nan,
        "plain_err": 0.0,
        "rms_err": nan,
        "rms_plain": 0.0,
        "rms_bound": 0.0,
        "mean_err": nan,
        "mean_plain": 0.0,
        "mean_se": 0.0,
        "mean_bound": 0.0,
        "scale_err": nan,
        "scale_plain": 0.0,
        "scale_se": 0.0,
        "scale_bound": 0.0,
        "not_representable": 0,
        "worst_ratio": math.inf,
        "worst_index": [],
        "nonfinite": 0,
        "failed": ["finite"],
    }
    base.update(kw)
    # ``base`` holds one value per remaining field, of the field's type: a dict of mixed types to mypy
    return TensorParity(tensor=name, n=n, passed=False, why=why, **base)  # type: ignore[arg-type]


def _fmt_index(idx: Iterable[Any]) -> list[int]:
    return [int(i) for i in idx]


@dataclass(frozen=True)
class PlainStats:
    """The plain same-dtype computation's error statistics on one tensor, and the reference's scale: every bound of
    the gate is built from these. They do not depend on the backend, so a caller judging many outputs against the
    same reference (``compare.resolution``'s bisection) computes them once."""

    scale: float  # max|ref|
    rms_ref: float
    plain_err: float  # max|e_p|
    rms_plain: float
    mean: float
    mean_se: float
    slope: float
    slope_se: float


def plain_stats(ref: np.ndarray, plain: np.ndarray) -> PlainStats:
    """The :class:`PlainStats` of ``plain`` against the float64 ``ref`` (same shape)."""
    ref64 = np.asarray(ref, dtype=np.float64)
    e_p = np.asarray(plain, dtype=np.float64) - ref64
    (m_p, m_p_se), (b_p, b_p_se) = _shift(e_p), _scale(e_p, ref64)
    return PlainStats(
        scale=float(np.max(np.abs(ref64))) if ref64.size else 0.0,
        rms_ref=_rms(ref64),
        plain_err=float(np.max(np.abs(e_p))) if e_p.size else 0.0,
        rms_plain=_rms(e_p),
        mean=m_p,
        mean_se=m_p_se,
        slope=b_p,
        slope_se=b_p_se,
    )


def check_tensor(
    name: str, y: np.ndarray, ref: np.ndarray, plain: np.ndarray, dtype: str, stats: PlainStats | None = None
) -> TensorParity:
    """Compare ``y`` with the float64 ``ref``; ``plain`` is the same-dtype computation. All the same shape.

    ``stats`` is ``plain_stats(ref, plain)`` when the caller already has it (it is computed here otherwise)."""
    if y.shape != ref.shape:
        return _fail(
            name,
            int(np.size(y)),
            f"shape {list(y.shape)} differs from the reference's {list(ref.shape)}",
            failed=["shape"],
        )
    y64 = np.asarray(y, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    scale = stats.scale if stats is not None else (float(np.max(np.abs(ref64))) if ref64.size else 0.0)
    if not np.isfinite(scale) or scale < DEGENERATE_FACTOR * ATOL[dtype]:
        raise DegenerateGolden(
            f"reference {name!r} is degenerate: max|ref| = {scale:.3g} < {DEGENERATE_FACTOR:g} x atol ({ATOL[dtype]:g})"
        )
    ps = stats if stats is not None else plain_stats(ref64, plain)
    u = 2.0 ** -SIGNIFICAND_BITS[dtype]
    n = int(y64.size)
    plain_err = ps.plain_err
    bound = PLAIN_FACTOR * plain_err + u * scale
    finite = np.isfinite(y64)
    nonfinite = int(n - np.count_nonzero(finite))
    if nonfinite:
        worst = _fmt_index(np.unravel_index(int(np.argmax(~finite)), y64.shape))
        return _fail(
            name,
            n,
            f"{nonfinite} NaN/Inf values, first at {worst}",
            bound=bound,
            plain_err=plain_err,
            worst_index=worst,
            nonfinite=nonfinite,
        )
    e = y64 - ref64
    diff = np.abs(e)
    flat = int(np.argmax(diff))
    worst = _fmt_index(np.unravel_index(flat, diff.shape))
    err = float(diff.flat[flat])
    rms_err, rms_plain = _rms(e), ps.rms_plain
    rms_bound = PLAIN_FACTOR * rms_plain + u * ps.rms_ref
    (m, m_se), (m_p, m_p_se) = _shift(e), (ps.mean, ps.mean_se)
    (b, b_se), (b_p, b_p_se) = _scale(e, ref64), (ps.slope, ps.slope_se)
    mean_bound = abs(m_p) + Z_SCORE * math.hypot(m_se, m_p_se)
    scale_bound = abs(b_p) + Z_SCORE * math.hypot(b_se, b_p_se)
    bad_dtype = not_representable(y64, dtype)
    n_bad = int(np.count_nonzero(bad_dtype))
    checks = [
        Check("max", err, plain_err, bound, err <= bound),
        Check("rms", rms_err, rms_plain, rms_bound, rms_err <= rms_bound),
        Check("shift", abs(m), abs(m_p), mean_bound, abs(m) <= mean_bound, se=m_se, signed=m),
        Check("scale", abs(b), abs(b_p), scale_bound, abs(b) <= scale_bound, se=b_se, signed=b),
        Check("dtype", float(n_bad), 0.0, 0.0, n_bad == 0),
    ]
    whys = []
    for c in checks:
        if c.passed:
            continue
        if c.name == "max":
            whys.append(
                f"max abs error {err:.3g} at {worst} (got {y64.flat[flat]:.6g}, want {ref64.flat[flat]:.6g}) "
                f"exceeds bound {bound:.3g} = {PLAIN_FACTOR:g} x plain {dtype} error {plain_err:.3g} + eps"
            )
        elif c.name == "rms":
            whys.append(
                f"rms error {rms_err:.3g} exceeds bound {rms_bound:.3g} = {PLAIN_FACTOR:g} x plain {dtype} "
                f"rms error {rms_plain:.3g} + eps"
            )
        elif c.name == "shift":
            whys.append(
                f"mean error {m:.3g} is {abs(m) / max(m_se, 1e-300):.3g} standard errors ({m_se:.2g}) from "
                f"zero; bound {mean_bound:.3g} = |plain mean {m_p:.2g}| + {Z_SCORE:g} se"
            )
        elif c.name == "scale":
            whys.append(
                f"scale error {b:+.3g} (output = {1 + b:.5g} x reference) exceeds bound {scale_bound:.3g} = "
                f"|plain {b_p:.2g}| + {Z_SCORE:g} se ({b_se:.2g})"
            )
        else:
            first = _fmt_index(np.unravel_index(int(np.argmax(bad_dtype)), y64.shape))
            whys.append(
                f"{n_bad} of {n} values are not {dtype} values (first at {first}: {y64[tuple(first)]!r}): "
                f"the output was not computed in {dtype}"
            )
    finite_ratios = [c.ratio for c in checks if c.name != "dtype"]
    worst_ratio = max([*finite_ratios, math.inf if n_bad else 0.0])
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
        scale_se=b_se,
        scale_bound=scale_bound,
        not_representable=n_bad,
        worst_ratio=worst_ratio,
        worst_index=worst,
        nonfinite=0,
        passed=not whys,
        failed=[c.name for c in checks if not c.passed],
        why="; ".join(whys),
    )


@dataclass(frozen=True)
class Parity:
    """Parity of every tensor a backend produced in one mode (``y`` and/or gradients)."""

    tensors: tuple[TensorParity, ...]

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors)

    @property
    def worst(self) -> TensorParity:
        return max(self.tensors, key=lambda t: t.worst_ratio if np.isfinite(t.worst_ratio) else np.inf)

    def failures(self) -> list[str]:
        return [f"{t.tensor}: {t.why}" for t in self.tensors if not t.passed]

    def to_dict(self) -> dict[str, object]:
        """The verdict's summary (the worst tensor's numbers) and every tensor: the fields of a stored
        :class:`~compare.parity_record.ParityRecord` that the gate itself decides."""
        w = self.worst
        return {
            "passed": self.passed,
            "max_abs_err": w.max_abs_err,
            "max_rel_err": w.max_rel_err,
            "bound": w.bound,
            "ratio": w.ratio,
            "worst_ratio": w.worst_ratio,
            "worst_tensor": w.tensor,
            "failed": [f"{t.tensor}:{c}" for t in self.tensors for c in t.failed],
            "tensors": [t.to_dict() for t in self.tensors],
        }


def check_all(
    got: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
) -> Parity:
    """Check every tensor in ``got`` (a backend's outputs and gradients) against the reference."""
    missing = [k for k in got if k not in ref]
    if missing:
        raise KeyError(f"backend returned tensors {missing} that have no reference; known: {sorted(ref)}")
    return Parity(tuple(check_tensor(k, got[k], ref[k], plain[k], dtype) for k in got))


def check_plain(case_name: str, dtype: str, ref: dict[str, np.ndarray], plain: dict[str, np.ndarray]) -> None:
    """Refuse a case the gate cannot judge: a reference beyond the dtype's range, or a plain computation with
    NaN/Inf (its bounds would be NaN or infinite, and ``err > nan`` is False). Raises :class:`UnusableCase`."""
    for k, r in ref.items():
        top = float(np.max(np.abs(r))) if r.size else 0.0
        if not np.isfinite(top) or top > DTYPE_MAX[dtype]:
            raise UnusableCase(
                f"case {case_name}: the reference {k!r} reaches {top:.4g}, beyond {dtype}'s largest "
                f"finite value {DTYPE_MAX[dtype]:.6g}; no {dtype} computation can represent it"
            )
    for k, p in plain.items():
        bad = int(np.size(p) - np.count_nonzero(np.isfinite(p)))
        if bad:
            raise UnusableCase(
                f"case {case_name}: the plain {dtype} computation of {k!r} has {bad} NaN/Inf values "
                f"(it overflows {dtype}), so no bound can be derived from it; use smaller inputs or "
                f"a wider dtype"
            )
