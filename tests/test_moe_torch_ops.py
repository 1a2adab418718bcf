"""``torch_impl.moe_ops`` (the eager expert loop and the sorted, grouped-GEMM form of a mixture-of-experts block)
against the float64 golden ``compare.problem.moe.moe_fwd_bwd``: ``y``, ``dx`` and every parameter's gradient (router
and biases included) on the CPU-sized presets, in float64, float32 and bfloat16, each judged against the golden of
its own routing (``chosen``) on the same dtype-rounded inputs, with the routing itself checked (equal to the golden's
where the draw has no near-tie, else a top-k choice of logits within the dtype's rounding: ``moe.routable``).

Tolerances, each relative to the tensor's largest magnitude:

- float64: 1e-10 (seen: 3e-15; torch's float64 BLAS and ``exp`` against the error-free golden).
- float32: 4 ulps times the longest reduction, ``4 * 64 * 2**-24`` = 1.5e-5 (the GEMMs sum 64 products: D and
  2I are 64; seen: 1e-6).
- bfloat16: 8 ulps, ``8 * 2**-8`` = 0.031: every stored tensor is rounded to bfloat16 (2**-9 relative each), up to
  k = 8 times in the combine alone (``index_add_`` rounds each add) and as often again along the chain
  (logits, gate_up, h, out, weighted out; the gradients likewise); seen: 1.2e-2.

Discontinuities are kept out of the draws and asserted absent: no near-tie in the router (top-k), and no gate or up
value near gpt-oss's clamp limits (a bfloat16 rounding could move one across ``limit`` and flip its gradient). The
float64 and float32 draws scale the weights by 3/sqrt(fan_in), so gpt-oss's clamps bind (the clamp-dropped control
needs that); the bfloat16 draws by 1/sqrt(fan_in), where no value comes near the limit (at 3/sqrt(fan_in) dozens of
values lie within a bfloat16 ulp of it on every seed).

Negative controls: an implementation run with a near variant of the spec (clamp dropped, layout swapped, router
order or renormalisation changed) is told apart from the golden of the true spec by far more than the tolerance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from compare.problem import moe
from compare.problem.reference import Arith, round_to_dtype
from torch_impl import moe_ops

#: the file: ~5 s on 2 idle cores (qwen3's golden, 128 experts: ~0.5 s a call), 25-36 s on busy ones
pytestmark = pytest.mark.standard

PRESETS = ("qwen3-moe-cpu", "mixtral-cpu", "gpt-oss-20b-cpu")
IMPLS = {"loop": moe_ops.moe_loop, "grouped": moe_ops.moe_grouped}
#: a seed whose draws have every top-k margin above 1e-3 of the largest logit on all three presets
SEED = 7
#: dtype -> (weight scale times 1/sqrt(fan_in), tolerance: module docstring)
DTYPES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (3.0, 1e-10),
    torch.float32: (3.0, 4 * 64 * 2.0**-24),
    torch.bfloat16: (1.0, 8 * 2.0**-8),
}
NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}

Arrays = dict[str, np.ndarray]


def _draw(name: str, dtype: torch.dtype) -> tuple[Arrays, np.ndarray, np.ndarray]:
    """The preset's parameters and ``x, dy`` (numpy default_rng(SEED): matrices normal times scale/sqrt(fan_in),
    biases normal times 0.5, inputs standard normal), rounded to ``dtype`` and held in float64."""
    p = moe.MOE_PRESETS[name]
    scale = DTYPES[dtype][0]
    rng = np.random.default_rng(SEED)
    params = {
        k: rng.standard_normal(s) * (scale / np.sqrt(s[-1]) if len(s) > 1 else 0.5)
        for k, s in p.spec.weight_shapes(p.dim, p.hidden).items()
    }
    x, dy = rng.standard_normal((p.tokens, p.dim)), rng.standard_normal((p.tokens, p.dim))

    def rnd(a: np.ndarray) -> np.ndarray:
        return a if dtype == torch.float64 else round_to_dtype(a, NAMES[dtype]).astype(np.float64)

    return {k: rnd(v) for k, v in params.items()}, rnd(x), rnd(dy)


def _run(impl: Any, params: Arrays, x: np.ndarray, dy: np.ndarray, spec: moe.MoeSpec, dtype: torch.dtype):
    """The implementation in ``dtype``: its ``y``, ``dx`` and ``d<param>`` (as float64 arrays) and its experts."""
    pt = {k: torch.from_numpy(v).to(dtype).requires_grad_(True) for k, v in params.items()}
    xt = torch.from_numpy(x).to(dtype).requires_grad_(True)
    y, experts = impl(xt, pt, spec)
    grads = torch.autograd.grad(y, [xt, *pt.values()], torch.from_numpy(dy).to(dtype))
    out = {"y": y, "dx": grads[0]} | {f"d{k}": g for k, g in zip(pt, grads[1:], strict=True)}
    assert experts.dtype == torch.int64 and experts.shape == (x.shape[0], spec.top_k)
    return {k: v.detach().double().numpy() for k, v in out.items()}, experts.numpy()


_RAN: dict[tuple[str, str, torch.dtype], tuple[Arrays, np.ndarray]] = {}


def _ran(name: str, impl: str, dtype: torch.dtype) -> tuple[Arrays, np.ndarray]:
    """:func:`_run` of ``impl`` on the preset's ``dtype`` draw (cached: two tests compare it)."""
    key = (name, impl, dtype)
    if key not in _RAN:
        params, x, dy = _draw(name, dtype)
        _RAN[key] = _run(IMPLS[impl], params, x, dy, moe.MOE_PRESETS[name].spec, dtype)
    return _RAN[key]


