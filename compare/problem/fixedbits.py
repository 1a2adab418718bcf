"""Arithmetic whose result bits are fixed by the data: the same on every CPU, BLAS kernel and instruction set.

The golden reference and the plain same-dtype computation (``compare.problem.reference``) must not move with the
machine: a parity verdict may change only because a backend's own output changed. numpy's matmul goes through the
local BLAS, whose accumulation order (and so its last bits) differs between kernels (``OPENBLAS_CORETYPE=Haswell``,
``Sandybridge``, ``Nehalem`` give different float32 and float64 products), and numpy's ``tanh``/``exp`` dispatch to
SIMD versions chosen by the CPU. Everything here is built from IEEE basic operations (``+ - * /``, ``rint``,
``ldexp``), each correctly rounded and so identical everywhere, in an order fixed by the code:

:func:`matmul64` (the golden's products)
    Ozaki's error-free splitting. Each row of ``a`` (column of ``b``) is cut into :data:`SLICES` slices of integers
    of at most ``beta`` bits times a power of two, with ``2 beta + ceil(log2 k) <= 53``; the product of two slices is
    then a float64 GEMM of integers whose every partial sum, in whatever order and blocking the BLAS uses, with or
    without FMA, is an integer below ``2**53``: exact. The slice products are added in a fixed order. The result
    differs from the exact product by at most about ``k 2**-(SLICES beta)`` times ``max|a_i,:| max|b_:,j|``
    (``2**-57`` relative to that scale for ``k <= 2**15``) plus the few roundings of the final sum: far below a
    float32 ulp, and the same bits on every machine.
:func:`matmul32` (the plain computation's products)
    A float32 GEMM with the plainest accumulation order: for each output, ``acc = fl32(acc + fl32(a_ik b_kj))`` for
    ``k = 0, 1, ...`` in turn, no FMA, no blocking over ``k``: numpy's elementwise float32 multiply and add, one
    rank-one update per ``k``. Sequential accumulation has the largest error of the common orders (pairwise, blocked
    and split-K sums round fewer partial sums of smaller size), so the plain computation does not flatter the gate.
:func:`exp`, :func:`expm1`, :func:`tanh`
    float64 elementwise functions from a Cody-Waite range reduction and a Taylor polynomial (about one ulp).
:func:`erf`, :func:`log1p`
    float64 elementwise functions built on :func:`exp` and basic operations (erf: an all-positive series, then a
    continued fraction for erfc; log1p: ``frexp`` and the series of atanh), within 5 and 2 ulps. numpy has no erf,
    and libm's (``math.erf``) or numpy's ``log1p`` may differ in the last bits between C libraries and CPUs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

#: Slices per operand in :func:`matmul64` (products of slices ``s + t <= SLICES + 1`` are kept: 6 GEMMs).
SLICES = 3


def _beta(k: int) -> int:
    """Bits per slice so that a ``k``-term sum of slice products stays an integer below ``2**53``."""
    return (53 - max(1, math.ceil(math.log2(max(k, 2))))) // 2


def _row_exponents(a: np.ndarray) -> np.ndarray:
    """Per row of ``a [m, k]``: ``e`` with ``max|a_i,:| <= 2**e`` (0 for a row of zeros)."""
    top = np.max(np.abs(a), axis=1)
    _, e = np.frexp(top)  # top = f * 2**e with 0.5 <= f < 1, so top < 2**e; exact
    return np.where(top > 0, e, 0).astype(np.int64)


def _pow2(e: np.ndarray) -> np.ndarray | None:
    """``2.0**e`` per element, or None when some ``2**e`` is not a normal float64 (then ``ldexp`` is used)."""
    if e.size and (e.min() < -1022 or e.max() > 1023):
        return None
    return np.ldexp(1.0, e)


def _split_rows(a: np.ndarray, beta: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``a [m, k]`` as ``SLICES`` pairs ``(ints, exp)`` with ``a ~ sum ints * 2**exp[:, None]``; ``ints`` holds integers
    of magnitude at most ``2**beta`` (as float64). Each step is exact: scaling by a power of two, ``rint`` and the
    residual's subtraction (the residual of rounding to a coarser grid is representable). The scaling multiplies by
    ``2**-exp`` per row (``ldexp``'s result, correctly rounded, in one multiplication: ``ldexp`` of a whole array
    took 10 s for a 4096 x 14336 weight on 2 cores), ``ldexp`` itself where a power is not a normal number."""
    rest = a.astype(np.float64, copy=True)
    e = _row_exponents(rest) - beta
    out = []
    for _ in range(SLICES):
        down, up = _pow2(-e), _pow2(e)
        if down is None or up is None:
            ints = np.rint(np.ldexp(rest, -e[:, None]))
            rest = rest - np.ldexp(ints, e[:, None])
        else:
            ints = np.rint(rest * down[:, None])
            rest -= ints * up[:, None]
        out.append((ints, e.copy()))
        e = e - beta
    return out


