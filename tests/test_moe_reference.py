"""The mixture-of-experts golden (``compare.problem.moe``) against transformers' own blocks run in float64 on the
same weights and inputs: Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``, Mixtral's ``MixtralSparseMoeBlock`` and gpt-oss's
``GptOssMLP`` (CPU-sized: the real expert counts and top-k, narrow widths), forward and backward, every parameter's
gradient. Each comparison has negative controls: the golden of a near variant (the clamp dropped, concatenated
instead of interleaved gate and up, softmax before top-k instead of after, renormalisation missing) is told apart.

What the comparison cannot see: transformers' Qwen3-MoE and Mixtral routers take their softmax in float32 whatever
the input dtype (``softmax(..., dtype=torch.float)``, ``router_logits.float()``), so against those two blocks the
golden agrees to float32's rounding of the combine weights (1e-6 of the output's scale), not to float64's; gpt-oss's
router keeps the dtype and agrees to 1e-12."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from compare.problem import moe
from compare.problem.reference import Arith

pytestmark = pytest.mark.standard

#: the CPU-sized presets' widths and tokens (one for all three)
DIM, HIDDEN, TOKENS = 64, 32, 24


def _preset(name: str) -> moe.MoeSpec:
    p = moe.MOE_PRESETS[name]
    assert (p.dim, p.hidden, p.tokens) == (DIM, HIDDEN, TOKENS)
    return p.spec


def _qwen3() -> tuple[torch.nn.Module, moe.MoeSpec]:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=DIM, moe_intermediate_size=HIDDEN, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True
    )
    return Qwen3MoeSparseMoeBlock(cfg), _preset("qwen3-moe-cpu")


def _mixtral() -> tuple[torch.nn.Module, moe.MoeSpec]:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=DIM, intermediate_size=HIDDEN, num_local_experts=8, num_experts_per_tok=2)
    return MixtralSparseMoeBlock(cfg), _preset("mixtral-cpu")


def _gpt_oss() -> tuple[torch.nn.Module, moe.MoeSpec]:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    cfg = GptOssConfig(hidden_size=DIM, intermediate_size=HIDDEN, num_local_experts=32, num_experts_per_tok=4)
    spec = _preset("gpt-oss-20b-cpu")
    assert (spec.alpha, spec.limit) == (cfg.swiglu_alpha, cfg.swiglu_limit)
    return GptOssMLP(cfg), spec


#: transformers' names of a fused-experts block's parameters (Qwen3-MoE, Mixtral) -> ours, none transposed
FUSED = {
    "gate.weight": ("router", False),
    "experts.gate_up_proj": ("gate_up", False),
    "experts.down_proj": ("down", False),
}
#: block -> (build, its parameters' names -> ours, whether stored ``(in, out)``: transposed to ours, tolerance)
BLOCKS: dict[str, tuple[Any, dict[str, tuple[str, bool]], float]] = {
    "qwen3-moe": (
        _qwen3,
        {
            "gate.weight": ("router", False),
            "experts.gate_up_proj": ("gate_up", False),
            "experts.down_proj": ("down", False),
        },
        1e-6,
    ),
    "mixtral": (
        _mixtral,
        {
            "gate.weight": ("router", False),
            "experts.gate_up_proj": ("gate_up", False),
            "experts.down_proj": ("down", False),
        },
        1e-6,
    ),
    "gpt-oss": (
        _gpt_oss,
        {
            "router.weight": ("router", False),
            "router.bias": ("router_bias", False),
            "experts.gate_up_proj": ("gate_up", True),
            "experts.gate_up_proj_bias": ("gate_up_bias", False),
            "experts.down_proj": ("down", True),
            "experts.down_proj_bias": ("down_bias", False),
        },
        1e-12,
    ),
}


def _ours(theirs: np.ndarray, transposed: bool) -> np.ndarray:
    return np.swapaxes(theirs, -1, -2).copy() if transposed else theirs


def _run(name: str, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray], Any]:
    """transformers' block ``name`` in float64 on random weights and inputs (scaled so that gpt-oss's clamps bind):
    its ``y`` and gradients under our names, our parameters, inputs ``x, dy``, and the spec."""
    build, names, _ = BLOCKS[name]
    block, spec = build()
    block = block.double().eval()
    rng = np.random.default_rng(seed)
    params = {}
    with torch.no_grad():
        for theirs, p in block.named_parameters():
            fan_in = p.shape[-2] if names[theirs][1] else p.shape[-1]
            value = rng.standard_normal(tuple(p.shape)) * (3.0 / np.sqrt(fan_in) if p.ndim > 1 else 0.5)
            p.copy_(torch.from_numpy(value))
            params[names[theirs][0]] = _ours(value, names[theirs][1])
    x = rng.standard_normal((TOKENS, DIM))
    dy = rng.standard_normal((TOKENS, DIM))
    xt = torch.from_numpy(x).requires_grad_(True)
    out = block(xt[None])
    y = (out[0] if isinstance(out, tuple) else out)[0]
    wrt = [xt, *(p for _, p in block.named_parameters())]
    grads = torch.autograd.grad(y, wrt, torch.from_numpy(dy))
    got = {"y": y.detach().numpy(), "dx": grads[0].numpy()}
    for (theirs, _), g in zip(block.named_parameters(), grads[1:], strict=True):
        got["d" + names[theirs][0]] = _ours(g.numpy(), names[theirs][1])
    return got, params, {"x": x, "dy": dy}, spec


def _worst(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    """The largest difference of any tensor, relative to that tensor's largest magnitude."""
    assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
    return max(float(np.max(np.abs(ours[k] - v)) / np.max(np.abs(v))) for k, v in theirs.items())