_GOLD: dict[tuple[Any, ...], Arrays] = {}


def _golden(name: str, dtype: torch.dtype, spec: moe.MoeSpec, chosen: np.ndarray) -> Arrays:
    """The golden of ``spec`` on the preset's ``dtype`` draw, routed to ``chosen`` (cached: qwen3's takes ~1 s)."""
    key = (name, dtype, spec, chosen.tobytes())
    if key not in _GOLD:
        params, x, dy = _draw(name, dtype)
        _GOLD[key] = moe.moe_fwd_bwd(x, params, dy, Arith.exact(), spec, chosen=chosen)
    return _GOLD[key]


def _worst(ours: Arrays, gold: Arrays) -> float:
    """The largest difference of any of ours' tensors, relative to the golden tensor's largest magnitude."""
    return max(float(np.max(np.abs(v - gold[k])) / np.max(np.abs(gold[k]))) for k, v in ours.items())


def _logits(params: Arrays, x: np.ndarray) -> np.ndarray:
    return x @ params["router"].T + params.get("router_bias", 0.0)


def _margin(logits: np.ndarray, k: int) -> float:
    """The smallest gap between a token's k-th and (k+1)-th logit, relative to the largest |logit|."""
    s = np.sort(logits, axis=1)[:, ::-1]
    return float(np.min(s[:, k - 1] - s[:, k]) / np.max(np.abs(logits)))


def _clamp_margin(params: Arrays, x: np.ndarray, experts: np.ndarray, spec: moe.MoeSpec) -> float:
    """The smallest distance of any gate value to ``limit`` or up value to ``+-limit`` over the chosen experts
    (infinite without a clamp)."""
    if spec.glu != "clamped":
        return np.inf
    gu = np.einsum("td,tkhd->tkh", x, params["gate_up"][experts])
    if spec.biases:
        gu = gu + params["gate_up_bias"][experts]
    gate, up = (gu[..., ::2], gu[..., 1::2]) if spec.layout == "interleaved" else np.split(gu, 2, axis=-1)
    lim = spec.limit
    return float(min(np.min(np.abs(gate - lim)), np.min(np.abs(np.abs(up) - lim))))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=NAMES.get)
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("name", PRESETS)
def test_the_block_is_the_golden_of_its_routing(name: str, impl: str, dtype: torch.dtype) -> None:
    """``y``, ``dx`` and every parameter gradient equal the golden of the implementation's own routing to the
    dtype's tolerance; the routing is the golden's (float64, float32: the draw's margins are far above float32's
    rounding of the logits) or within bfloat16's rounding of it (``routable``)."""
    spec = moe.MOE_PRESETS[name].spec
    params, x, _ = _draw(name, dtype)
    ours, experts = _ran(name, impl, dtype)
    logits = _logits(params, x)
    own = moe.route(logits, spec, Arith.exact()).experts
    if dtype == torch.bfloat16:  # logits rounded to bfloat16: within 2**-9 of each row's largest, 2**-8 to spare
        assert moe.routable(experts, logits, 2.0**-8 * np.max(np.abs(logits), axis=1)).all()
    else:
        assert _margin(logits, spec.top_k) > 1e-4
        np.testing.assert_array_equal(experts, own)
    # float32's worst-case error of a gate_up value here: 64 * 2**-24 * sum |x_i w_i| < 6e-5; bfloat16 draws: > 2
    assert _clamp_margin(params, x, experts, spec) > 5e-4
    gold = _golden(name, dtype, spec, experts)
    assert set(ours) == {"y", "dx"} | {f"d{k}" for k in params}
    assert _worst(ours, gold) < DTYPES[dtype][1], _worst(ours, gold)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=NAMES.get)
