"""Mixture-of-experts MLP blocks in numpy, forward and backward, in an :class:`~compare.problem.reference.Arith`:
the router, ``E`` gated experts and the weighted combine, as Qwen3-MoE, Mixtral and gpt-oss compute them.

With ``Arith.exact()`` this is the float64 golden, with the same bits on every machine, as the dense models'
(``compare.problem.reference``): every GEMM, every sum over experts, tokens or features goes through the Arith's
GEMM (``fixedbits.matmul64``, Ozaki's error-free splitting), the exponential is ``fixedbits.exp``, and the rest is
IEEE elementwise arithmetic. A plain Arith rounds where the dense GLU models' plain computation does (router
logits, each expert's ``gate_up``, its activation, its output, every gradient); where each model's eager block
rounds otherwise (transformers keeps Mixtral's combine weights in float32, takes every router's softmax in float32
and adds gpt-oss's biases after its GEMMs) is not modelled yet, and no plain MoE computation is judged with yet.

Routing: per token the ``k`` experts of largest score, ties to the lower expert index (a stable sort), in one of
two orders:
``softmax-topk`` (Qwen3-MoE, Mixtral: a softmax over all ``E`` logits, the ``k`` largest probabilities, optionally
renormalised to sum to 1) or ``topk-softmax`` (gpt-oss: the ``k`` largest logits, a softmax over those ``k``).
With renormalisation the two orders are one function (``p_j / sum_K p = exp(l_j) / sum_K exp(l)``); without it they
differ.
Experts: ``swiglu`` (``silu(gate) * up``) or gpt-oss's ``clamped`` SwiGLU (``(up + 1) * gate * sigmoid(alpha *
gate)`` with ``gate`` clamped above at ``limit`` and ``up`` to ``[-limit, limit]``), gate and up rows of one fused
``gate_up`` weight either ``concat`` (gate rows first, then up: ``chunk(2)``) or ``interleaved`` (gate at even
rows: ``[..., ::2]``). The combine adds each expert's weighted output to its tokens' rows in expert order
(``index_add_``'s).

Parameters, canonical names in torch's ``(out, in)`` layout: ``router [E, dim]``, ``gate_up [E, 2 * hidden, dim]``,
``down [E, dim, hidden]`` and, with ``biases`` (gpt-oss), ``router_bias [E]``, ``gate_up_bias [E, 2 * hidden]``,
``down_bias [E, dim]``. Activations are 2-D ``[tokens, features]``; the gradients are ``dx`` and ``d<name>`` for
every parameter (the router's through the combine weights: the top-k choice itself has no gradient).

Near-ties: top-k is discontinuous, and a backend whose logits are off by its dtype's rounding may choose another
expert where two scores are that close. :func:`routable` says whether a backend's choice is a top-k choice of
logits within a tolerance of the golden's, and ``chosen`` computes the golden of the experts a backend chose: an
honest backend is judged against the golden of its own routing, a wrong router (a choice no such logits make) is
named as one.

Not here yet: shared experts (DeepSeek-V3, Qwen2-MoE), and a router's auxiliary load-balancing loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compare.problem import fixedbits
from compare.problem.reference import Arith, _f64, _sigmoid_pair, silu, silu_grad

ROUTER_ORDERS = ("softmax-topk", "topk-softmax")
GLUS = ("swiglu", "clamped")
LAYOUTS = ("concat", "interleaved")


@dataclass(frozen=True)
class MoeSpec:
    """What a mixture-of-experts block computes (module docstring): ``experts`` (``E``) and ``top_k`` (``k``), the
    router's ``order`` and whether the ``k`` weights are ``renormalize``-d, the experts' ``glu`` and ``layout``, and
    whether every linear has a bias; ``alpha``, ``limit`` and the ``offset`` added to ``up`` are the clamped SwiGLU's
    (gpt-oss: 1.702, 7 and 1; another limit or offset is a near variant, ``compare.gate.near_variants``)."""

    experts: int
    top_k: int
    order: str = "softmax-topk"
    renormalize: bool = True
    glu: str = "swiglu"
    layout: str = "concat"
    biases: bool = False
    alpha: float = 1.702
    limit: float = 7.0
    offset: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be in 1..experts ({self.experts}), got {self.top_k}")
        for name, value, known in (("order", self.order, ROUTER_ORDERS), ("glu", self.glu, GLUS)):
            if value not in known:
                raise ValueError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; known: {', '.join(LAYOUTS)}")

    def weight_shapes(self, dim: int, hidden: int) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape (module docstring), in the order a checkpoint lists them."""
        e = self.experts
        shapes: dict[str, tuple[int, ...]] = {
            "router": (e, dim),
            "gate_up": (e, 2 * hidden, dim),
            "down": (e, dim, hidden),
        }
        if self.biases:
            shapes |= {"router_bias": (e,), "gate_up_bias": (e, 2 * hidden), "down_bias": (e, dim)}
        return shapes


