"""Numpy math for the golden reference (float64) and for the "plain" same-dtype emulation, with the same bits on
every machine.

One code path serves both. ``Arith`` says how every GEMM accumulates and how every materialised tensor is rounded:
the float64 reference rounds nothing; the plain emulation accumulates in float32 (what a bf16/fp16 GEMM
accumulates in), sequentially and without FMA, and rounds every tensor a plain eager framework would write to memory
to the case dtype: for the GLU families ``g``, ``u``, ``act(g)``, ``h``, ``y``; for ``gelu-mlp`` ``fc1(x) + b1``
(one addmm), its GELU and ``fc2(.) + b2``; and every gradient (bias gradients are sums over the tokens accumulated
in float32, rounded once). No result depends on the local BLAS or the CPU's instruction set: GEMMs, token sums and
transcendental functions come from ``compare.problem.fixedbits``. The parity gate (``compare.gate.parity``) measures a
backend's error against the plain emulation's.

Parameters use the canonical torch ``(out, in)`` layout: ``gate/up [hidden, dim]``, ``down [dim, hidden]``,
``fc1 [hidden, dim]``, ``b1 [hidden]``, ``fc2 [dim, hidden]``, ``b2 [dim]``, ``weight [out, in]``, ``bias [out]``.
Activations are 2-D ``[tokens, features]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from compare.problem import fixedbits

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715

#: Models with a GELU (the tanh form): only for these does the exact-erf variant (``gelu="erf"``) mean anything.
GELU_MODELS: tuple[str, ...] = ("geglu", "gelu-mlp")

#: Significand bits (with the implicit one) of each dtype: unit roundoff is ``2 ** -BITS``.
SIGNIFICAND_BITS: dict[str, int] = {"float32": 24, "bfloat16": 8, "float16": 11}


def round_to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """Round to the nearest ``dtype`` value (ties to even) and return it as float32.

    bfloat16 is the top half of a float32: ``ml_dtypes``' cast rounds it to nearest even (the bits of adding the
    rounding bias to the pattern and clearing the low 16 bits, on every float32: ``tests/test_fixedbits.py``; ten
    times faster), a NaN kept as it was.
    """
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float32":
        return a32
    if dtype == "float16":
        with np.errstate(over="ignore"):  # beyond 65504 rounds to inf, as a float16 cast does; the gate refuses it
            return a32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        with np.errstate(invalid="ignore", over="ignore"):
            out = a32.astype(ml_dtypes.bfloat16).astype(np.float32)
        nan = np.isnan(a32)
        return np.where(nan, a32, out) if nan.any() else out
    raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(SIGNIFICAND_BITS)}")


#: The numpy type that holds each dtype's values exactly (``ml_dtypes`` for bfloat16).
HELD_TYPES: dict[str, Any] = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def held(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` (values of ``dtype``, e.g. :func:`round_to_dtype`'s) in :data:`HELD_TYPES`' type: a bfloat16 tensor in
    2 bytes an element instead of a float32's 4 (exact: every value is one of the type's)."""
    return np.asarray(a).astype(HELD_TYPES[dtype])