@pytest.mark.parametrize("name", PRESETS)
def test_grouped_and_loop_agree(name: str, dtype: torch.dtype) -> None:
    """Same routing always. In float64 and float32, ``y`` and every parameter gradient are bit for bit the loop's:
    the same ``mm`` per expert on the same rows (CPU ``grouped_mm`` is a loop of ``mm`` over groups; float64 runs
    our loop of ``@``) and one ``index_add_`` that adds each token's experts in the loop's (ascending) order. ``dx``
    only to the tolerance: the loop's autograd sums each expert's gather gradient into ``dx`` separately, the grouped
    form's one gather scatters all ``T * k`` rows at once, so a token's k terms add in another order. In bfloat16
    only to the tolerance: ``index_add_`` of all rows at once and of one expert at a time round ``y``'s partial sums
    (and the bias gradients' per-expert sums) differently."""
    a, ea = _ran(name, "loop", dtype)
    b, eb = _ran(name, "grouped", dtype)
    np.testing.assert_array_equal(ea, eb)
    if dtype != torch.bfloat16:
        for k in a:
            if k != "dx":
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert _worst(b, a) < DTYPES[dtype][1]


class _CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=NAMES.get)
def test_what_runs_grouped(dtype: torch.dtype) -> None:
    """float32 and bfloat16: the two expert GEMMs forward are two ``_grouped_mm`` calls and their backward four
    more (dA and dW of each, autograd's own); float64, which ``grouped_mm`` refuses on CPU, runs none (the module's
    documented loop of ``mm``)."""
    name = "gpt-oss-20b-cpu"
    spec = moe.MOE_PRESETS[name].spec
    params, x, dy = _draw(name, dtype)
    pt = {k: torch.from_numpy(v).to(dtype).requires_grad_(True) for k, v in params.items()}
    xt = torch.from_numpy(x).to(dtype).requires_grad_(True)
    with _CountOps() as fwd:
        y, _ = moe_ops.moe_grouped(xt, pt, spec)
    with _CountOps() as bwd:
        torch.autograd.grad(y, [xt, *pt.values()], torch.from_numpy(dy).to(dtype))
    grouped = dtype != torch.float64
    assert fwd.ops.count("aten._grouped_mm.default") == (2 if grouped else 0)
    assert bwd.ops.count("aten._grouped_mm.default") == (4 if grouped else 0)
    assert moe_ops.grouped_mm_applies(xt, pt["gate_up"]) == grouped
    if not grouped:
        with pytest.raises(RuntimeError, match="Expected mat_a to be Float32, BFloat16 or Float16"):
            torch.nn.functional.grouped_mm(xt, pt["gate_up"].mT, offs=torch.tensor([24] * 32, dtype=torch.int32))


