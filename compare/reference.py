"""Numpy math for the golden reference (float64) and for the "plain" same-dtype emulation.

One code path serves both. ``Arith`` says how every materialised tensor is rounded: the float64 reference
rounds nothing; the plain emulation computes in float32 (what a bf16/fp16 GEMM accumulates in) and rounds every
tensor a plain eager framework would write to memory to the case dtype: for the GLU families ``g``, ``u``,
``act(g)``, ``h``, ``y``; for ``gelu-mlp`` ``fc1(x) + b1`` (one addmm), its GELU and ``fc2(.) + b2``; and every
gradient (bias gradients are sums over the tokens accumulated in float32, rounded once). The parity gate then asks
a backend to be no worse than twice the plain emulation's error.

Parameters use the canonical torch ``(out, in)`` layout: ``gate/up [hidden, dim]``, ``down [dim, hidden]``,
``fc1 [hidden, dim]``, ``b1 [hidden]``, ``fc2 [dim, hidden]``, ``b2 [dim]``, ``weight [out, in]``, ``bias [out]``.
Activations are 2-D ``[tokens, features]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715

#: Models with a GELU (the tanh form): only for these does the exact-erf variant (``gelu="erf"``) mean anything.
GELU_MODELS: tuple[str, ...] = ("geglu", "gelu-mlp")

#: Significand bits (with the implicit one) of each dtype: unit roundoff is ``2 ** -BITS``.
SIGNIFICAND_BITS: dict[str, int] = {"float32": 24, "bfloat16": 8, "float16": 11}


def round_to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """Round to the nearest ``dtype`` value (ties to even) and return it as float32.

    bfloat16 is the top half of a float32: add the rounding bias to the bit pattern, then clear the low 16 bits.
    """
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float32":
        return a32
    if dtype == "float16":
        return a32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits: np.ndarray = a32.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = bits.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(a32), a32, out)
    raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(SIGNIFICAND_BITS)}")


@dataclass(frozen=True)
class Arith:
    """How to compute: accumulate in ``acc`` and round each materialised tensor with ``rnd``."""

    acc: type[np.floating]
    rnd: Callable[[np.ndarray], np.ndarray]

    @staticmethod
    def exact() -> Arith:
        return Arith(np.float64, lambda a: a)

    @staticmethod
    def plain(dtype: str) -> Arith:
        return Arith(np.float32, lambda a: round_to_dtype(a, dtype))

    def mm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` accumulated in ``acc``, rounded once on output (as a GEMM writes it)."""
        return self.rnd(a.astype(self.acc) @ b.astype(self.acc))

    def ew(self, a: np.ndarray) -> np.ndarray:
        """Round the result of an elementwise kernel that computed in ``acc``."""
        return self.rnd(a.astype(self.acc))


def gelu_tanh(g: np.ndarray) -> np.ndarray:
    """GELU, tanh form: ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``."""
    return 0.5 * g * (1.0 + np.tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * g**3)))


def gelu_erf(g: np.ndarray) -> np.ndarray:
    """Exact GELU, ``g Phi(g) = 0.5 g (1 + erf(g / sqrt(2)))``: the form the tanh GELU is checked against."""
    return 0.5 * g * (1.0 + _erf(g / math.sqrt(2.0)))


def gelu_erf_grad(g: np.ndarray) -> np.ndarray:
    """d/dg of :func:`gelu_erf`: ``Phi(g) + g phi(g)``."""
    return 0.5 * (1.0 + _erf(g / math.sqrt(2.0))) + g * np.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_tanh_grad(g: np.ndarray) -> np.ndarray:
    """d/dg of :func:`gelu_tanh`."""
    t = np.tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * g**3))
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g)


def _sigmoid_pair(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sigmoid(s), sigmoid(-s))`` through ``e = exp(-|s|)`` in ``(0, 1]``: no overflow for any ``s``, and
    ``sigmoid(-s) = 1 - sigmoid(s)`` without the cancellation of the subtraction."""
    e = np.exp(-np.abs(s))
    r = 1.0 / (1.0 + e)
    return np.where(s >= 0, r, e * r), np.where(s >= 0, e * r, r)


def silu(s: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``s * sigmoid(s)``."""
    return s * _sigmoid_pair(s)[0]


def silu_grad(s: np.ndarray) -> np.ndarray:
    """d/ds of :func:`silu`: ``sigmoid(s) (1 + s sigmoid(-s))`` (= ``sigmoid(s) (1 + s (1 - sigmoid(s)))``)."""
    sig, sig_neg = _sigmoid_pair(s)
    return sig * (1.0 + s * sig_neg)


def _addmm(x: np.ndarray, w: np.ndarray, b: np.ndarray, ar: Arith) -> np.ndarray:
    """``x @ w.T + b``, the bias folded into the GEMM epilogue: accumulated in ``acc``, rounded once."""
    return ar.rnd(x.astype(ar.acc) @ w.T.astype(ar.acc) + b.astype(ar.acc))


def _bias_grad(dy: np.ndarray, ar: Arith) -> np.ndarray:
    """A bias gradient: ``dy [T, out]`` summed over the tokens in ``acc`` (float32 in the plain run), rounded once."""
    return ar.rnd(dy.astype(ar.acc).sum(axis=0))


