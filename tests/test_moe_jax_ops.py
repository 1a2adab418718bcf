"""The JAX mixture-of-experts blocks (``jax_impl.moe_ops``: the dense one-hot baseline and the ragged_dot one)
against the float64 golden (``compare.problem.moe.moe_fwd_bwd`` with ``Arith.exact()``) on the CPU-sized presets:
``y``, ``dx`` and every parameter's gradient (router and biases included, through ``jax.vjp`` with a fixed ``dy``),
and the experts chosen.

Inputs: the golden runs on the very values JAX got (each drawn in float64, rounded to the dtype under test, widened
back), so input rounding is not counted as error. Top-k is discontinuous, so the router is drawn with wide margins:
per token, its top-k logits spread over [1, 3] (at least 0.2 apart) and the rest in [-3, -1] (the router solved from
``x`` for those logits); every comparison asserts the margins on the golden's logits of the rounded inputs, so
each dtype's JAX router must choose the golden's experts, in the golden's order. gpt-oss's clamp binds (weights
scaled as tests/test_moe_reference.py scales them) and is discontinuous too (its gradient is zero beyond a bound): the
draw moves each routed ``gate_up`` bias so that no routed pre-activation lies within 0.25 of a bound, asserted.

Tolerances, on each tensor's largest difference relative to its largest magnitude (:func:`_worst`):

- float64 (under ``jax.enable_x64``, which the fixture switches back after the test): 1e-10; measured 1.6e-15 at
  worst.
- float32 under jit: 2e-5. Unit roundoff is 6e-8; the longest sums are 128 terms (a row of ``dx`` takes the router's
  E = 128 experts) and 64 (``D``, ``2I``), so one sum's error bound ``n u`` is up to 8e-6 of its terms' magnitudes,
  and a value passes through a few rounded sums. Measured: 6.9e-7 at worst.
- bfloat16 under jit: 6e-2. Every intermediate rounds to bfloat16 (unit roundoff 2^-9 = 2e-3) where the golden rounds
  none; a gradient takes some ten rounded steps (forward intermediates, then its own chain), each within about 2 u,
  and cancels where its sums do. Measured: 1.3e-2 at worst (gpt-oss; 9e-3 the others).

Negative controls: the JAX block run with a near variant of the spec (gpt-oss's clamp dropped; gate and up in the
other layout; softmax-topk without renormalisation for Qwen3-MoE's and Mixtral's renormalised one and for gpt-oss's
topk-softmax: with renormalisation the two orders are one function, tests/test_moe_reference.py) differs from the
golden of the true spec by 0.12 to 2.3 of a tensor's scale (more than 1e-2 asserted: 1e8 times the float64
tolerance), and agrees with the golden of the variant to float64's. Also here: ``jax.lax.top_k``'s
tie-breaking on exact ties (dyadic inputs: exact logits), the clamp's gradient at its bounds, and what
``jax.lax.ragged_dot`` does on this platform (its gradients in float64, float32 and bfloat16)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compare.problem import moe
from compare.problem.reference import Arith
from jax_impl.moe_ops import FORMULATIONS, glu

pytestmark = pytest.mark.standard

PRESETS = ("qwen3-moe-cpu", "mixtral-cpu", "gpt-oss-20b-cpu")
TOL = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 6e-2}
#: the least gap between consecutive logits among each token's k + 1 largest (the top-k set and its order), and the
#: least distance of a routed pre-activation from a clamp bound, that every comparison asserts
ROUTING_MARGIN = 0.1
CLAMP_MARGIN = 0.1


@pytest.fixture
def x64() -> Iterator[None]:
    """float64 in JAX for one test, the setting as it was after it (other tests run in JAX's default 32-bit mode)."""
    before = jnp.zeros(1).dtype
    with jax.enable_x64(True):
        yield
    assert jnp.zeros(1).dtype == before


# --- inputs --------------------------------------------------------------------------------------------------------


@functools.cache
def _draw(name: str, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """float64 ``params, x, dy`` of preset ``name`` with wide routing margins and, with gpt-oss's clamp, routed
    pre-activations away from its bounds (module docstring)."""
    p = moe.MOE_PRESETS[name]
    spec, t, e, k = p.spec, p.tokens, p.spec.experts, p.spec.top_k
    rng = np.random.default_rng(seed)
    shapes = spec.weight_shapes(p.dim, p.hidden)
    params = {n: rng.standard_normal(s) * (3.0 / np.sqrt(s[-1]) if len(s) > 1 else 0.5) for n, s in shapes.items()}
    x = rng.standard_normal((t, p.dim))
    dy = rng.standard_normal((t, p.dim))
    logits = rng.uniform(-3.0, -1.0, (t, e))
    routed = np.zeros((t, e), dtype=bool)
    for i in range(t):
        chosen = rng.choice(e, k, replace=False)
        logits[i, chosen] = rng.permutation(np.linspace(3.0, 1.0, k)) + rng.uniform(-0.02, 0.02, k)
        routed[i, chosen] = True
    # the router for those logits: x [T, D] has full row rank (T < D), so the least-norm solution is exact
    params["router"] = np.linalg.lstsq(x, logits - params.get("router_bias", 0.0), rcond=None)[0].T
    if spec.glu == "clamped" and spec.biases:
        pre = np.einsum("td,efd->tef", x, params["gate_up"])  # [T, E, 2I] without the bias
        shifts = 0.3 * np.array([0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5])
        for ex in range(e):
            v = pre[routed[:, ex], ex]  # [tokens routed to ex, 2I]
            for r in range(v.shape[1]):
                b = params["gate_up_bias"][ex, r] + shifts
                far = np.all(np.abs(np.abs(v[:, r, None] + b) - spec.limit) > 0.25, axis=0)
                params["gate_up_bias"][ex, r] = b[np.argmax(far)] if far.any() else np.nan
        assert np.isfinite(params["gate_up_bias"]).all()
    return params, x, dy


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` (round to nearest even, as JAX converts), widened back to float64."""
    return np.asarray(a).astype(jnp.dtype(dtype)).astype(np.float64)


def _inputs(name: str, dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    params, x, dy = _draw(name)
    return {n: _rounded(v, dtype) for n, v in params.items()}, _rounded(x, dtype), _rounded(dy, dtype)


def _routing_margin(logits: np.ndarray, k: int) -> float:
    """The least gap between consecutive logits among each token's ``k + 1`` largest (``k`` alone when ``k = E``)."""
    top = -np.sort(-logits, axis=1)[:, : k + 1]
    return float(np.min(top[:, :-1] - top[:, 1:]))


def _clamp_margin(params: dict[str, np.ndarray], x: np.ndarray, spec: moe.MoeSpec, experts: np.ndarray) -> float:
    """The least distance of a routed ``gate_up`` pre-activation from a clamp bound ``+-limit`` (inf without one)."""
    if spec.glu != "clamped":
        return math.inf
    pre = np.einsum("td,tkfd->tkf", x, params["gate_up"][experts])  # [T, k, 2I]
    if spec.biases:
        pre = pre + params["gate_up_bias"][experts]
    return float(np.min(np.abs(np.abs(pre) - spec.limit)))


# --- running both sides --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("fn", "spec"))
def _fwd_bwd(
    params: dict[str, jax.Array], x: jax.Array, dy: jax.Array, fn: str, spec: moe.MoeSpec
) -> tuple[dict[str, jax.Array], jax.Array]:
    """Formulation ``fn``'s ``y``, ``dx`` and ``d<param>`` (``jax.vjp`` with ``dy``) and its experts, jitted."""
    y, vjp, experts = jax.vjp(lambda p, xx: FORMULATIONS[fn](p, xx, spec), params, x, has_aux=True)
    dparams, dx = vjp(dy)
    return {"y": y, "dx": dx, **{f"d{n}": g for n, g in dparams.items()}}, experts


def _jax(name: str, fn: str, dtype: str, spec: moe.MoeSpec | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Formulation ``fn`` on preset ``name``'s inputs in ``dtype`` (``spec``: this one instead of the preset's)."""
    params, x, dy = _inputs(name, dtype)
    dt = jnp.dtype(dtype)
    out, experts = _fwd_bwd(
        {n: jnp.asarray(v, dt) for n, v in params.items()},
        jnp.asarray(x, dt),
        jnp.asarray(dy, dt),
        fn=fn,
        spec=spec or moe.MOE_PRESETS[name].spec,
    )
    assert all(v.dtype == dt for v in out.values()) and experts.dtype == jnp.int32
    return {n: np.asarray(v).astype(np.float64) for n, v in out.items()}, np.asarray(experts)


@functools.cache
def _golden_cached(name: str, dtype: str, spec: moe.MoeSpec, chosen: bytes | None) -> dict[str, np.ndarray]:
    params, x, dy = _inputs(name, dtype)
    k = spec.top_k
    picked = None if chosen is None else np.frombuffer(chosen, dtype=np.int32).reshape(x.shape[0], k)
    return moe.moe_fwd_bwd(x, params, dy, Arith.exact(), spec, chosen=picked)


def _golden(name: str, dtype: str, spec: moe.MoeSpec, chosen: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The golden of preset ``name``'s inputs rounded to ``dtype`` (``chosen``: of those experts, ``[T, k]``)."""
    key = None if chosen is None else np.ascontiguousarray(chosen, dtype=np.int32).tobytes()
    return _golden_cached(name, dtype, spec, key)


def _worst(ours: dict[str, np.ndarray], gold: dict[str, np.ndarray]) -> float:
    """The largest difference of any tensor, relative to that tensor's largest magnitude."""
    return max(float(np.max(np.abs(v - gold[n])) / np.max(np.abs(gold[n]))) for n, v in ours.items())


def _judge(name: str, fn: str, dtype: str) -> float:
    """Formulation ``fn`` against the golden in ``dtype``: the margins asserted, the experts the golden's, every
    tensor of the golden's (of the experts chosen) compared; returns the worst relative difference."""
    spec = moe.MOE_PRESETS[name].spec
    params, x, _ = _inputs(name, dtype)
    own = _golden(name, dtype, spec)
    assert _routing_margin(own["logits"], spec.top_k) > ROUTING_MARGIN
    assert _clamp_margin(params, x, spec, own["routing"]) > CLAMP_MARGIN
    ours, experts = _jax(name, fn, dtype)
    np.testing.assert_array_equal(experts, own["routing"])
    gold = _golden(name, dtype, spec, chosen=experts)
    assert set(ours) == {n for n in gold if n not in ("routing", "logits")}
    return _worst(ours, gold)


# --- against the golden ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", list(FORMULATIONS))
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.usefixtures("x64")
def test_float64_equals_the_golden(name: str, fn: str) -> None:
    """In float64: the golden's experts, and ``y``, ``dx`` and every parameter's gradient to 1e-10."""
    assert _judge(name, fn, "float64") < TOL["float64"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fn", list(FORMULATIONS))
@pytest.mark.parametrize("name", PRESETS)
def test_low_precision_under_jit_is_within_its_tolerance(name: str, fn: str, dtype: str) -> None:
    """float32 and bfloat16 (JAX's default 32-bit mode), jitted: the golden's experts, and every tensor within the
    dtype's tolerance (module docstring) of the golden of the same rounded inputs."""
    assert _judge(name, fn, dtype) < TOL[dtype]


# --- negative controls -----------------------------------------------------------------------------------------------

#: Near variants of each preset's spec that the golden computes differently.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3-moe-cpu": {
        "gate and up interleaved": {"layout": "interleaved"},
        "softmax-topk without renormalisation": {"renormalize": False},
    },
    "mixtral-cpu": {
        "gate and up interleaved": {"layout": "interleaved"},
        "softmax-topk without renormalisation": {"renormalize": False},
    },
    "gpt-oss-20b-cpu": {
        "the clamp dropped": {"limit": math.inf},
        "gate and up concatenated": {"layout": "concat"},
        "softmax-topk without renormalisation": {"order": "softmax-topk", "renormalize": False},
    },
}
CONTROLS = [(name, why) for name, variants in VARIANTS.items() for why in variants]


@pytest.mark.parametrize("fn", list(FORMULATIONS))
@pytest.mark.parametrize(("name", "why"), CONTROLS)
@pytest.mark.usefixtures("x64")
def test_a_near_variant_fails_the_comparison(name: str, why: str, fn: str) -> None:
    """The block run with a near variant of the spec misses the golden of the true spec by more than 1e-2 of a
    tensor's scale (1e8 times the float64 tolerance, 500 times float32's), and meets the golden of the variant: the
    comparison sees each of these choices."""
    spec = moe.MOE_PRESETS[name].spec
    variant = dataclasses.replace(spec, **VARIANTS[name][why])
    ours, experts = _jax(name, fn, "float64", spec=variant)
    np.testing.assert_array_equal(experts, _golden(name, "float64", spec)["routing"])  # the same experts
    assert _worst(ours, _golden(name, "float64", spec, chosen=experts)) > 1e-2
    assert _worst(ours, _golden(name, "float64", variant, chosen=experts)) < TOL["float64"]


def test_the_clamp_binds_in_the_draw() -> None:
    """The "clamp dropped" control is a control: gpt-oss's routed pre-activations go beyond both bounds."""
    name = "gpt-oss-20b-cpu"
    spec = moe.MOE_PRESETS[name].spec
    params, x, _ = _draw(name)
    experts = _golden(name, "float64", spec)["routing"]
    pre = np.einsum("td,tkfd->tkf", x, params["gate_up"][experts]) + params["gate_up_bias"][experts]
    gate, up = pre[..., ::2], pre[..., 1::2]  # interleaved
    assert (gate > spec.limit).sum() > 10 and (up > spec.limit).sum() > 10 and (up < -spec.limit).sum() > 10


# --- routing ties, the clamp's bounds, ragged_dot ------------------------------------------------------------------


def _dyadic(spec: moe.MoeSpec, seed: int = 3) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Small integers over powers of two: every logit is exact in float64 whatever the summation order, so equal
    logits are equal on both sides (ties), and so are their softmax probabilities. The router reads 6 of the 16
    features, in steps of 1/4: many ties."""
    rng = np.random.default_rng(seed)
    t, d, h = 32, 16, 8
    shapes = spec.weight_shapes(d, h)
    params = {n: rng.integers(-3, 4, s) / 16.0 for n, s in shapes.items()}
    params["router"] = np.zeros(shapes["router"])
    params["router"][:, :6] = rng.integers(-1, 2, (spec.experts, 6)) / 4.0
    return params, rng.integers(-2, 3, (t, d)) / 2.0, rng.standard_normal((t, d))


@pytest.mark.parametrize("fn", list(FORMULATIONS))
@pytest.mark.parametrize("spec", [moe.MoeSpec(8, 2), moe.gpt_oss(8, 3)], ids=["softmax-topk", "topk-softmax"])
@pytest.mark.usefixtures("x64")
def test_exact_ties_go_to_the_lower_expert_as_in_the_golden(spec: moe.MoeSpec, fn: str) -> None:
    """``jax.lax.top_k`` breaks exact ties to the lower index, as the golden's stable sort: on logits with many
    ties, at the k-th place and within the k, the experts are the golden's and so is everything else."""
    params, x, dy = _dyadic(spec)
    gold = moe.moe_fwd_bwd(x, params, dy, Arith.exact(), spec)
    top = -np.sort(-gold["logits"], axis=1)
    k = spec.top_k
    assert (top[:, k - 1] == top[:, k]).sum() >= 3  # ties across the boundary of the top k
    assert (top[:, : k - 1] == top[:, 1:k]).any(axis=1).sum() >= 3  # ties within it
    ours, experts = _fwd_bwd(
        {n: jnp.asarray(v) for n, v in params.items()}, jnp.asarray(x), jnp.asarray(dy), fn=fn, spec=spec
    )
    np.testing.assert_array_equal(np.asarray(experts), gold["routing"])
    assert _worst({n: np.asarray(v) for n, v in ours.items()}, gold) < TOL["float64"]


def test_top_k_ties_and_signed_zeros() -> None:
    """``jax.lax.top_k`` against the golden's ``top_k`` on rows of ties (float32): the same indices; where they
    differ is off the routing scores' line: JAX orders +0.0 above -0.0 (numpy: equal) and NaN above all."""
    rng = np.random.default_rng(4)
    rows = rng.integers(0, 4, (200, 16)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.lax.top_k(jnp.asarray(rows), 5)[1]), moe.top_k(rows, 5))
    zeros = np.array([[-0.0, 0.0, 0.0, -0.0]], np.float32)
    assert np.asarray(jax.lax.top_k(jnp.asarray(zeros), 3)[1]).tolist() == [[1, 2, 0]]
    assert moe.top_k(zeros, 3).tolist() == [[0, 1, 2]]


@pytest.mark.usefixtures("x64")
def test_the_clamp_passes_the_gradient_at_its_bounds() -> None:
    """As torch's ``clamp`` backward and the golden: the gradient passes where the input equals a bound, and stops
    beyond it (``jnp.minimum`` / ``jnp.clip`` would pass half at the bound)."""
    spec = moe.gpt_oss(8, 2)
    lim = spec.limit
    gate = jnp.array([lim, lim + 1.0, 1.0, 1.0, 1.0])
    up = jnp.array([1.0, 1.0, lim, -lim, lim + 1.0])
    dg, du = jax.grad(lambda g, u: jnp.sum(glu(g, u, spec)), argnums=(0, 1))(gate, up)
    sig = 1.0 / (1.0 + np.exp(-spec.alpha * np.array([lim, 1.0])))
    dglu = sig * (1.0 + spec.alpha * np.array([lim, 1.0]) * (1.0 - sig))  # d/dg of g sigmoid(alpha g)
    want_dg = [2.0 * dglu[0], 0.0, (lim + 1) * dglu[1], (1 - lim) * dglu[1], (lim + 1) * dglu[1]]
    np.testing.assert_allclose(np.asarray(dg), want_dg, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(du), [lim * sig[0], lim * sig[0], sig[1], sig[1], 0.0], rtol=1e-12)


def _ragged_reference(lhs: np.ndarray, rhs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    ends = np.cumsum(sizes)
    return np.concatenate([lhs[e - s : e] @ rhs[g] for g, (s, e) in enumerate(zip(sizes, ends, strict=True))])


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.usefixtures("x64")
def test_ragged_dot_and_its_gradients_on_this_platform(dtype: str) -> None:
    """``jax.lax.ragged_dot(lhs [m, k], rhs [g, k, n], group_sizes [g])``: row group ``i`` (in order, an empty one
    included) times ``rhs[i]``; its gradients for ``lhs`` and ``rhs`` run here and are the grouped products' (to the
    dtype's rounding of the output: the reference is float64 on the same rounded inputs)."""
    rng = np.random.default_rng(5)
    sizes = np.array([3, 0, 5, 2], np.int32)
    lhs, rhs, dout = (_rounded(rng.standard_normal(s), dtype) for s in ((10, 6), (4, 6, 5), (10, 5)))
    dt = jnp.dtype(dtype)

    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(a, b, jnp.asarray(sizes))

    out, vjp = jax.vjp(f, jnp.asarray(lhs, dt), jnp.asarray(rhs, dt))
    dl, dr = jax.jit(vjp)(jnp.asarray(dout, dt))
    ends = np.cumsum(sizes)
    want_dr = np.stack([lhs[e - s : e].T @ dout[e - s : e] for s, e in zip(sizes, ends, strict=True)])
    want_dl = np.concatenate([dout[e - s : e] @ rhs[g].T for g, (s, e) in enumerate(zip(sizes, ends, strict=True))])
    tol = {"float64": 1e-14, "float32": 1e-6, "bfloat16": 1e-2}[dtype]
    for got, want in ((out, _ragged_reference(lhs, rhs, sizes)), (dl, want_dl), (dr, want_dr)):
        assert got.dtype == dt
        assert np.max(np.abs(np.asarray(got).astype(np.float64) - want)) < tol * np.max(np.abs(want))
    assert not np.any(np.asarray(dr)[1])  # the empty group's gradient is zero
