"""Parity rules: is a backend's tensor as close to the float64 golden as its dtype allows?

Gate (per tensor): ``max|y - y_ref| <= 2 * max|y_plain - y_ref| + eps``, where ``y_plain`` is the plain
same-dtype emulation of ``compare.reference`` (float32 accumulation, every materialised tensor rounded to the
dtype) and ``eps = 2**-p * max|y_ref|`` with ``p`` the dtype's significand bits (one unit roundoff of the scale).

Second, independent sanity check (it does not trust the emulation): the ``torch.testing.assert_close`` defaults
of the dtype, applied norm-wise and widened by the square root of the longest accumulation ``K`` in the case
(rounding errors of a K-term sum grow like sqrt(K)): ``max|y - y_ref| <= atol + rtol * sqrt(K) * max|y_ref|``.

NaN or Inf on either side fails. A reference whose scale is tiny next to the dtype's ``atol``
(``max|y_ref| < 100 * atol``) is degenerate and refused: it could not tell a right answer from zeros.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from compare.reference import SIGNIFICAND_BITS

#: ``torch.testing.assert_close`` defaults (rtol, atol) per dtype.
ASSERT_CLOSE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
PLAIN_FACTOR = 2.0
DEGENERATE_FACTOR = 100.0


class DegenerateGolden(ValueError):
    """The reference is too small for its tolerance to mean anything."""


@dataclass(frozen=True)
class TensorParity:
    """Numbers for one tensor. ``max_rel_err`` is norm-wise: ``max_abs_err / max|y_ref|``."""

    tensor: str
    max_abs_err: float
    max_rel_err: float
    bound: float
    ratio: float
    plain_err: float
    sanity_bound: float
    worst_index: list[int]
    nonfinite: int
    passed: bool
    why: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def check_tensor(
    name: str, y: np.ndarray, ref: np.ndarray, plain: np.ndarray, dtype: str, reduction: int = 1
) -> TensorParity:
    """Compare ``y`` with the float64 ``ref``; ``plain`` is the same-dtype emulation. All same shape.

    ``reduction`` is the longest accumulation (``K``) in the computation, for the sanity bound.
    """
    if y.shape != ref.shape:
        return TensorParity(name, float("inf"), float("inf"), 0.0, float("inf"), 0.0, 0.0, [], 0, False,
                            f"shape {list(y.shape)} differs from the reference's {list(ref.shape)}")
    y64 = np.asarray(y, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    rtol, atol = ASSERT_CLOSE_DEFAULTS[dtype]
    scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
    if not np.isfinite(scale) or scale < DEGENERATE_FACTOR * atol:
        raise DegenerateGolden(
            f"reference {name!r} is degenerate: max|ref| = {scale:.3g} < {DEGENERATE_FACTOR:g} x atol ({atol:g})"
        )
    nonfinite = int(np.size(y64) - np.count_nonzero(np.isfinite(y64)))
    diff = np.abs(y64 - ref64)
    plain_err = float(np.max(np.abs(np.asarray(plain, dtype=np.float64) - ref64)))
    bound = PLAIN_FACTOR * plain_err + 2.0 ** -SIGNIFICAND_BITS[dtype] * scale
    sanity = atol + rtol * float(np.sqrt(reduction)) * scale
    if nonfinite:
        flat = int(np.argmax(~np.isfinite(y64)))
        worst = [int(i) for i in np.unravel_index(flat, y64.shape)]
        return TensorParity(name, float("nan"), float("nan"), bound, float("nan"), plain_err, sanity, worst,
                            nonfinite, False, f"{nonfinite} NaN/Inf values, first at {worst}")
    flat = int(np.argmax(diff))
    worst = [int(i) for i in np.unravel_index(flat, diff.shape)]
    err = float(diff.flat[flat])
    why = ""
    if err > bound:
        why = (f"max abs error {err:.3g} at {worst} (got {y64.flat[flat]:.6g}, want {ref64.flat[flat]:.6g}) "
               f"exceeds bound {bound:.3g} = {PLAIN_FACTOR:g} x plain {dtype} error {plain_err:.3g} + eps")
    elif err > sanity:
        why = f"max abs error {err:.3g} at {worst} exceeds the assert_close sanity bound {sanity:.3g}"
    return TensorParity(name, err, err / scale, bound, err / bound if bound else float("inf"), plain_err, sanity,
                        worst, 0, not why, why)


@dataclass(frozen=True)
class Parity:
    """Parity of every tensor a backend produced in one mode (``y`` and/or gradients)."""

    tensors: tuple[TensorParity, ...]

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors)

    @property
    def worst(self) -> TensorParity:
        return max(self.tensors, key=lambda t: t.ratio if np.isfinite(t.ratio) else np.inf)

    def failures(self) -> list[str]:
        return [f"{t.tensor}: {t.why}" for t in self.tensors if not t.passed]

    def to_dict(self) -> dict[str, object]:
        w = self.worst
        return {"passed": self.passed, "max_abs_err": w.max_abs_err, "max_rel_err": w.max_rel_err,
                "bound": w.bound, "ratio": w.ratio, "worst_tensor": w.tensor,
                "tensors": [t.to_dict() for t in self.tensors]}


def check_all(
    got: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
    reduction: int = 1,
) -> Parity:
    """Check every tensor in ``got`` (a backend's outputs and gradients) against the reference."""
    missing = [k for k in got if k not in ref]
    if missing:
        raise KeyError(f"backend returned tensors {missing} that have no reference; known: {sorted(ref)}")
    return Parity(tuple(check_tensor(k, got[k], ref[k], plain[k], dtype, reduction) for k in got))