@dataclass(frozen=True)
class Arith:
    """How to compute, with bits fixed by the data on every machine (``compare.problem.fixedbits``).

    ``exact`` (the golden reference): every GEMM and token sum by :func:`~compare.problem.fixedbits.matmul64` (Ozaki's
    error-free splitting: about ``2**-57`` of the operands' scale from the exact product), nothing rounded.
    ``plain`` (the gate's yardstick): every GEMM and token sum accumulated in float32 sequentially over ``k``, no FMA
    (:func:`~compare.problem.fixedbits.matmul32`), the bias added in float32 in the GEMM's epilogue, and every tensor a
    plain
    eager framework writes to memory rounded to ``dtype`` once. Elementwise math is evaluated in float64 (the
    reference) or, for the plain run's activation, op by op in float32 as eager frameworks do in every dtype
    (:func:`activations_in`); products of two dtype values are exact in float64 and rounded once; transcendentals
    come from :mod:`compare.problem.fixedbits`.
    ``final=False`` leaves the outputs (``y``, ``dx``, the weight and bias gradients) as accumulated, before their
    last rounding to the dtype (float32 values): ``compare.gate.resolution`` injects an error there, as a backend would.
    """

    dtype: str | None  # None: exact float64
    final: bool = True
    #: Another GEMM: for the plain run a float32 one (``tests/variants.py`` builds honest implementation differences
    #: with it: other accumulation orders, FMA), for float64 the machine's BLAS (the signature twin, whose last bits
    #: do not matter); None: :func:`~compare.problem.fixedbits.matmul32` / ``matmul64``.
    gemm: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = field(default=None, compare=False)
    #: Rounding of the tensors that are not outputs (None: to ``dtype``); a variant keeps them in float32.
    inner: str | None = None
    #: The dtype the activation is evaluated in op by op (:func:`activations_in`): float64 math for the reference,
    #: float32 for the plain run (None: that default); a variant evaluates it in the case dtype.
    act_in: str | None = None

    @property
    def act_dtype(self) -> str | None:
        return None if self.dtype is None else self.act_in or "float32"

    @staticmethod
    def exact() -> Arith:
        return Arith(None)

    @staticmethod
    def plain(dtype: str, final: bool = True) -> Arith:
        if dtype not in SIGNIFICAND_BITS:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(SIGNIFICAND_BITS)}")
        return Arith(dtype, final)

    @property
    def acc(self) -> type[np.floating]:
        """The accumulation (and GEMM epilogue) dtype: float64 for the reference, float32 for the plain run."""
        return np.float64 if self.dtype is None else np.float32

    def rnd(self, a: np.ndarray, out: bool = False) -> np.ndarray:
        """``a`` (a GEMM's result, or an elementwise kernel's evaluated in float64) rounded as a materialised tensor
        (``out``: an output, rounded only when ``final``)."""
        if self.dtype is None:
            return np.asarray(a, dtype=np.float64)
        if out and not self.final:
            return np.asarray(a, dtype=np.float32)
        return round_to_dtype(a, self.dtype if out or self.inner is None else self.inner)

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (self.gemm or (fixedbits.matmul64 if self.dtype is None else fixedbits.matmul32))(a, b)

    def mm(self, a: np.ndarray, b: np.ndarray, out: bool = False) -> np.ndarray:
        """``a @ b`` accumulated in ``acc``, rounded once on output (as a GEMM writes it)."""
        return self.rnd(self._gemm(a, b), out)

    def addmm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, out: bool = False) -> np.ndarray:
        """``x @ w.T + b``, the bias folded into the GEMM epilogue (added in ``acc``), rounded once."""
        return self.rnd(self._gemm(x, w.T) + b.astype(self.acc), out)

    def colsum(self, a: np.ndarray) -> np.ndarray:
        """``a [T, n]`` summed over its rows (a bias gradient: a sum over the tokens) in ``acc``, rounded once."""
        ones = np.ones((1, a.shape[0]))
        return self.rnd(self._gemm(ones, a)[0], out=True)


Activation = Callable[[np.ndarray], np.ndarray]
#: An activation and its derivative.
Activations = tuple[Activation, Activation]


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def gelu_tanh(g: np.ndarray, tanh: Activation = fixedbits.tanh) -> np.ndarray:
    """GELU, tanh form: ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`` (``tanh`` replaceable: the signature
    twin, :func:`signature_activations`, makes it a little too large)."""
    g = _f64(g)
    return 0.5 * g * (1.0 + tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * (g * g * g))))


def gelu_erf(g: np.ndarray, erf: Activation = fixedbits.erf) -> np.ndarray:
    """Exact GELU, ``g Phi(g) = 0.5 g (1 + erf(g / sqrt(2)))``: the form the tanh GELU is checked against, and
    torch's default ``nn.GELU()`` in a module file's golden (``torch_impl.plain``). ``erf`` is
    :func:`~compare.problem.fixedbits.erf` (the same bits on every machine; libm's ``math.erf`` need not be),
    replaceable: the signature twin makes it a little too large (:func:`signature_activations`)."""
    g = _f64(g)
    return 0.5 * g * (1.0 + erf(g / math.sqrt(2.0)))


def gelu_erf_grad(g: np.ndarray, erf: Activation = fixedbits.erf, exp: Activation = fixedbits.exp) -> np.ndarray:
    """d/dg of :func:`gelu_erf`: ``Phi(g) + g phi(g)`` (``erf`` and the density's ``exp`` replaceable)."""
    g = _f64(g)
    return 0.5 * (1.0 + erf(g / math.sqrt(2.0))) + g * exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)


def gelu_tanh_grad(g: np.ndarray, tanh: Activation = fixedbits.tanh) -> np.ndarray:
    """d/dg of :func:`gelu_tanh`."""
    g = _f64(g)
    t = tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * (g * g * g)))
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g)