def gpt_oss(experts: int, top_k: int) -> MoeSpec:
    """gpt-oss's :class:`MoeSpec` with ``experts`` and ``top_k`` (transformers' ``GptOssTopKRouter`` and
    ``GptOssExperts``): top-k then a softmax over the k, the clamped SwiGLU with interleaved gate and up, biases."""
    return MoeSpec(experts, top_k, "topk-softmax", False, "clamped", "interleaved", True)


@dataclass(frozen=True)
class MoePreset:
    """A mixture-of-experts block of a published model: its :class:`MoeSpec`, the model's width ``dim``, each
    expert's ``hidden`` width, the ``tokens`` a run takes by default, and what it is."""

    name: str
    spec: MoeSpec
    dim: int
    hidden: int
    tokens: int
    about: str


#: The published blocks, each from the model's config.json on its Hugging Face model card (named beside it), and
#: CPU-sized ones that keep the real expert count and top-k with narrow experts and few tokens (transformers' own
#: blocks agree with their goldens: tests/test_moe_reference.py).
MOE_PRESETS: dict[str, MoePreset] = {
    p.name: p
    for p in (
        # Qwen/Qwen3-30B-A3B: hidden_size 2048, moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8,
        # norm_topk_prob true
        MoePreset("qwen3-moe", MoeSpec(128, 8), 2048, 768, 16, "Qwen3-30B-A3B's MoE block (2048 -> 128 x 768, top-8)"),
        # mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
        # num_experts_per_tok 2 (renormalised: transformers' MixtralTopKRouter)
        MoePreset("mixtral", MoeSpec(8, 2), 4096, 14336, 16, "Mixtral 8x7B's MoE block (4096 -> 8 x 14336, top-2)"),
        # openai/gpt-oss-20b: hidden_size 2880, intermediate_size 2880, num_local_experts 32, num_experts_per_tok 4,
        # swiglu_limit 7.0 (alpha 1.702: transformers' GptOssConfig)
        MoePreset("gpt-oss-20b", gpt_oss(32, 4), 2880, 2880, 16, "gpt-oss-20b's MoE block (2880 -> 32 x 2880, top-4)"),
        MoePreset("qwen3-moe-cpu", MoeSpec(128, 8), 64, 32, 24, "Qwen3-30B-A3B's routing (128 experts, top-8), narrow"),
        MoePreset("mixtral-cpu", MoeSpec(8, 2), 64, 32, 24, "Mixtral 8x7B's routing (8 experts, top-2), narrow"),
        MoePreset("gpt-oss-20b-cpu", gpt_oss(32, 4), 64, 32, 24, "gpt-oss-20b's routing and experts, narrow"),
    )
}


#: The mixture-of-experts models of a case (``compare.problem.cases``), each a published block's :class:`MoeSpec`
#: (its expert count, top-k, router and experts: :data:`MOE_PRESETS`' full-size blocks'); ``dim`` and ``hidden``
#: (each expert's width) come from the case's shape. Kept out of ``cases.MODELS``, the dense families every dense
#: enumeration walks (committed golden files, checkpoint names, the dense backends' default models).
MOE_SPECS: dict[str, MoeSpec] = {
    "moe-qwen3": MoeSpec(128, 8),
    "moe-mixtral": MoeSpec(8, 2),
    "moe-gpt-oss": gpt_oss(32, 4),
}
#: What each MoE model computes, one line each (``python -m compare list``).
MOE_ABOUT: dict[str, str] = {
    "moe-qwen3": "Qwen3-MoE block: softmax over 128 experts, top-8 renormalised, SwiGLU experts (gate_up concat)",
    "moe-mixtral": "Mixtral block: softmax over 8 experts, top-2 renormalised, SwiGLU experts (gate_up concat)",
    "moe-gpt-oss": (
        "gpt-oss block: top-4 of 32 logits then a softmax over the 4, clamped SwiGLU (gate_up interleaved), biases"
    ),
}