def linear_fwd_bwd(
    x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, gelu: str = "tanh"
) -> dict[str, np.ndarray]:
    """``y = x @ W.T + b`` and, given ``dy``, its gradients. ``x [T, in]``, ``y, dy [T, out]`` (no GELU: ``gelu``
    is ignored)."""
    w, b = params["weight"], params["bias"]
    y = _addmm(x, w, b, ar)
    out = {"y": y}
    if dy is not None:
        out["dx"] = ar.mm(dy, w)
        out["dweight"] = ar.mm(dy.T, x)
        out["dbias"] = _bias_grad(dy, ar)
    return out


#: GELU forms: ``tanh`` is the model's (the seed's ``approximate="tanh"``); ``erf`` is the exact form, used only to
#: ask whether the parity gate can tell the two apart (``compare.resolution``).
GELU_FORMS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "tanh": (gelu_tanh, gelu_tanh_grad),
    "erf": (gelu_erf, gelu_erf_grad),
}


Activation = Callable[[np.ndarray], np.ndarray]


def _glu_fwd_bwd(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    act: Activation,
    act_grad: Activation,
) -> dict[str, np.ndarray]:
    """A gated MLP ``y = down(act(gate(x)) * up(x))`` forward and, given ``dy``, backward. ``x, y, dy [T, dim]``;
    ``g, u, h [T, hidden]``. The activation and its derivative are evaluated in ``acc`` and rounded once."""
    wg, wu, wd = params["gate"], params["up"], params["down"]
    g = ar.mm(x, wg.T)
    u = ar.mm(x, wu.T)
    a = ar.ew(act(g.astype(ar.acc)))
    h = ar.ew(a.astype(ar.acc) * u)
    y = ar.mm(h, wd.T)
    out = {"y": y}
    if dy is not None:
        dh = ar.mm(dy, wd)
        out["ddown"] = ar.mm(dy.T, h)
        du = ar.ew(dh.astype(ar.acc) * a)
        da = ar.ew(dh.astype(ar.acc) * u)
        dg = ar.ew(da.astype(ar.acc) * act_grad(g.astype(ar.acc)))
        out["dx"] = ar.ew(ar.mm(dg, wg).astype(ar.acc) + ar.mm(du, wu))
        out["dgate"] = ar.mm(dg.T, x)
        out["dup"] = ar.mm(du.T, x)
    return out


def geglu_fwd_bwd(
    x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, gelu: str = "tanh"
) -> dict[str, np.ndarray]:
    """GeGLU MLP forward and, given ``dy``, backward. ``x, y, dy [T, dim]``; ``g, u, h [T, hidden]``."""
    return _glu_fwd_bwd(x, params, dy, ar, *GELU_FORMS[gelu])


def swiglu_fwd_bwd(
    x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, gelu: str = "tanh"
) -> dict[str, np.ndarray]:
    """SwiGLU MLP ``y = down(silu(gate(x)) * up(x))`` forward and, given ``dy``, backward; shapes as GeGLU's (no
    GELU: ``gelu`` is ignored)."""
    return _glu_fwd_bwd(x, params, dy, ar, silu, silu_grad)


def gelu_mlp_fwd_bwd(
    x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, gelu: str = "tanh"
) -> dict[str, np.ndarray]:
    """GPT-2 style MLP ``y = fc2(gelu(fc1(x) + b1)) + b2`` forward and, given ``dy``, backward.

    ``x, y, dy [T, dim]``; ``f = fc1(x) + b1`` and ``a = gelu(f)`` ``[T, hidden]``. Each linear is one addmm (bias in
    the epilogue, one rounding), as eager ``F.linear`` writes it; the bias gradients are token sums."""
    act, act_grad = GELU_FORMS[gelu]
    w1, b1, w2, b2 = params["fc1"], params["b1"], params["fc2"], params["b2"]
    f = _addmm(x, w1, b1, ar)
    a = ar.ew(act(f.astype(ar.acc)))
    y = _addmm(a, w2, b2, ar)
    out = {"y": y}
    if dy is not None:
        da = ar.mm(dy, w2)
        out["dfc2"] = ar.mm(dy.T, a)
        out["db2"] = _bias_grad(dy, ar)
        df = ar.ew(da.astype(ar.acc) * act_grad(f.astype(ar.acc)))
        out["dx"] = ar.mm(df, w1)
        out["dfc1"] = ar.mm(df.T, x)
        out["db1"] = _bias_grad(df, ar)
    return out


FORWARD_BACKWARD = {
    "linear": linear_fwd_bwd,
    "geglu": geglu_fwd_bwd,
    "swiglu": swiglu_fwd_bwd,
    "gelu-mlp": gelu_mlp_fwd_bwd,
}


def compute(
    model: str, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, ar: Arith, gelu: str = "tanh"
) -> dict[str, np.ndarray]:
    """Run ``model`` on 3-D ``x [batch, seq, dim]``; every returned activation is 3-D, gradients of weights 2-D.

    ``gelu`` picks the GELU form (``tanh``, the model's; ``erf`` only for the gate's resolution analysis) of the
    models that have one (:data:`GELU_MODELS`); the others ignore it."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = None if dy is None else dy.reshape(-1, dy.shape[-1])
    out = FORWARD_BACKWARD[model](x2, params, dy2, ar, gelu)
    out["y"] = out["y"].reshape(*lead, -1)
    if "dx" in out:
        out["dx"] = out["dx"].reshape(*lead, -1)
    return out