def _sigmoid_pair(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sigmoid(s), sigmoid(-s))`` through ``e = exp(-|s|)`` in ``(0, 1]``: no overflow for any ``s``, and
    ``sigmoid(-s) = 1 - sigmoid(s)`` without the cancellation of the subtraction."""
    e = fixedbits.exp(-np.abs(_f64(s)))
    r = 1.0 / (1.0 + e)
    return np.where(s >= 0, r, e * r), np.where(s >= 0, e * r, r)


def silu(s: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``s * sigmoid(s)``."""
    return _f64(s) * _sigmoid_pair(s)[0]


def silu_grad(s: np.ndarray) -> np.ndarray:
    """d/ds of :func:`silu`: ``sigmoid(s) (1 + s sigmoid(-s))`` (= ``sigmoid(s) (1 + s (1 - sigmoid(s)))``)."""
    sig, sig_neg = _sigmoid_pair(s)
    return sig * (1.0 + _f64(s) * sig_neg)


def linear_fwd_bwd(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    acts: Activations,
    weights: bool = True,
) -> dict[str, np.ndarray]:
    """``y = x @ W.T + b`` and, given ``dy``, its gradients. ``x [T, in]``, ``y, dy [T, out]`` (no activation:
    ``acts`` is ignored). Without ``weights`` (here and in the other models') only ``y`` and ``dx``."""
    w, b = params["weight"], params["bias"]
    out = {"y": ar.addmm(x, w, b, out=True)}
    if dy is not None:
        out["dx"] = ar.mm(dy, w, out=True)
        if weights:
            out["dweight"] = ar.mm(dy.T, x, out=True)
            out["dbias"] = ar.colsum(dy)
    return out


#: GELU forms: ``tanh`` is the model's (the blog post's ``approximate="tanh"``); ``erf`` is the exact form, used by the
#: built-in models only to ask whether the parity gate can tell the two apart (``compare.gate.resolution``), and the
#: golden of a module file whose GELU is torch's default (``torch_impl.plain_acts``).
GELU_FORMS: dict[str, Activations] = {"tanh": (gelu_tanh, gelu_tanh_grad), "erf": (gelu_erf, gelu_erf_grad)}


def ulps_off(fn: Activation, ulps: int, seed: int | None, lo: float, hi: float, stream: int = 0) -> Activation:
    """``fn`` as a float32 library computes it, off by up to ``ulps`` float32 ulps: the accurate value rounded to
    float32, moved by a whole number of ulps (uniformly at random in ``[-ulps, ulps]``, drawn from ``seed``; or all by
    ``ulps`` when ``seed`` is None), kept within the function's range ``[lo, hi]`` (a float32 tanh never leaves
    [-1, 1]). Deterministic: the same draw on every machine. The draw depends on the seed and the array's size
    alone; ``stream`` (0 by default) gives a second transcendental of the same activation a draw of its own."""

    def out(x: np.ndarray) -> np.ndarray:
        v = fn(x).astype(np.float32)
        if seed is None:
            k = np.full(v.shape, ulps, dtype=np.int64)
        else:
            entropy = [seed, v.size] if stream == 0 else [seed, v.size, stream]
            k = np.random.Generator(np.random.PCG64(entropy)).integers(-ulps, ulps + 1, v.shape)
        for _ in range(abs(ulps)):  # one ulp at a time: exact float32 neighbours, across binades
            v = np.where(k != 0, np.nextafter(v, v + np.sign(k).astype(np.float32)), v)
            k = k - np.sign(k)
        return np.clip(v.astype(np.float64), lo, hi)

    return out


def exp_saturating(x: np.ndarray) -> np.ndarray:
    """``exp`` that returns inf above 710 without a warning (a sigmoid's ``exp(-s)`` for very negative ``s``)."""
    with np.errstate(over="ignore"):
        return fixedbits.exp(np.minimum(x, 710.0))


#: How far (float32 ulps) a library's tanh, exp or erf may be off: the plain computation's envelope twin
#: (:func:`envelope_activations`) draws its errors within this.
TRANSCENDENTAL_ERROR_ULPS = 4