# --- routing distributions: a case axis (``Case.routing``) -------------------------------------------------------

#: The routing distributions a MoE case can be drawn with: ``uniform`` (the default: every expert's logits zero-mean
#: alike, as the router and the inputs are drawn), ``zipf`` (expert ``e``'s logits centred at ``STEER_SHIFT / (e +
#: 1)``: a few experts take most tokens, as a trained router's often do), ``hot`` (expert 0 centred at
#: ``STEER_SHIFT``: nearly every token takes it) and ``empty`` (every fourth expert, ``e % 4 == 3``, centred at
#: ``-1.5 STEER_SHIFT``: those experts receive no token, and a grouped kernel meets empty groups).
ROUTINGS: tuple[str, ...] = ("uniform", "zipf", "hot", "empty")
#: The routings that change a case's draws (:data:`ROUTINGS` but ``uniform``, which is ``Case.routing = None``).
STEERED: tuple[str, ...] = ROUTINGS[1:]
#: How far a steered case's inputs move along its routing direction ``u``, in units of an input's standard deviation
#: (each element of ``x`` is drawn with variance 1): a logit's own spread is about 1 (a router row's norm), so the
#: offsets ``STEER_SHIFT * c_e`` below decide the routing.
STEER_SHIFT = 6.0


def steer_direction(seed: int, dim: int) -> np.ndarray:
    """The unit vector ``u [dim]`` a steered case of ``seed`` moves its inputs along (float64; the same bits on
    every machine: a PCG64 draw, its norm by ``math.fsum`` and ``math.sqrt``, both correctly rounded)."""
    g = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x57EE4]))).standard_normal(dim)
    return g / math.sqrt(math.fsum((g * g).tolist()))


def steer_offsets(routing: str, experts: int) -> np.ndarray:
    """``c [E]``: each expert's router row gains ``c_e u``, so its logits on a steered input centre at
    ``STEER_SHIFT * c_e`` (:data:`ROUTINGS`)."""
    e = np.arange(experts)
    if routing == "zipf":
        return 1.0 / (e + 1.0)
    if routing == "hot":
        return (e == 0).astype(np.float64)
    if routing == "empty":
        return np.where(e % 4 == 3, -1.5, 0.0)
    raise ValueError(f"no routing offsets for {routing!r}; steered routings: {', '.join(STEERED)}")


def steer_input(routing: str | None, x: np.ndarray, seed: int) -> np.ndarray:
    """``x [..., dim]`` of a case with ``routing`` (None: uniform, unchanged) moved by ``STEER_SHIFT u``: every
    draw of the case, golden and fresh alike (elementwise IEEE arithmetic: the same bits everywhere)."""
    if routing is None:
        return x
    return x + STEER_SHIFT * steer_direction(seed, x.shape[-1])


def steer_router(routing: str | None, router: np.ndarray, seed: int) -> np.ndarray:
    """``router [E, dim]`` of a case with ``routing`` (None: unchanged) plus ``c_e u`` on each row
    (:func:`steer_offsets`), before it is rounded to the case's dtype."""
    if routing is None:
        return router
    u = steer_direction(seed, router.shape[1])
    return router + steer_offsets(routing, router.shape[0])[:, None] * u[None, :]


@dataclass(frozen=True)
class Routing:
    """A router's decision on ``T`` tokens: ``experts [T, k]`` (each row's experts, largest score first) and their
    combine ``weights [T, k]``, with what the backward needs: ``probs [T, E]`` (``softmax-topk``: the softmax over
    all experts) or ``[T, k]`` (``topk-softmax``: the softmax over the chosen), and the renormalising sums ``[T]``."""

    experts: np.ndarray
    weights: np.ndarray
    probs: np.ndarray
    sums: np.ndarray | None


def _sum_last(a: np.ndarray, ar: Arith) -> np.ndarray:
    """``a [T, n]`` summed over its last axis through the Arith's GEMM (numpy's own reduction may reassociate with
    the CPU's vector width), rounded as a sum's output."""
    return ar.rnd(ar._gemm(a, np.ones((a.shape[-1], 1)))[:, 0])


