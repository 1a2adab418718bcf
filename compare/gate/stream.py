"""The gate's statistics over a tensor a block of rows at a time, so that judging a 58.7M-element weight gradient
needs float64 work arrays of one block (:data:`BLOCK_ELEMENTS`, 128 KB each), never of the tensor.

A tensor is viewed as a matrix ``[-1, last dim]`` (a vector as one column: ``compare.gate.parity``'s clusters are
its rows and columns) and read in blocks of whole rows (:func:`blocks`, :func:`rows64`) from whatever holds it: a
numpy array of any float type (``ml_dtypes.bfloat16`` too), or an object with ``read_rows(i0, i1)`` (an entry of the
data cache read from disk, ``compare.problem.datacache.Stored``). Each statistic is gathered in one pass
(:class:`Spread`, :class:`Clustered`, :func:`kth_smallest_abs`); a least-squares slope's standard error needs the
slope first, so :class:`Design` makes a second pass over the residuals.

Why these are written here: numpy's statistics (``mean``, ``var``, ``partition``) take a whole array; the streaming
forms below are the textbook ones (Chan, Golub and LeVeque's pairwise update of a mean and a sum of squared
deviations; a radix selection on the bits of non-negative floats), each a few lines, and they agree with numpy's
two-pass forms to float64 rounding (``tests/test_stream.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Elements per block: 2**14, float64 work arrays of 128 KB, the dozen of them live at once within a core's L2 (2 MB
#: on this 2-core Xeon VM, 1 MB on a Zen 4 core): numpy's loops are bound by the cache the work arrays spill to, not by
#: the per-block Python calls. A check of a 16.8M-element bfloat16 weight gradient (Llama 3.2 1B's, its float64
#: reference read from the data cache) took 0.48 s in a run with these and 0.63 s with 2**16; alone, 0.51 s against
#: 0.60 s with 2**12, 0.74 s with 2**15 and 0.89 s with 2**16. tests/test_stream.py keeps the numbers equal for any
#: block size.
BLOCK_ELEMENTS = 1 << 14
#: Fewest terms a sample variance needs (``compare.gate.parity.MIN_TERMS``).
MIN_TERMS = 2


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """``[rows, columns]`` of a tensor of ``shape`` viewed as ``[-1, last dim]`` (a vector: one column)."""
    if len(shape) <= 1:
        return (int(np.prod(shape)), 1)
    return (int(np.prod(shape[:-1])), int(shape[-1]))


def blocks(shape: Sequence[int], elements: int | None = None) -> Iterator[tuple[int, int]]:
    """Row ranges ``[i0, i1)`` of the matrix view of ``shape``, each of at most ``elements`` elements (default
    :data:`BLOCK_ELEMENTS`; one row at least)."""
    rows, cols = matrix_shape(shape)
    step = max(1, (elements or BLOCK_ELEMENTS) // max(cols, 1))
    for i0 in range(0, rows, step):
        yield i0, min(rows, i0 + step)


def rows64(a: Any, i0: int, i1: int) -> np.ndarray:
    """Rows ``[i0, i1)`` of the matrix view of ``a`` (an array, or an object with ``read_rows``) as float64."""
    if hasattr(a, "read_rows"):
        return np.asarray(a.read_rows(i0, i1), dtype=np.float64)
    m = a.reshape(-1, 1) if a.ndim <= 1 else a.reshape(-1, a.shape[-1])
    return np.asarray(m[i0:i1], dtype=np.float64)


def rows_raw(a: Any, i0: int, i1: int) -> np.ndarray:
    """Rows ``[i0, i1)`` of the matrix view of ``a`` in the type it is held in."""
    if hasattr(a, "read_rows"):
        return np.asarray(a.read_rows(i0, i1))
    m = a.reshape(-1, 1) if a.ndim <= 1 else a.reshape(-1, a.shape[-1])
    return np.asarray(m[i0:i1])


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a * b)`` over every element, through ``einsum``'s own loop: numpy's ``@`` on vectors is the BLAS's
    ``ddot``, whose threads wait on a busy machine (20 ms for 2**20 elements where this takes 1 ms)."""
    return float(np.einsum("i,i->", a.ravel(), b.ravel()))