def envelope_activations(model: str, seed: int, gelu: str = "tanh") -> Activations:
    """The plain computation's float32 activation with its tanh (GELU) or exp (SiLU) off by up to
    :data:`TRANSCENDENTAL_ERROR_ULPS` ulps at random (drawn from ``seed``): a float32 library of ordinary accuracy.
    Where GELU's derivative is ill-conditioned (``1 - tanh^2`` with tanh near -1, on heavy-tailed inputs) this moves
    the result far more than the plain computation's own error; the gate's fail lines allow for it. The erf GELU
    (``gelu="erf"``, a module file's; no built-in model has it) has its erf off so, and the ``exp`` of its
    derivative's density with a draw of its own."""
    e = TRANSCENDENTAL_ERROR_ULPS
    if gelu == "erf" and model != "swiglu":
        return activations_in(
            model,
            "erf",
            "float32",
            erf=ulps_off(fixedbits.erf, e, seed, -1.0, 1.0),
            exp=ulps_off(exp_saturating, e, seed, 0.0, math.inf, stream=1),
        )
    return activations_in(
        model,
        "tanh",
        "float32",
        tanh=ulps_off(fixedbits.tanh, e, seed, -1.0, 1.0),
        exp=ulps_off(exp_saturating, e, seed, 0.0, math.inf),
    )


def signature_activations(model: str, ulps: int, gelu: str = "tanh") -> Activations:
    """The float64 activation of ``model`` and its derivative with its transcendental (GELU's tanh, SiLU's ``exp(-s)``
    in ``1 / (1 + exp(-s))``, as libraries write the sigmoid) a float32 library's: rounded to float32 and moved by
    ``ulps`` ulps all one way (:func:`ulps_off`), everything else exact. Two such twins, ``+-``
    :data:`TRANSCENDENTAL_ERROR_ULPS`, less the one at 0 ulps, give the shapes over every output element of a
    transcendental biased all one way: the parity gate's ``scale`` check fits them beside a pure scale error, so the
    two are told apart (a float32 tanh 4 ulp high moves y's scale by about 2 unit roundoffs; a wrong scale of 1.5
    must still fail). The erf GELU (``gelu="erf"``) has its erf and its derivative's ``exp`` moved so together."""
    if model == "swiglu":
        exp = ulps_off(exp_saturating, ulps, None, 0.0, math.inf)

        def sig(s: np.ndarray) -> np.ndarray:
            return 1.0 / (1.0 + exp(-_f64(s)))

        return (lambda s: _f64(s) * sig(s)), (lambda s: sig(s) * (1.0 + _f64(s) * (1.0 - sig(s))))
    if gelu == "erf":
        erf = ulps_off(fixedbits.erf, ulps, None, -1.0, 1.0)
        exp = ulps_off(exp_saturating, ulps, None, 0.0, math.inf)
        return (lambda g: gelu_erf(g, erf)), (lambda g: gelu_erf_grad(g, erf, exp))
    tanh = ulps_off(fixedbits.tanh, ulps, None, -1.0, 1.0)
    return (lambda g: gelu_tanh(g, tanh)), (lambda g: gelu_tanh_grad(g, tanh))