def softmax(logits: np.ndarray, ar: Arith) -> np.ndarray:
    """Softmax over the last axis of ``logits [T, n]``: ``exp(l - max l)`` (``fixedbits.exp``) over its sum."""
    e = fixedbits.exp(_f64(logits) - np.max(logits, axis=-1, keepdims=True))
    return ar.rnd(e / _f64(_sum_last(e, ar))[:, None])


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices ``[T, k]`` of each row's ``k`` largest ``scores``, largest first, ties to the lower index."""
    return np.argsort(-_f64(scores), axis=-1, kind="stable")[:, :k]


def routable(chosen: np.ndarray, logits: np.ndarray, tol: np.ndarray | float) -> np.ndarray:
    """Per token ``[T]``: whether the experts ``chosen [T, k]`` are a top-k choice of logits each within ``tol`` (per
    token, or one figure) of ``logits [T, E]``: a router whose logits are that far off may choose them honestly. A set
    ``S`` is the top k of some such logits exactly when ``min_S l + tol >= max_(not S) l - tol``. With ``tol`` 0 that
    is the exact top k, ties either way. Rows with a repeated or out-of-range expert are not routable."""
    lg = _f64(logits)
    t, e = lg.shape
    k = chosen.shape[1]
    ok = np.all((chosen >= 0) & (chosen < e), axis=1)
    picked = np.zeros((t, e), dtype=bool)
    rows = np.arange(t)[:, None]
    safe = np.where(ok[:, None], chosen, 0)
    picked[rows, safe] = True
    ok &= picked.sum(axis=1) == k  # k distinct experts
    low = np.min(np.where(picked, lg, np.inf), axis=1)
    high = np.max(np.where(picked, -np.inf, lg), axis=1) if k < e else np.full(t, -np.inf)
    return ok & (low + np.asarray(tol) >= high - np.asarray(tol))


def route(logits: np.ndarray, spec: MoeSpec, ar: Arith, chosen: np.ndarray | None = None) -> Routing:
    """The router's :class:`Routing` from its ``logits [T, E]``; ``chosen [T, k]``: those experts instead of its own
    top k (the golden of what a backend chose on near-ties, :func:`routable`), in that order."""
    rows = np.arange(logits.shape[0])[:, None]
    if chosen is not None and chosen.shape != (logits.shape[0], spec.top_k):
        raise ValueError(f"chosen experts of shape {chosen.shape}; the router chooses {(logits.shape[0], spec.top_k)}")
    if spec.order == "softmax-topk":
        probs = softmax(logits, ar)
        experts = top_k(probs, spec.top_k) if chosen is None else chosen
        weights = probs[rows, experts]
        sums = None
        if spec.renormalize:
            sums = _sum_last(weights, ar)
            weights = ar.rnd(_f64(weights) / _f64(sums)[:, None])
        return Routing(experts, weights, probs, sums)
    experts = top_k(logits, spec.top_k) if chosen is None else chosen
    probs = softmax(logits[rows, experts], ar)
    return Routing(experts, probs, probs, None)


def route_backward(d_weights: np.ndarray, r: Routing, spec: MoeSpec, ar: Arith) -> np.ndarray:
    """``d logits [T, E]`` from the gradient of the combine weights ``[T, k]`` (zero at the experts not chosen)."""
    t, e = d_weights.shape[0], spec.experts
    rows = np.arange(t)[:, None]
    dw = _f64(d_weights)
    if spec.order == "topk-softmax":  # w = softmax(l_K): dl_K = w (dw - sum(w dw))
        w = _f64(r.probs)
        dl = np.zeros((t, e))
        dl[rows, r.experts] = ar.rnd(w * (dw - _f64(_sum_last(w * dw, ar))[:, None]))
        return dl
    dp_k = dw
    if r.sums is not None:  # w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S
        w = _f64(r.weights)
        dp_k = (dw - _f64(_sum_last(dw * w, ar))[:, None]) / _f64(r.sums)[:, None]
    dp = np.zeros((t, e))
    dp[rows, r.experts] = dp_k
    p = _f64(r.probs)  # p = softmax(l): dl = p (dp - sum(p dp))
    return ar.rnd(p * (dp - _f64(_sum_last(p * dp, ar))[:, None]))


