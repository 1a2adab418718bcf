"""What a "pass" means: the smallest error the parity gate can see, per case, dtype and tensor. Pure numpy.

The gate (``compare.gate.parity``) judges a backend against the plain same-dtype computation's own error on the same
case, so what it can resolve depends on the case (its size, its input distribution) and the dtype. Two questions,
answered on the golden data with the very same gate:

- **Scale resolution**: the smallest relative scale error ``s`` for which ``round(u * (1 -+ s))`` leaves the
  gate's pass tier (deviates or fails) in both directions, for ``u`` the plain computation and a twin of it with
  every sum in the reverse order, each *before* its last rounding to the dtype (:func:`scale_resolution`): the
  error is made where a backend makes it (a constant, a GEMM's epilogue, an activation), and the rounding that
  follows cannot undo it, as it would undo a scale error applied to the already-rounded output (in bf16 that hid
  everything below about half an ulp). Found by bisection in ``log s`` between :data:`S_MIN` and :data:`S_MAX` to
  :data:`REL_PRECISION`. The gate judges a scale paired, on the backend's difference from the plain computation, so
  its noise is what the backend's own rounding adds: the plain computation's bits are one extreme, the reversed sums
  stand for the usual backend, whose accumulation order differs; a backend whose rounding differs more has a
  coarser resolution of its own (its row's scale standard error). (The fail line of a scale error sits higher:
  ``compare.gate.parity.SCALE_FAIL_UNITS`` beyond noise.)
- **erf vs tanh GELU**: the plain computation run with the exact (erf) GELU instead of the tanh form, through the
  gate: does it leave the pass tier? If not, the two GELU forms are *not distinguishable* at that dtype and case,
  and a pass says nothing about which one a backend uses.

Rows are data (:class:`ResolutionRow`, a results document's ``resolution``); ``compare.report.resolution`` renders
them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from compare.gate.parity import PlainStats, check_tensor, plain_stats, tensor_stats
from compare.problem import fixedbits
from compare.problem.reference import GELU_MODELS, Arith, compute, round_to_dtype

S_MIN = 1e-7
S_MAX = 0.5
#: Bisection stops when the bracket's upper end is within this factor of its lower end.
REL_PRECISION = 1.05
#: A tensor of more elements gets no scale resolution (its note is :data:`NOT_MEASURED`): the bisection runs the whole
#: gate 44 times (two bases, two directions, 11 steps), 8.4 s a run on 58.7M elements on 2 cores, and a Llama 3 8B
#: layer's three weight gradients took it past 15 minutes. Every built-in preset's tensors are below it (blog-mlp's
#: y, the largest: 6.3M).
MAX_ELEMENTS = 2**23
NOT_MEASURED = f"not measured: more than {MAX_ELEMENTS:,} elements"


@dataclass(frozen=True)
class ResolutionRow:
    """The gate's resolution on one tensor of one case (``doc["resolution"]``): ``scale_resolution`` (the smallest
    relative scale error it catches, None when not even :data:`S_MAX` is, or with ``note`` :data:`NOT_MEASURED` when
    the tensor is too large to bisect; ``note`` "below" when even :data:`S_MIN` is), and for a model with a GELU
    whether the erf form fails the gate (``erf_distinguishable``, the checks it
    fails, its relative rms difference from the tanh form in float64 and its scale error); None without a GELU."""

    case: str
    model: str
    label: str
    dtype: str
    tensor: str
    n: int
    scale_resolution: float | None
    note: str = ""
    erf_distinguishable: bool | None = None
    erf_failed: tuple[str, ...] = ()
    erf_rel_rms: float | None = None
    erf_scale_err: float | None = None


def scale_resolution(
    name: str,
    ref: np.ndarray,
    plain: np.ndarray,
    dtype: str,
    stats: PlainStats | None = None,
    bases: Sequence[np.ndarray] = (),
) -> tuple[float | None, str]:
    """Smallest relative scale error the gate catches on this tensor wherever a backend sits, and a note.

    The error ``1 -+ s`` is applied to each of ``bases`` (outputs before their last rounding: the plain computation's,
    another honest one's; ``plain`` itself when none is given) and the result rounded to the dtype. An honest result's
    scale may lie anywhere between none and the plain computation's own, so which ``s`` leaves the pass tier depends
    on where the backend sat and which way the error goes: the largest over both directions and every base is
    returned. ``(s, "")`` with ``s`` the upper end of the final bracket (a scale error of ``s`` leaves the pass tier,
    one of ``s / 1.05`` did not); ``(S_MIN, "below")`` when even ``S_MIN`` is caught everywhere; ``(None, why)`` when
    not even ``S_MAX`` is (the gate is blind to scale on this tensor). ``stats`` (``plain_stats(ref, plain)``) is
    computed once here when not given: every step judges against the same plain computation.
    """
    stats = stats if stats is not None else plain_stats(ref, plain)
    found: list[float] = []
    for base in [np.asarray(b, dtype=np.float64) for b in bases] or [np.asarray(plain, dtype=np.float64)]:
        for sign in (-1.0, 1.0):

            def fails(s: float, base: np.ndarray = base, sign: float = sign) -> bool:
                y = round_to_dtype(base * (1.0 + sign * s), dtype)
                return not check_tensor(name, y, ref, plain, dtype, stats).passed

            if not fails(S_MAX):
                return None, f"not even a {S_MAX:.0%} scale error is caught"
            lo, hi = S_MIN, S_MAX  # passes at lo, fails at hi
            if fails(S_MIN):
                hi = S_MIN
            while hi / lo > REL_PRECISION:
                mid = math.sqrt(lo * hi)
                if fails(mid):
                    hi = mid
                else:
                    lo = mid
            found.append(hi)
    return max(found), "below" if max(found) == S_MIN else ""


def _reversed_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` as the plain computation's float32 GEMM does it, but summed over ``k`` in the reverse order."""
    return fixedbits.matmul32(a[:, ::-1], b[::-1])


def _rel_rms(a: np.ndarray, ref: np.ndarray) -> float:
    d = float(np.sqrt(np.mean((a - ref) ** 2)))
    r = float(np.sqrt(np.mean(ref**2)))
    return d / r if r else math.inf


def _built_in(
    model: str, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, other_gelu: bool = False
) -> dict[str, np.ndarray]:
    return compute(model, x, params, dy, ar, gelu="erf" if other_gelu else "tanh")


def resolution_rows(
    case_name: str,
    model: str,
    label: str,
    dtype: str,
    golden_inputs: tuple[np.ndarray, dict[str, np.ndarray], np.ndarray],
    ref: Mapping[str, np.ndarray],
    plain: dict[str, np.ndarray],
    tensors: Iterable[str],
    compute_in: Callable[..., dict[str, np.ndarray]] | None = None,
    gelu: bool | None = None,
) -> list[ResolutionRow]:
    """Resolution rows of one case for ``tensors`` (``golden_inputs = (x, params, dy)``). ``compute_in(x, params,
    dy, ar, other_gelu=False)`` computes the case in another arithmetic (its reversed-sums twin; default:
    ``reference.compute`` of ``model``), with ``other_gelu`` its GELU in the other form (erf for tanh, and for a
    module's erf GELU tanh): a module case's module (``compare.problem.golden.compute_of``). ``gelu``: whether the
    case has a GELU to tell apart from its other form (None: ``model`` is one of ``GELU_MODELS``)."""
    x, params, dy = golden_inputs
    names = [t for t in tensors if t in ref]
    upstream = None if names == ["y"] else dy  # forward only: no backward to run
    if compute_in is None:
        compute_in = functools.partial(_built_in, model)
    if gelu is None:
        gelu = model in GELU_MODELS  # erf vs tanh means nothing without a GELU
    erf_plain = compute_in(x, params, upstream, Arith.plain(dtype), other_gelu=True) if gelu else None
    erf_exact = compute_in(x, params, upstream, Arith.exact(), other_gelu=True) if gelu else None
    twin = compute_in(x, params, upstream, Arith(dtype, final=False, gemm=_reversed_sums))
    rows = []
    for t in names:
        stats = tensor_stats(ref, plain, t)
        bases = [u[t] for u in (getattr(plain, "unrounded", None), twin) if u is not None]
        big = ref[t].size > MAX_ELEMENTS
        s, note = (None, NOT_MEASURED) if big else scale_resolution(t, ref[t], plain[t], dtype, stats, bases)
        row = ResolutionRow(case_name, model, label, dtype, t, int(ref[t].size), s, note)
        if erf_plain is not None and erf_exact is not None:
            p = check_tensor(t, erf_plain[t], ref[t], plain[t], dtype, stats)
            row = replace(
                row,
                erf_distinguishable=not p.passed,
                erf_failed=tuple(p.failed),
                erf_rel_rms=_rel_rms(erf_exact[t], ref[t]),
                erf_scale_err=p.scale_err,
            )
        rows.append(row)
    return rows


def lookup(rows: Iterable[ResolutionRow], case_name: str, tensor: str) -> ResolutionRow | None:
    """The row of ``case_name`` and ``tensor``, or None."""
    return next((r for r in rows if r.case == case_name and r.tensor == tensor), None)