def test_unaligned_widths_fall_back_to_the_loop_and_still_match() -> None:
    """float32 widths that are not a multiple of 16 bytes (dim 6, hidden 3) are refused by ``grouped_mm``; the
    grouped form then loops over the groups and still equals the golden."""
    spec = moe.gpt_oss(4, 2)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s) for k, s in spec.weight_shapes(6, 3).items()}
    params = {k: round_to_dtype(v, "float32").astype(np.float64) for k, v in params.items()}
    x, dy = (round_to_dtype(rng.standard_normal((5, 6)), "float32").astype(np.float64) for _ in range(2))
    xt = torch.from_numpy(x).float()
    assert not moe_ops.grouped_mm_applies(xt, torch.from_numpy(params["gate_up"]).float())
    with pytest.raises(RuntimeError, match="strides should be multiple of 16 bytes"):
        torch.nn.functional.grouped_mm(xt, torch.zeros(4, 6, 6).mT, offs=torch.tensor([5] * 4, dtype=torch.int32))
    ours, experts = _run(moe_ops.moe_grouped, params, x, dy, spec, torch.float32)
    np.testing.assert_array_equal(experts, moe.route(_logits(params, x), spec, Arith.exact()).experts)
    gold = moe.moe_fwd_bwd(x, params, dy, Arith.exact(), spec, chosen=experts)
    assert _worst(ours, gold) < DTYPES[torch.float32][1]


@pytest.mark.parametrize("order", moe.ROUTER_ORDERS)
@pytest.mark.parametrize("impl", list(IMPLS))
def test_ties_go_to_the_lower_expert(impl: str, order: str) -> None:
    """A zero router ties every expert on every token: both orders choose experts ``0..k-1``, as the golden's stable
    sort does (``torch.topk`` on CPU returns other indices on ties)."""
    spec = moe.MoeSpec(8, 3, order=order)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s) / np.sqrt(s[-1]) for k, s in spec.weight_shapes(16, 8).items()}
    params["router"][:] = 0.0
    x, dy = rng.standard_normal((4, 16)), rng.standard_normal((4, 16))
    ours, experts = _run(IMPLS[impl], params, x, dy, spec, torch.float64)
    gold = moe.moe_fwd_bwd(x, params, dy, Arith.exact(), spec)
    np.testing.assert_array_equal(experts, np.tile(np.arange(3), (4, 1)))
    np.testing.assert_array_equal(gold["routing"], experts)
    assert _worst(ours, gold) < DTYPES[torch.float64][1]


#: (preset, what is wrong, changes to the preset's spec giving the true spec, changes giving the wrong one)
CONTROLS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("gpt-oss-20b-cpu", "the clamp dropped", {}, {"limit": float("inf")}),
    ("gpt-oss-20b-cpu", "gate and up concatenated", {}, {"layout": "concat"}),
    ("gpt-oss-20b-cpu", "softmax over every expert before top-k", {}, {"order": "softmax-topk", "renormalize": False}),
    ("mixtral-cpu", "gate and up interleaved", {}, {"layout": "interleaved"}),
    ("mixtral-cpu", "renormalisation missing", {}, {"renormalize": False}),
    ("mixtral-cpu", "top-k before the softmax, unrenormalised", {"renormalize": False}, {"order": "topk-softmax"}),
    ("qwen3-moe-cpu", "renormalisation missing", {}, {"renormalize": False}),
]


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(("name", "why", "true", "wrong"), CONTROLS, ids=[f"{c[0]}: {c[1]}" for c in CONTROLS])
def test_a_near_variant_fails_the_comparison(
    name: str, why: str, true: dict[str, Any], wrong: dict[str, Any], impl: str
) -> None:
    """Negative controls: the implementation run with a near variant of the spec differs from the golden of the
    true spec (routed as it routed: the variants choose the same experts) by more than 3 times bfloat16's tolerance,
    6e3 times float32's (seen: 0.20 to 2.7), so the comparisons above can fail."""
    spec = dataclasses.replace(moe.MOE_PRESETS[name].spec, **true)
    params, x, dy = _draw(name, torch.float64)
    ours, experts = _run(IMPLS[impl], params, x, dy, dataclasses.replace(spec, **wrong), torch.float64)
    err = _worst(ours, _golden(name, torch.float64, spec, experts))
    assert err > 3 * DTYPES[torch.bfloat16][1], (why, err)