def activations_in(
    model: str,
    gelu: str,
    dtype: str,
    tanh: Activation | None = None,
    exp: Activation | None = None,
    erf: Activation | None = None,
) -> Activations:
    """The activation of ``model`` and its derivative evaluated op by op in ``dtype``, as a framework's elementwise
    kernel does: every intermediate and every constant rounded to ``dtype``, each transcendental (tanh, exp, erf)
    evaluated accurately and rounded. float32 is the plain computation's (what eager frameworks do in every dtype:
    16-bit inputs are computed in float32); a 16-bit ``dtype`` is ``jax.nn.gelu``'s way on 16-bit inputs. Takes and
    returns float64 arrays holding ``dtype`` values; ``tanh``, ``exp`` and ``erf`` may be replaced
    (``tests/variants.py`` makes them a few ulp off; so does the erf GELU's envelope twin). In float32 the derivative
    of GELU loses its relative accuracy where ``tanh`` rounds to -1 (``1 - t*t``: a few ulp of 1 times a large
    factor): so does every float32 kernel."""

    def r(a: np.ndarray | float) -> np.ndarray:
        return round_to_dtype(np.asarray(a, dtype=np.float64), dtype).astype(np.float64)

    tanh = tanh or fixedbits.tanh
    exp = exp or exp_saturating
    erf = erf or fixedbits.erf
    half, one = r(0.5), r(1.0)
    if model == "swiglu":

        def sig(s: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):  # exp(-s) = inf for very negative s: sigmoid 0, as in float32
                return r(one / r(one + r(exp(r(-s)))))

        def silu_d(s: np.ndarray) -> np.ndarray:
            s = r(s)
            return r(s * sig(s))

        def silu_grad_d(s: np.ndarray) -> np.ndarray:
            s = r(s)
            sg = sig(s)
            return r(sg * r(one + r(s * r(one - sg))))

        return silu_d, silu_grad_d
    if gelu == "erf":
        inv_sqrt2, inv_sqrt_2pi = r(1.0 / math.sqrt(2.0)), r(1.0 / math.sqrt(2.0 * math.pi))

        def cdf(g: np.ndarray) -> np.ndarray:
            return r(half * r(one + r(erf(r(g * inv_sqrt2)))))

        def erf_d(g: np.ndarray) -> np.ndarray:
            g = r(g)
            return r(g * cdf(g))

        def erf_grad_d(g: np.ndarray) -> np.ndarray:
            g = r(g)
            pdf = r(r(exp(r(r(-half * g) * g))) * inv_sqrt_2pi)
            return r(cdf(g) + r(g * pdf))

        return erf_d, erf_grad_d
    c1, c3, c3x3 = r(SQRT_2_OVER_PI), r(GELU_CUBIC), r(3.0 * GELU_CUBIC)

    def tanh_of_inner(g: np.ndarray) -> np.ndarray:
        return r(tanh(r(c1 * r(g + r(c3 * r(r(g * g) * g))))))

    def gelu_d(g: np.ndarray) -> np.ndarray:
        g = r(g)
        return r(r(half * g) * r(one + tanh_of_inner(g)))

    def gelu_grad_d(g: np.ndarray) -> np.ndarray:
        g = r(g)
        t = tanh_of_inner(g)
        left = r(half * r(one + t))
        right = r(r(r(half * g) * r(one - r(t * t))) * r(c1 * r(one + r(c3x3 * r(g * g)))))
        return r(left + right)

    return gelu_d, gelu_grad_d


def glu_fwd_bwd(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    acts: Activations,
    weights: bool = True,
) -> dict[str, np.ndarray]:
    """GeGLU (``acts`` a GELU) or SwiGLU (SiLU) MLP ``y = down(act(gate(x)) * up(x))`` forward and, given ``dy``,
    backward. ``x, y, dy [T, dim]``; ``g, u, h [T, hidden]``. The activation and its derivative are evaluated in
    ``acc`` and rounded once."""
    act, act_grad = acts
    wg, wu, wd = params["gate"], params["up"], params["down"]
    g = ar.mm(x, wg.T)
    u = ar.mm(x, wu.T)
    a = ar.rnd(act(g))
    h = ar.rnd(_f64(a) * u)
    out = {"y": ar.mm(h, wd.T, out=True)}
    if dy is not None:
        dh = ar.mm(dy, wd)
        if weights:
            out["ddown"] = ar.mm(dy.T, h, out=True)
        du = ar.rnd(_f64(dh) * a)
        da = ar.rnd(_f64(dh) * u)
        dg = ar.rnd(_f64(da) * act_grad(g))
        # two GEMMs, each written rounded, then added (in float64: exact for two float32 values) and rounded
        out["dx"] = ar.rnd(_f64(ar.mm(dg, wg)) + ar.mm(du, wu), out=True)
        if weights:
            out["dgate"] = ar.mm(dg.T, x, out=True)
            out["dup"] = ar.mm(du.T, x, out=True)
    return out


def gelu_mlp_fwd_bwd(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    acts: Activations,
    weights: bool = True,
) -> dict[str, np.ndarray]:
    """GPT-2 style MLP ``y = fc2(gelu(fc1(x) + b1)) + b2`` forward and, given ``dy``, backward.

    ``x, y, dy [T, dim]``; ``f = fc1(x) + b1`` and ``a = gelu(f)`` ``[T, hidden]``. Each linear is one addmm (bias in
    the epilogue, one rounding), as eager ``F.linear`` writes it; the bias gradients are token sums."""
    act, act_grad = acts
    w1, b1, w2, b2 = params["fc1"], params["b1"], params["fc2"], params["b2"]
    f = ar.addmm(x, w1, b1)
    a = ar.rnd(act(f))
    out = {"y": ar.addmm(a, w2, b2, out=True)}
    if dy is not None:
        da = ar.mm(dy, w2)
        if weights:
            out["dfc2"] = ar.mm(dy.T, a, out=True)
            out["db2"] = ar.colsum(dy)
        df = ar.rnd(_f64(da) * act_grad(f))
        out["dx"] = ar.mm(df, w1, out=True)
        if weights:
            out["dfc1"] = ar.mm(df.T, x, out=True)
            out["db1"] = ar.colsum(df)
    return out