class Spread:
    """Count, mean and sum of squared deviations of a stream of values, merged a block at a time (Chan, Golub and
    LeVeque): ``var`` is numpy's two-pass ``n / (n - 1) * sum((v - mean)**2)`` over everything added."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, v: np.ndarray, total: float | None = None) -> None:
        """Add the values ``v``; ``total``: their sum where the caller has it (one pass fewer)."""
        k = int(v.size)
        if not k:
            return
        mu = (float(v.sum()) if total is None else total) / k
        d = v.ravel() - mu
        m2 = dot(d, d)
        total = self.n + k
        delta = mu - self.mean
        self.mean += delta * k / total
        self.m2 += m2 + delta * delta * self.n * k / total
        self.n = total

    def var(self) -> float:
        """``n / (n - 1)`` times the sum of squared deviations (0 below :data:`MIN_TERMS` terms)."""
        return self.n / (self.n - 1) * self.m2 if self.n >= MIN_TERMS else 0.0


class Clustered:
    """The variance of the sum of a matrix's elements, robust to the two ways rounding errors are shared
    (``compare.gate.parity``'s cluster-robust standard errors), gathered a block of whole rows at a time: elements
    independent, rows as clusters (each row's sum is whole in its block), columns as clusters (column sums kept
    over every block), and both at once (``V_rows + V_cols - V_elements``); the largest."""

    def __init__(self, cols: int) -> None:
        self.elements, self.rows = Spread(), Spread()
        self.cols = np.zeros(cols)
        self.total = 0.0

    def add(self, block: np.ndarray) -> None:
        """``block [r, cols]``: the contributions of ``r`` whole rows (three passes over it: its row sums, which give
        its total; its column sums; its deviations from its mean)."""
        rows = block.sum(axis=1)
        total = float(rows.sum())
        self.elements.add(block, total)
        self.rows.add(rows, total)
        self.cols += block.sum(axis=0)
        self.total += total

    def var(self) -> float:
        cols = Spread()
        cols.add(self.cols)
        v_el, v_rows, v_cols = self.elements.var(), self.rows.var(), cols.var()
        return max(v_el, v_rows, v_cols, v_rows + v_cols - v_el)


def kth_smallest_abs(a: Any, k: int) -> tuple[float, int]:
    """``(t, below)``: the ``k``-th smallest ``|a|`` (1-based; ``a`` finite) and how many ``|a|`` are strictly below
    it, in four passes over ``a`` (a radix selection on the bits of ``|a|`` as float64, 16 at a time: the bits of a
    non-negative float order as its value), with one histogram of 65,536 counts at a time."""
    rows, cols = matrix_shape(a.shape)
    if not 1 <= k <= rows * cols:
        raise ValueError(f"k = {k} outside 1..{rows * cols}")
    prefix, below, want = 0, 0, k
    for shift in (48, 32, 16, 0):
        counts = np.zeros(1 << 16, dtype=np.int64)
        for i0, i1 in blocks(a.shape):
            bits = np.abs(rows64(a, i0, i1)).ravel().view(np.uint64)
            if shift != 48:
                bits = bits[(bits >> np.uint64(shift + 16)) == np.uint64(prefix)]
            counts += np.bincount(((bits >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64), minlength=1 << 16)
        cum = np.cumsum(counts)
        digit = int(np.searchsorted(cum, want))  # the first digit whose running count reaches ``want``
        before = int(cum[digit - 1]) if digit else 0
        below, want = below + before, want - before
        prefix = (prefix << 16) | digit
    return float(np.array(prefix, dtype=np.uint64).view(np.float64)), below


@dataclass(frozen=True)
class Design:
    """A least-squares fit on the columns ``X = [ref, *directions]`` of one tensor (``compare.gate.parity``'s scale
    check), made once per tensor: ``coef = m @ (X^T t)`` for a target ``t`` (pinv of the Gram of unit columns:
    ``m = diag(1/|X_j|) pinv(G) diag(1/|X_j|)``), and the weight of each element in coefficient ``i`` is ``X @ m[i]``;
    ``rows`` are the combinations whose standard error is wanted (the slope on ``ref``, and with directions a
    transcendental's bias in ulps, ``ulps * (m[2] - m[1])``)."""

    m: np.ndarray  # [k, k]
    rows: np.ndarray  # [r, k]

    @staticmethod
    def of(ref: Any, directions: Any | None = None, ulps: float = 0.0) -> Design:
        k = 1 if directions is None else 1 + len(directions)
        xtx = np.zeros((k, k))
        for i0, i1 in blocks(ref.shape):
            x = columns(ref, directions, i0, i1)
            xtx += [[dot(a, b) for b in x] for a in x]
        norms = np.sqrt(np.diag(xtx)).copy()
        norms[norms == 0] = 1.0  # unit columns: ref is O(1), a signature O(1e-7); their raw Gram is singular
        m = np.linalg.pinv(xtx / np.outer(norms, norms)) / np.outer(norms, norms)
        rows = m[:1] if directions is None else np.vstack([m[:1], ulps * (m[2] - m[1])])
        return Design(m, rows)


def columns(ref: Any, directions: Any | None, i0: int, i1: int) -> list[np.ndarray]:
    """``X`` of rows ``[i0, i1)``: its ``k`` columns, ``ref`` then each direction, flattened."""
    cols = [rows64(ref, i0, i1).ravel()]
    if directions is not None:
        cols += [rows64(d, i0, i1).ravel() for d in directions]
    return cols