def _gate_up(gu: np.ndarray, spec: MoeSpec) -> tuple[np.ndarray, np.ndarray]:
    """``gate, up [T, hidden]`` of a fused ``gate_up [T, 2 * hidden]`` in the spec's layout."""
    if spec.layout == "interleaved":
        return gu[:, ::2], gu[:, 1::2]
    half = gu.shape[1] // 2
    return gu[:, :half], gu[:, half:]


def _fused(dg: np.ndarray, du: np.ndarray, spec: MoeSpec) -> np.ndarray:
    """The inverse of :func:`_gate_up`: ``[T, 2 * hidden]`` from the two halves."""
    if spec.layout == "interleaved":
        out = np.empty((dg.shape[0], 2 * dg.shape[1]))
        out[:, ::2], out[:, 1::2] = dg, du
        return out
    return np.concatenate([dg, du], axis=1)


def _glu(gate: np.ndarray, up: np.ndarray, spec: MoeSpec, ar: Arith) -> np.ndarray:
    """The expert's gated activation ``h [T, hidden]`` (module docstring)."""
    g, u = _f64(gate), _f64(up)
    if spec.glu == "swiglu":
        return ar.rnd(ar.rnd(silu(g)) * u)
    gc, uc = np.minimum(g, spec.limit), np.clip(u, -spec.limit, spec.limit)
    glu = ar.rnd(gc * _sigmoid_pair(spec.alpha * gc)[0])
    return ar.rnd((uc + spec.offset) * glu)


def _glu_backward(dh: np.ndarray, gate: np.ndarray, up: np.ndarray, spec: MoeSpec, ar: Arith) -> np.ndarray:
    """``d gate_up [T, 2 * hidden]`` from ``dh``: a clamp passes the gradient where its input is within its limits
    (torch's ``clamp`` backward: the bounds included)."""
    g, u, d = _f64(gate), _f64(up), _f64(dh)
    if spec.glu == "swiglu":
        return _fused(ar.rnd(d * u * silu_grad(g)), ar.rnd(d * _f64(ar.rnd(silu(g)))), spec)
    gc, uc = np.minimum(g, spec.limit), np.clip(u, -spec.limit, spec.limit)
    sig, sig_neg = _sigmoid_pair(spec.alpha * gc)
    glu = _f64(ar.rnd(gc * sig))
    dglu = sig * (1.0 + spec.alpha * gc * sig_neg)  # d/dg of g sigmoid(alpha g)
    dg = ar.rnd(d * (uc + spec.offset) * dglu * (g <= spec.limit))
    du = ar.rnd(d * glu * (np.abs(u) <= spec.limit))
    return _fused(dg, du, spec)