def _scaled(m: np.ndarray, row_exp: np.ndarray, col_exp: np.ndarray) -> np.ndarray:
    """``m * 2**row_exp[:, None] * 2**col_exp[None, :]``, exact: two multiplications by powers of two while both
    stay normal numbers (every case here), ``ldexp`` on the combined exponent otherwise."""
    lo, hi = min(row_exp.min(), col_exp.min()), max(row_exp.max(), col_exp.max())
    if lo > -500 and hi < 500:
        return m * np.ldexp(1.0, row_exp)[:, None] * np.ldexp(1.0, col_exp)[None, :]
    return np.ldexp(m, row_exp[:, None] + col_exp[None, :])


def _operands(name: str, a: np.ndarray, b: np.ndarray, dtype: type[np.floating]) -> tuple[np.ndarray, np.ndarray]:
    """``a [m, k]`` and ``b [k, n]`` as contiguous ``dtype`` arrays; a ValueError naming ``name`` otherwise."""
    a, b = np.ascontiguousarray(a, dtype=dtype), np.ascontiguousarray(b, dtype=dtype)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"{name} needs [m, k] @ [k, n]; got {list(a.shape)} @ {list(b.shape)}")
    return a, b


#: Columns of ``b`` split and multiplied together by :func:`matmul64`: its slices of ``b`` and its products are held a
#: block at a time (a 4096 x 14336 weight's three slices would be 1.4 GB at once), and products this narrow stay on
#: OpenBLAS's single-threaded path, whose speed does not fall with the machine's load: on a busy 2-core VM a
#: ``[16, 4096] @ [4096, 14336]`` product took 2.5 s in blocks of 16 columns, 17 s in blocks of 64 (threaded).
_COLUMNS = 16


def matmul64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a [m, k] @ b [k, n]`` in float64, the same bits on every machine (see the module docstring).

    Inputs must be finite. Slice products are summed from the smallest (``s + t = SLICES + 1``) to the largest. Two
    shortcuts leave every bit as it is: a slice product is computed only on the rows of ``a`` whose slice holds a
    nonzero (the others add an exact zero; the sum is never ``-0``, so adding a zero changes nothing), and ``b`` is
    taken :data:`_COLUMNS` columns at a time (each output's slices and sums are its own column's and row's). On
    bfloat16 data most rows need one slice of the three: a Llama 3 8B layer's weight gradient (``[14336, 16] @ [16,
    4096]``) takes one product where the plain form took six."""
    a64, b64 = _operands("matmul64", a, b, np.float64)
    if not (np.all(np.isfinite(a64)) and np.all(np.isfinite(b64))):
        raise ValueError("matmul64 needs finite inputs")
    (m, k), n = a64.shape, b64.shape[1]
    beta = _beta(k)
    sa = _split_rows(a64, beta)
    used = [np.flatnonzero(ints.any(axis=1)) for ints, _ in sa]  # per slice of a: its rows that hold a nonzero
    out = np.zeros((m, n))
    for j0 in range(0, n, _COLUMNS):
        j1 = min(n, j0 + _COLUMNS)
        sb = _split_rows(np.ascontiguousarray(b64[:, j0:j1].T), beta)  # columns of b as rows
        for level in range(SLICES + 1, 1, -1):  # s + t = level, smallest terms first
            for s in range(max(1, level - SLICES), level):  # both slices at most SLICES
                (ia, ea), (ib, eb), rows = sa[s - 1], sb[level - s - 1], used[s - 1]
                if not rows.size or not ib.any():
                    continue
                if rows.size == m:
                    out[:, j0:j1] += _scaled(ia @ ib.T, ea, eb)  # integers: every partial sum below 2**53, exact
                else:
                    out[rows, j0:j1] += _scaled(ia[rows] @ ib.T, ea[rows], eb)
    return out


#: Output rows updated together by :func:`matmul32` (their accumulators stay in the cache; the order of every output's
#: sum is the same for any value).
_ROWS = 32


def matmul32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a [m, k] @ b [k, n]`` accumulated in float32 sequentially over ``k``, no FMA (module docstring).

    ``a`` and ``b`` are rounded to float32 first (they hold dtype values already in the plain computation). One
    rank-one update per ``k`` on :data:`_ROWS` rows at a time: ``prod = fl32(a_ip b_pj)`` then ``acc = fl32(acc +
    prod)``, numpy's float32 multiply and add, each correctly rounded. About 4 GFLOP/s here: 0.6 s for a
    1024 x 768 x 3072 product."""
    a32, b32 = _operands("matmul32", a, b, np.float32)
    m, k = a32.shape
    out = np.zeros((m, b32.shape[1]), dtype=np.float32)
    for i0 in range(0, m, _ROWS):
        rows = a32[i0 : i0 + _ROWS]
        acc = out[i0 : i0 + _ROWS]
        prod = np.empty_like(acc)
        for p in range(k):
            np.multiply(rows[:, p : p + 1], b32[p : p + 1, :], out=prod)
            np.add(acc, prod, out=acc)
    return out