def _margin(params: dict[str, np.ndarray], x: np.ndarray, spec: moe.MoeSpec) -> float:
    """The smallest gap, over the tokens, between the k-th and the (k+1)-th routing score, relative to the k-th
    (a near-tie there would let float32's router choose otherwise)."""
    logits = x @ params["router"].T + params.get("router_bias", 0.0)
    scores = np.sort(logits, axis=1)[:, ::-1]
    k = spec.top_k
    if k == spec.experts:
        return np.inf
    return float(np.min((scores[:, k - 1] - scores[:, k]) / np.abs(scores[:, k - 1])))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_golden_is_transformers_block_in_float64(name: str) -> None:
    """``y``, ``dx`` and every parameter's gradient of the golden equal transformers' block on the same weights and
    inputs (module docstring for the tolerance); the draw has no near-tie in its routing."""
    theirs, params, io, spec = _run(name)
    assert _margin(params, io["x"], spec) > 1e-4
    ours = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), spec)
    assert ours["routing"].shape == (TOKENS, spec.top_k)
    assert _worst(ours, theirs) < BLOCKS[name][2], _worst(ours, theirs)


#: Near variants of each block's spec that a port may compute instead: each golden must differ from the block's.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3-moe": {
        "renormalisation missing": {"renormalize": False},
        "gate and up interleaved": {"layout": "interleaved"},
    },
    "mixtral": {
        "renormalisation missing": {"renormalize": False},
        "gate and up interleaved": {"layout": "interleaved"},
    },
    "gpt-oss": {
        "the clamp dropped": {"limit": np.inf},
        "the clamp at 8": {"limit": 8.0},
        "gate and up concatenated": {"layout": "concat"},
        "softmax over every expert before top-k": {"order": "softmax-topk", "renormalize": False},
        "SwiGLU without the clamp and the + 1": {"glu": "swiglu"},
    },
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_every_near_variant_differs_from_the_block(name: str) -> None:
    """Negative controls of the comparison above: the golden of each near variant of the block's spec differs from
    transformers' block by far more than the tolerance (here the clamps bind: inputs and weights scaled up)."""
    theirs, params, io, spec = _run(name)
    for why, change in VARIANTS[name].items():
        ours = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), dataclasses.replace(spec, **change))
        assert _worst(ours, theirs) > 1e3 * BLOCKS[name][2], (why, _worst(ours, theirs))


def test_with_renormalisation_the_two_router_orders_are_one_function() -> None:
    """Softmax over every expert, top-k and renormalisation (Qwen3-MoE, Mixtral) gives the same weights as top-k
    then a softmax over the k (gpt-oss): ``p_j / sum_K p = exp(l_j) / sum_K exp(l)``. So no gate can name one as the
    other's variant; without renormalisation they differ (control)."""
    _, params, io, spec = _run("qwen3-moe")
    a = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), spec)
    b = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), dataclasses.replace(spec, order="topk-softmax"))
    assert np.array_equal(a["routing"], b["routing"]) and _worst(a, b) < 1e-12
    c = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), dataclasses.replace(spec, renormalize=False))
    assert _worst(a, {k: v for k, v in c.items() if k != "routing"}) > 1e-3