def moe_fwd_bwd(
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    spec: MoeSpec,
    weights: bool = True,
    chosen: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The block's ``y [T, dim]`` on ``x [T, dim]`` and, given ``dy``, ``dx`` and (with ``weights``) every
    parameter's gradient; ``routing`` (the experts chosen, ``[T, k]`` integers) and ``logits [T, E]`` too, for the
    gate to compare. ``chosen``: route each token to these experts instead (:func:`route`)."""
    b = spec.biases
    wr = params["router"]
    logits = ar.addmm(x, wr, params["router_bias"]) if b else ar.mm(x, wr.T)
    r = route(logits, spec, ar, chosen)
    y = np.zeros((x.shape[0], params["down"].shape[1]))
    kept = []  # per expert hit: (e, tokens, slots, gate, up, h, out)
    for e in range(spec.experts):
        tok, slot = np.nonzero(r.experts == e)
        if not tok.size:
            continue
        xe = x[tok]
        gu = ar.addmm(xe, params["gate_up"][e], params["gate_up_bias"][e]) if b else ar.mm(xe, params["gate_up"][e].T)
        gate, up = _gate_up(_f64(gu), spec)
        h = _glu(gate, up, spec, ar)
        wd = params["down"][e]
        out = ar.addmm(h, wd, params["down_bias"][e]) if b else ar.mm(h, wd.T)
        y[tok] += _f64(ar.rnd(_f64(out) * _f64(r.weights[tok, slot])[:, None]))
        kept.append((e, tok, slot, gate, up, h, out))
    res = {"y": ar.rnd(y, out=True), "routing": r.experts, "logits": _f64(logits)}
    if dy is None:
        return res
    dx = np.zeros(x.shape)
    d_weights = np.zeros(r.weights.shape)
    grads = {k: np.zeros(v.shape) for k, v in params.items()} if weights else {}
    for e, tok, slot, gate, up, h, out in kept:
        dye = _f64(dy[tok])
        d_weights[tok, slot] = _sum_last(_f64(out) * dye, ar)
        dout = ar.rnd(dye * _f64(r.weights[tok, slot])[:, None])
        dh = ar.mm(dout, params["down"][e])
        dgu = _glu_backward(dh, gate, up, spec, ar)
        dx[tok] += _f64(ar.mm(dgu, params["gate_up"][e]))
        if weights:
            grads["down"][e] = ar.mm(dout.T, h, out=True)
            grads["gate_up"][e] = ar.mm(dgu.T, x[tok], out=True)
            if b:
                grads["down_bias"][e] = ar.colsum(dout)
                grads["gate_up_bias"][e] = ar.colsum(dgu)
    dl = route_backward(d_weights, r, spec, ar)
    res["dx"] = ar.rnd(dx + _f64(ar.mm(dl, wr)), out=True)
    if weights:
        grads["router"] = ar.mm(dl.T, x, out=True)
        if b:
            grads["router_bias"] = ar.colsum(dl)
        res |= {f"d{k}": v for k, v in grads.items()}
    return res


# --- a case's computation (``compare.problem.golden``) -----------------------------------------------------------


def golden_routing(x: np.ndarray, params: dict[str, np.ndarray], spec: MoeSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(experts [T, k], logits [T, E])`` of ``x [T, dim]``: the float64 golden's routing (``Arith.exact()``: the
    logits through the error-free GEMM, the same bits as :func:`moe_fwd_bwd`'s), a few milliseconds where the whole
    golden takes a second."""
    ar = Arith.exact()
    wr = params["router"]
    logits = ar.addmm(x, wr, params["router_bias"]) if spec.biases else ar.mm(x, wr.T)
    return route(logits, spec, ar).experts, _f64(logits)


def compute_case(
    model: str,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    weights: bool = True,
    chosen: np.ndarray | None = None,
    spec: MoeSpec | None = None,
) -> dict[str, np.ndarray]:
    """A case of MoE ``model`` (:data:`MOE_SPECS`) on 3-D ``x [batch, seq, dim]`` (``dy`` alike) in ``ar``: its
    ``y`` and ``dx`` 3-D, and with ``weights`` every parameter's gradient; the tensors the gate judges, without the
    ``routing`` and ``logits`` :func:`moe_fwd_bwd` adds. Every arithmetic routes each token to ``chosen [T, k]``
    (over the flattened tokens), by default the float64 golden's experts (:func:`golden_routing`): a plain
    computation in a 16-bit dtype, whose own rounded logits would take the other expert of a near-tie, is the
    yardstick of the same routing as the golden it is measured against. ``spec``: another block's in place of the
    model's (a near variant, ``compare.gate.near_variants``)."""
    spec = spec or MOE_SPECS[model]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = None if dy is None else dy.reshape(-1, dy.shape[-1])
    if chosen is None:
        chosen = golden_routing(x2, params, spec)[0]
    out = moe_fwd_bwd(x2, params, dy2, ar, spec, weights, chosen=np.asarray(chosen))
    del out["routing"], out["logits"]
    out["y"] = out["y"].reshape(*lead, -1)
    if "dx" in out:
        out["dx"] = out["dx"].reshape(*lead, -1)
    return out


def gemm_flops(spec: MoeSpec, tokens: int, dim: int, hidden: int, mode: str) -> int:
    """The GEMM FLOPs one step of the routed block must do in ``mode`` (``fwd``, ``bwd``: the gradients given the
    forward, ``fwd+bwd``): the router ``2 T dim E`` and each token's ``k`` experts, ``gate_up`` ``2 T k dim 2 hidden``
    and ``down`` ``2 T k hidden dim``; the backward twice each (the input's gradient and the weight's). What a
    backend that runs every token through every expert (a one-hot dense form) does beyond it is its own choice."""
    fwd = 2 * tokens * dim * spec.experts + 6 * tokens * spec.top_k * dim * hidden
    return {"fwd": fwd, "bwd": 2 * fwd, "fwd+bwd": 3 * fwd}[mode]