# exp: x = n ln2 + r, |r| <= ln2 / 2, with ln2 in two parts (fdlibm's): the high part has 21 trailing zero bits, so
# n * LN2_HI is exact for every |n| < 1100, and LN2_HI + LN2_LO is ln 2 to about 2**-86 (Cody and Waite); exp(r) from
# its Taylor series to degree 17 (remainder below 2**-60 for |r| <= 0.35).
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = 1.0 / math.log(2.0)
_TAYLOR = [1.0 / math.factorial(i) for i in range(18)]


def _poly(r: np.ndarray, coeffs: list[float]) -> np.ndarray:
    """Horner's rule: ``sum coeffs[i] r**i``."""
    p = np.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = p * r + c
    return p


def exp(x: np.ndarray) -> np.ndarray:
    """``e**x`` in float64 from basic operations (about one ulp; ``inf`` above 709.78, 0 far below -745)."""
    x = np.asarray(x, dtype=np.float64)
    xc = np.clip(x, -746.0, 710.0)
    n = np.rint(xc * _INV_LN2)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(_poly(r, _TAYLOR), n.astype(np.int64))
    return np.where(np.isnan(x), x, out)


def expm1(x: np.ndarray) -> np.ndarray:
    """``e**x - 1`` in float64: the Taylor series without its constant term where ``|x| < 0.35`` (no cancellation),
    ``exp(x) - 1`` elsewhere (at most a factor 3 of cancellation there)."""
    x = np.asarray(x, dtype=np.float64)
    small = np.abs(x) < 0.35
    xs = np.where(small, x, 0.0)
    series = xs * _poly(xs, _TAYLOR[1:])
    return np.where(small, series, exp(np.where(small, 0.0, x)) - 1.0)


def tanh(x: np.ndarray) -> np.ndarray:
    """``tanh x`` in float64: ``-expm1(-2|x|) / (2 + expm1(-2|x|))`` with the sign of ``x`` (odd, no overflow)."""
    x = np.asarray(x, dtype=np.float64)
    m = expm1(-2.0 * np.abs(x))
    return np.copysign(-m / (2.0 + m), x)


#: Where :func:`erf` changes from its series to its continued fraction, and the terms each keeps: at ``ERF_SPLIT``
#: both truncations are below 2**-57 of erf (the series needs 32 terms for its next one to fall below 2**-58 of its
#: sum, the continued fraction 49 levels for its error times erfc to fall below 2**-57), and they only shrink on their
#: own side of it.
ERF_SPLIT = 2.0
ERF_SERIES_TERMS = 36
ERF_FRACTION_TERMS = 52
#: From here on erf is 1 in float64: erfc(6) = 2.2e-17 is below half an ulp of 1 (2**-54).
ERF_ONE = 6.0
#: ``1 / (2n + 1)!!`` for ``n = 0 .. ERF_SERIES_TERMS``, each the exact fraction correctly rounded.
_ERF_SERIES = [float(Fraction(1, math.prod(range(1, 2 * n + 2, 2)))) for n in range(ERF_SERIES_TERMS + 1)]
_TWO_OVER_SQRT_PI = float.fromhex("0x1.20dd750429b6dp+0")
_ONE_OVER_SQRT_PI = float.fromhex("0x1.20dd750429b6dp-1")


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float64 from basic operations and :func:`exp`: within 5 ulps of the true value (1 or
    less on 90% of arguments, 5 on one in 20,000 below 2; ``tests/test_fixedbits.py`` measures it against 40-digit
    values), odd, ``erf(+-inf) = +-1``; far below a float32 ulp (``2**29`` float64 ulps).

    With ``a = |x|``:

    - ``a < ERF_SPLIT``: the all-positive series ``erf(a) = 2/sqrt(pi) a exp(-t) S(2t)``, ``t = a^2`` and ``S(y) =
      sum_n y^n / (2n+1)!!``, :data:`ERF_SERIES_TERMS` terms by Horner's rule (no cancellation: every term is
      positive). ``t`` is rounded once and both factors take the same ``t``: ``exp(-t) S(2t)`` is a smooth function
      of ``t`` whose relative change is at most half of ``t``'s, where each factor alone would move by ``t`` times
      (4 ulps at ``a = 2``); the error is the few roundings of the three products, :func:`exp`'s and the sum's;
    - ``ERF_SPLIT <= a < ERF_ONE``: ``1 - erfc(a)`` with ``erfc(a) = exp(-a^2) / sqrt(pi) / K`` and the continued
      fraction ``K = a + (1/2) / (a + (2/2) / (a + (3/2) / (a + ...)))``, :data:`ERF_FRACTION_TERMS` levels
      evaluated from the bottom up (every level positive, so rounding errors do not grow); erfc is below 0.005
      there, so even its ``a^2`` ulps from the rounded square reach erf as a tenth of an ulp;
    - ``a >= ERF_ONE``: 1.

    Cost: 36 multiply-adds per element in the series, 52 divisions in the continued fraction, plus one
    :func:`exp` (each branch computed on its own elements only)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    out = np.ones_like(a)
    series = a < ERF_SPLIT
    fraction = (a >= ERF_SPLIT) & (a < ERF_ONE)
    s = a[series]
    t = s * s
    y = 2.0 * t
    p = np.full_like(s, _ERF_SERIES[-1])
    for c in reversed(_ERF_SERIES[:-1]):
        p = p * y + c
    out[series] = (_TWO_OVER_SQRT_PI * s) * exp(-t) * p
    f = a[fraction]
    k = f.copy()
    for n in range(ERF_FRACTION_TERMS, 0, -1):
        k = f + (0.5 * n) / k
    out[fraction] = 1.0 - _ONE_OVER_SQRT_PI * exp(-(f * f)) / k
    return np.where(np.isnan(x), x, np.copysign(out, x))