def test_the_golden_has_the_same_bits_whatever_the_order_of_the_tokens() -> None:
    """Each token's ``y`` and ``dx`` are its own, bit for bit, when the tokens come in another order (the golden's
    sums go through the error-free GEMM, not numpy's vector-width-dependent reductions); the weight gradients agree
    to float64 rounding."""
    _, params, io, spec = _run("gpt-oss")
    order = np.random.default_rng(1).permutation(TOKENS)
    a = moe.moe_fwd_bwd(io["x"], params, io["dy"], Arith.exact(), spec)
    b = moe.moe_fwd_bwd(io["x"][order], params, io["dy"][order], Arith.exact(), spec)
    assert np.array_equal(a["y"][order], b["y"]) and np.array_equal(a["dx"][order], b["dx"])
    assert np.array_equal(a["routing"][order], b["routing"])
    assert (
        max(float(np.max(np.abs(a[k] - b[k]))) / float(np.max(np.abs(a[k]))) for k in a if k.startswith("dr")) < 1e-14
    )


def test_a_spec_outside_the_known_forms_is_refused() -> None:
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.experts"):
        moe.MoeSpec(8, 9)
    with pytest.raises(ValueError, match="unknown order 'sorted'"):
        moe.MoeSpec(8, 2, order="sorted")


# --- near-ties: the golden of a backend's own routing ------------------------------------------------------------


def _tied(spec: moe.MoeSpec, gap: float, seed: int = 2) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Parameters and inputs whose token 0 has its k-th and (k+1)-th router logits ``gap`` apart (expert ``a`` just
    above ``b``): the router's row of ``b`` is moved so that ``l_b = l_a - gap`` on that token. Returns the params,
    ``x`` and ``(a, b)``."""
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) / np.sqrt(s[-1]) for k, s in spec.weight_shapes(DIM, HIDDEN).items()}
    x = rng.standard_normal((TOKENS, DIM))
    logits = x @ params["router"].T
    order = np.argsort(-logits[0], kind="stable")
    a, b = order[spec.top_k - 1], order[spec.top_k]
    want = logits[0, a] - gap
    params["router"][b] += (want - logits[0, b]) * x[0] / (x[0] @ x[0])
    return params, x, np.array([a, b])


def test_a_near_tie_chosen_either_way_is_routable_and_judged_against_its_own_golden() -> None:
    """On a token whose k-th and (k+1)-th logits are 1e-9 apart, the choice with the two swapped is a top-k choice
    of logits within 1e-8 (``routable``), and the golden of that choice (``chosen``) is what a backend that made it
    computes: equal on every other token, and on that token differing from the golden's own by far more than
    rounding (so judging it against the golden's routing would fail an honest backend)."""
    spec = moe.MoeSpec(8, 2)
    params, x, (a, b) = _tied(spec, 1e-9)
    gold = moe.moe_fwd_bwd(x, params, None, Arith.exact(), spec)
    assert a in gold["routing"][0] and b not in gold["routing"][0]
    theirs = gold["routing"].copy()
    theirs[0, theirs[0] == a] = b
    assert moe.routable(theirs, gold["logits"], 1e-8).all()
    assert not moe.routable(theirs, gold["logits"], 0.0)[0]  # the exact top k is the golden's
    other = moe.moe_fwd_bwd(x, params, None, Arith.exact(), spec, chosen=theirs)
    assert np.array_equal(other["y"][1:], gold["y"][1:])
    assert np.max(np.abs(other["y"][0] - gold["y"][0])) > 1e-3 * np.max(np.abs(gold["y"][0]))


def test_a_wrong_router_is_not_routable() -> None:
    """Controls: a router that takes the (k+1)-th expert for the k-th on tokens with ordinary margins, or repeats an
    expert, or names one out of range, is not routable within a tolerance far above float64's rounding."""
    spec = moe.MoeSpec(8, 2)
    params, x, _ = _tied(spec, 0.5)
    gold = moe.moe_fwd_bwd(x, params, None, Arith.exact(), spec)
    logits = gold["logits"]
    order = np.argsort(-logits, axis=1, kind="stable")
    wrong = order[:, [0, 2]]  # the third-ranked instead of the second
    gap = logits[np.arange(TOKENS), order[:, 1]] - logits[np.arange(TOKENS), order[:, 2]]
    assert not moe.routable(wrong, logits, 1e-6)[gap > 2e-6].any() and (gap > 2e-6).sum() > TOKENS // 2
    assert moe.routable(gold["routing"], logits, 0.0).all()
    repeated = gold["routing"].copy()
    repeated[:, 1] = repeated[:, 0]
    assert not moe.routable(repeated, logits, 1.0).any()
    assert not moe.routable(np.full_like(gold["routing"], 8), logits, 1.0).any()