FORWARD_BACKWARD = {"linear": linear_fwd_bwd, "geglu": glu_fwd_bwd, "swiglu": glu_fwd_bwd, "gelu-mlp": gelu_mlp_fwd_bwd}


def activations(model: str, gelu: str = "tanh", dtype: str | None = None) -> Activations:
    """The activation of ``model`` and its derivative: SiLU for SwiGLU, the ``gelu`` form of GELU otherwise (a linear
    layer has none; it gets the GELU, unused); in float64 (``dtype`` None) or op by op in ``dtype``
    (:func:`activations_in`)."""
    if dtype is not None:
        return activations_in(model, gelu, dtype)
    return (silu, silu_grad) if model == "swiglu" else GELU_FORMS[gelu]


def compute(
    model: str,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    gelu: str = "tanh",
    acts: Activations | None = None,
    weights: bool = True,
) -> dict[str, np.ndarray]:
    """Run ``model`` on 3-D ``x [batch, seq, dim]``; every returned activation is 3-D, gradients of weights 2-D.

    ``gelu`` picks the GELU form (``tanh``, the model's; ``erf`` only for the gate's resolution analysis) of the
    models that have one (:data:`GELU_MODELS`); the others ignore it. ``acts`` replaces the activation and its
    derivative (each float64 in, float64 out; ``tests/variants.py`` evaluates them other ways). Without ``weights``
    no weight or bias gradient is computed (``y`` and ``dx`` alone: per token, so a few tokens cost a few rows)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = None if dy is None else dy.reshape(-1, dy.shape[-1])
    out = FORWARD_BACKWARD[model](x2, params, dy2, ar, acts or activations(model, gelu, ar.act_dtype), weights)
    out["y"] = out["y"].reshape(*lead, -1)
    if "dx" in out:
        out["dx"] = out["dx"].reshape(*lead, -1)
    return out


def plain_run(
    model: str,
    dtype: str,
    seed: int,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    gelu: str = "tanh",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    """The gate's yardstick on ``(x, params, dy)``: the plain ``dtype`` computation with its outputs unrounded
    (``Arith.plain(dtype, final=False)``) and, in float32 for a model with an activation, its envelope twin
    (:func:`envelope_activations` drawn from the case's ``seed``) and the signatures of a transcendental biased all
    one way (``[2, *shape]`` per tensor: down and up by :data:`TRANSCENDENTAL_ERROR_ULPS`, each a float64 twin through
    the machine's BLAS less the unbiased one, :func:`signature_activations`; both None otherwise). A run past the
    dtype's range gives inf/NaN without a warning: ``compare.gate.parity.check_plain`` refuses it by name. ``gelu``:
    the GELU form of a model with one (the erf form: a near variant, ``compare.gate.near_variants``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        unrounded = compute(model, x, params, dy, Arith.plain(dtype, final=False), gelu=gelu)
        envelope = signature = None
        if dtype == "float32" and model != "linear":
            envelope = compute(model, x, params, dy, Arith.plain(dtype), acts=envelope_activations(model, seed, gelu))
            signature = signatures(
                lambda ar, ulps: compute(model, x, params, dy, ar, acts=signature_activations(model, ulps, gelu))
            )
    return unrounded, envelope, signature


def signatures(twin: Callable[[Arith, int], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The signatures of a transcendental biased all one way (:func:`plain_run`): ``twin(ar, ulps)`` is the
    computation in ``ar`` (float64 through the machine's BLAS) with its transcendental ``ulps`` float32 ulps off
    (:func:`signature_activations`); per tensor ``[2, *shape]``: the twins at ``-`` and ``+``
    :data:`TRANSCENDENTAL_ERROR_ULPS`, each less the one at 0 ulps. ``torch_impl.plain`` runs it on any module."""
    ar = Arith(None, gemm=np.matmul)
    off = (-TRANSCENDENTAL_ERROR_ULPS, TRANSCENDENTAL_ERROR_ULPS)
    runs = {k: twin(ar, k) for k in (0, *off)}
    return {t: np.stack([runs[k][t] - runs[0][t] for k in off]) for t in runs[0]}