# log1p: u = 1 + y splits into m 2**e with sqrt(1/2) <= m < sqrt(2); log(m) = 2 atanh(s), s = (m - 1) / (m + 1), from
# its series 2 s (1 + s^2/3 + s^4/5 + ...): |s| <= 0.1716, so s^2 <= 0.0295 and 12 terms leave less than 2**-60.
_SQRT_HALF = math.sqrt(0.5)
_ATANH = [1.0 / (2 * n + 1) for n in range(13)]


def log1p(y: np.ndarray) -> np.ndarray:
    """``log(1 + y)`` in float64 from basic operations, ``frexp`` and ``ldexp``: within 2 ulps of the true value
    (``tests/test_fixedbits.py`` measures it against 40-digit values), ``y`` itself for ``|y| < 2**-54`` (where
    ``y - y^2/2`` rounds to ``y``), ``inf`` at ``inf``, ``-inf`` at -1, NaN below it.

    ``u = fl(1 + y)`` is written ``m 2**e`` with ``sqrt(1/2) <= m < sqrt(2)`` (exact) and ``log1p(y) = e ln 2 + 2
    atanh(s)``, ``s = (m - 1) / (m + 1)`` (``m - 1`` exact), from the odd series of atanh (:data:`_ATANH`, 13 terms by
    Horner's rule in ``s^2``); ``ln 2`` is :func:`exp`'s two-part constant. Where ``e = 0`` (``-0.29 < y < 0.41``)
    ``s = y / (2 + y)`` from ``y`` itself; elsewhere the rounding error of ``1 + y``, ``c = y - (u - 1)`` (exact), is
    added as ``c / u``. Cost: about 30 basic operations per element."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = 1.0 + y
        ok = np.isfinite(u) & (u > 0.0)
        uu = np.where(ok, u, 1.0)
        yy = np.where(ok, y, 0.0)
        m, e = np.frexp(uu)  # uu = m 2**e, 0.5 <= m < 1
        low = m < _SQRT_HALF
        m = np.where(low, 2.0 * m, m)
        e = np.where(low, e - 1, e)
        near = e == 0
        s = np.where(near, yy / (2.0 + yy), (m - 1.0) / (m + 1.0))
        corr = np.where(near, 0.0, (yy - (uu - 1.0)) / uu)
        z = s * s
        series = 2.0 * s + (2.0 * s) * (z * _poly(z, _ATANH[1:]))
        n = e.astype(np.float64)
        out = n * _LN2_HI + (series + (n * _LN2_LO + corr))
        out = np.where(np.abs(y) < 2.0**-54, y, out)  # y - y^2/2 rounds to y; -0.0 stays -0.0, subnormals exact
        edge = np.where(u == 0.0, -np.inf, np.where(u == np.inf, np.inf, np.nan))  # -1, inf; NaN below -1 and at NaN
        return np.where(ok, out, edge)
