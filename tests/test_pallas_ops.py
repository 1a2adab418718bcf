"""Checks for the Pallas gated-MLP kernel in ``jax_impl.ops.glu_pallas`` with both activations (``act``:
GeGLU's ``gelu_tanh`` and SwiGLU's ``silu``, a static argument).

Every value is judged against a float64 numpy reference computed from the exact low-precision
inputs (so input rounding is not counted as kernel error), with a dtype-keyed tolerance
table. On top of the absolute bar, the kernel's error must be no worse than 2x the error of
the plain ``jax.numpy`` reference (``glu_reference``) run at the same dtype. A negative
control checks that the float32 bar is tight enough to reject an exact-erf GELU, and each activation's kernel fails
the other's reference.

On a machine without a GPU the kernels run under the Pallas interpreter (``interpret=None``
resolves to True there); all kernel calls go through ``jax.jit``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from jax_impl.ops.glu_pallas import ACTIVATIONS, SUPPORTED_DTYPES, glu, glu_reference

pytestmark = pytest.mark.quick

# Odd shape (3 * 37 rows, 328 = 256 + 72 columns: ragged in both grid axes) and an aligned one.
SHAPES = [(3 * 37, 328), (64, 256)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]

# |actual - ref64| <= atol + rtol * |ref64| elementwise. The kernel rounds each output once
# from float32, so half an ulp of the output dtype (2**-8 bf16, 2**-11 fp16) is the floor; the
# rtol values leave ~2x headroom over that. float32 is set tight enough that an erf GELU
# (|gelu_erf - gelu_tanh| up to ~5e-4) cannot pass.
TOLERANCES: dict[jnp.dtype, dict[str, float]] = {
    jnp.dtype(jnp.float32): {"rtol": 1e-5, "atol": 1e-6},
    jnp.dtype(jnp.bfloat16): {"rtol": 8e-3, "atol": 1e-4},
    jnp.dtype(jnp.float16): {"rtol": 1e-3, "atol": 1e-5},
}
# Kernel error must be <= PLAIN_FACTOR * plain-jnp error + EPS_REL * max|ref|.
PLAIN_FACTOR = 2.0
EPS_REL = 1e-9

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ----------------------------------------------------------------------------- references


def _gelu_tanh_and_grad_f64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
    gelu = 0.5 * x * (1.0 + t)
    dgelu = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
    return gelu, dgelu


def _silu_and_grad_f64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sig = 0.5 * (1.0 + np.tanh(0.5 * x))  # sigmoid without overflow
    return x * sig, sig * (1.0 + x * (1.0 - sig))


_ACT_F64 = {"gelu_tanh": _gelu_tanh_and_grad_f64, "silu": _silu_and_grad_f64}


def _ref_fwd_f64(g, u, act: str = "gelu_tanh") -> np.ndarray:
    g64, u64 = np.asarray(g, np.float64), np.asarray(u, np.float64)
    return _ACT_F64[act](g64)[0] * u64


def _ref_bwd_f64(g, u, dh, act: str = "gelu_tanh") -> tuple[np.ndarray, np.ndarray]:
    g64, u64, dh64 = (np.asarray(a, np.float64) for a in (g, u, dh))
    a, da = _ACT_F64[act](g64)
    return dh64 * u64 * da, dh64 * a  # (dg, du)


# ----------------------------------------------------------------------------- jitted callables

_kernel_fwd = jax.jit(glu)
_plain_fwd = jax.jit(glu_reference)


def _pullback(fn, g, u, dh):
    """``(dg, du)`` of ``fn`` at ``(g, u)`` for cotangent ``dh``."""
    _, pullback = jax.vjp(fn, g, u)
    return pullback(dh)


def _vjp_of(fn):
    return jax.jit(lambda g, u, dh: _pullback(fn, g, u, dh))


_kernel_bwd = _vjp_of(glu)
_plain_bwd = _vjp_of(glu_reference)
#: Per activation: (kernel forward, plain forward, kernel vjp, plain vjp), all jitted.
_BY_ACT = {
    act: (
        jax.jit(lambda g, u, a=act: glu(g, u, act=a)),
        jax.jit(lambda g, u, a=act: glu_reference(g, u, a)),
        _vjp_of(lambda g, u, a=act: glu(g, u, act=a)),
        _vjp_of(lambda g, u, a=act: glu_reference(g, u, a)),
    )
    for act in ACTIVATIONS
}


# ----------------------------------------------------------------------------- helpers


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    g = jnp.asarray(2.0 * rng.standard_normal(shape), dtype)  # covers both GELU tails
    u = jnp.asarray(rng.standard_normal(shape), dtype)
    dh = jnp.asarray(rng.standard_normal(shape), dtype)
    return g, u, dh


def _max_abs_err(actual, ref64) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - ref64)))


def _tol_ratio(actual, ref64, dtype) -> float:
    """Worst |err| / (atol + rtol * |ref|); <= 1 means within tolerance. NaN/inf -> inf."""
    a = np.asarray(actual, np.float64)
    if not np.all(np.isfinite(a)):
        return math.inf
    tol = TOLERANCES[jnp.dtype(dtype)]
    return float(np.max(np.abs(a - ref64) / (tol["atol"] + tol["rtol"] * np.abs(ref64))))


def _assert_matches(name, kernel_out, plain_out, ref64, dtype):
    assert kernel_out.dtype == jnp.dtype(dtype), f"{name}: dtype {kernel_out.dtype} != {dtype}"
    assert kernel_out.shape == ref64.shape, f"{name}: shape {kernel_out.shape} != {ref64.shape}"
    ratio = _tol_ratio(kernel_out, ref64, dtype)
    assert ratio <= 1.0, f"{name}: kernel off the float64 reference by {ratio:.3g}x tolerance"
    k_err = _max_abs_err(kernel_out, ref64)
    p_err = _max_abs_err(plain_out, ref64)
    eps = EPS_REL * float(np.max(np.abs(ref64)))
    assert k_err <= PLAIN_FACTOR * p_err + eps, (
        f"{name}: kernel max err {k_err:.3g} > {PLAIN_FACTOR} x plain-jnp max err {p_err:.3g} + {eps:.3g}"
    )


# ----------------------------------------------------------------------------- tests


@pytest.mark.standard
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_forward_matches_float64(shape, dtype, act):
    g, u, _ = _inputs(shape, dtype)
    ref = _ref_fwd_f64(g, u, act)
    kernel_fwd, plain_fwd, _, _ = _BY_ACT[act]
    _assert_matches(f"h ({act})", kernel_fwd(g, u), plain_fwd(g, u), ref, dtype)


@pytest.mark.standard
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_vjp_matches_float64(shape, dtype, act):
    g, u, dh = _inputs(shape, dtype)
    ref_dg, ref_du = _ref_bwd_f64(g, u, dh, act)
    _, _, kernel_bwd, plain_bwd = _BY_ACT[act]
    k_dg, k_du = kernel_bwd(g, u, dh)
    p_dg, p_du = plain_bwd(g, u, dh)
    _assert_matches(f"dg ({act})", k_dg, p_dg, ref_dg, dtype)
    _assert_matches(f"du ({act})", k_du, p_du, ref_du, dtype)


@pytest.mark.standard
def test_default_activation_is_gelu_tanh():
    """Without ``act`` the kernel is GeGLU's (the tanh-form GELU), bit for bit."""
    g, u, _ = _inputs((3 * 37, 328), jnp.float32)
    np.testing.assert_array_equal(_kernel_fwd(g, u), _BY_ACT["gelu_tanh"][0](g, u))


@pytest.mark.standard
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_each_activation_fails_the_others_reference(dtype):
    """The static ``act`` does switch the kernel: SiLU's output and gradient are far off GELU's reference and
    vice versa (odd shape, every dtype)."""
    g, u, dh = _inputs((3 * 37, 328), dtype)
    for act, other in (("silu", "gelu_tanh"), ("gelu_tanh", "silu")):
        _, _, kernel_bwd, _ = _BY_ACT[act]
        assert _tol_ratio(_BY_ACT[act][0](g, u), _ref_fwd_f64(g, u, other), dtype) > 10.0, act
        assert _tol_ratio(kernel_bwd(g, u, dh)[0], _ref_bwd_f64(g, u, dh, other)[0], dtype) > 10.0, act


def test_silu_extremes_are_finite_and_exact():
    """SiLU and its derivative at |g| up to 1e4 (exp(-g) overflows float32 past 88): finite and within the float32
    tolerance of float64; silu' tends to 1 on the right (no 1 - sigmoid cancellation) and 0 on the left."""
    g = jnp.asarray([[-1e4, -200.0, -90.0, -20.0, -1.0, 0.0, 1.0, 20.0, 90.0, 200.0, 1e4]], jnp.float32)
    u = jnp.ones_like(g)
    kernel_fwd, _, kernel_bwd, _ = _BY_ACT["silu"]
    h = kernel_fwd(g, u)
    dg, du = kernel_bwd(g, u, jnp.ones_like(g))
    assert np.all(np.isfinite(np.asarray(h))) and np.all(np.isfinite(np.asarray(dg)))
    assert _tol_ratio(h, _ref_fwd_f64(g, u, "silu"), jnp.float32) <= 1.0
    assert _tol_ratio(dg, _ref_bwd_f64(g, u, u, "silu")[0], jnp.float32) <= 1.0
    np.testing.assert_array_equal(du, h)


@pytest.mark.standard
def test_grad_of_loss_under_jit():
    g, u, _ = _inputs((3 * 37, 328), jnp.float32, seed=1)
    loss = jax.jit(jax.grad(lambda g, u: jnp.sum(glu(g, u) ** 2), argnums=(0, 1)))
    dg, du = loss(g, u)
    h = _ref_fwd_f64(g, u)
    ref_dg, ref_du = _ref_bwd_f64(g, u, 2.0 * h)
    assert _tol_ratio(dg, ref_dg, jnp.float32) <= 1.0
    assert _tol_ratio(du, ref_du, jnp.float32) <= 1.0


@pytest.mark.standard
def test_small_blocks_many_ragged_tiles():
    # 111 x 328 with 8 x 128 tiles: a 14 x 3 grid whose last row and column of tiles are partial.
    g, u, dh = _inputs((3 * 37, 328), jnp.float32, seed=2)

    def small_block_geglu(a, b):
        return glu(a, b, block_shape=(8, 128))

    h, (dg, du) = jax.jit(lambda g, u, dh: (small_block_geglu(g, u), _pullback(small_block_geglu, g, u, dh)))(g, u, dh)
    ref_dg, ref_du = _ref_bwd_f64(g, u, dh)
    assert _tol_ratio(h, _ref_fwd_f64(g, u), jnp.float32) <= 1.0
    assert _tol_ratio(dg, ref_dg, jnp.float32) <= 1.0
    assert _tol_ratio(du, ref_du, jnp.float32) <= 1.0


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_backward_is_a_pallas_kernel_and_saves_only_g_u(act):
    g, u, dh = _inputs((64, 256), jnp.float32)

    def kernel(a, b):
        return glu(a, b, act=act)

    jaxpr = str(jax.make_jaxpr(lambda g, u, dh: jax.vjp(kernel, g, u)[1](dh))(g, u, dh))
    assert jaxpr.count("pallas_call") == 2, jaxpr  # forward kernel + backward kernel
    family = {"gelu_tanh": "geglu", "silu": "swiglu"}[act]
    assert f"name={family}_fwd" in jaxpr and f"name={family}_bwd" in jaxpr, jaxpr
    _, pullback = jax.vjp(kernel, g, u)
    residuals = [x for x in jax.tree_util.tree_leaves(pullback) if hasattr(x, "shape")]
    assert len(residuals) == 2
    assert all(r.shape == g.shape and r.dtype == g.dtype for r in residuals)
    np.testing.assert_array_equal(residuals[0], g)
    np.testing.assert_array_equal(residuals[1], u)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_kernels_lower_to_triton_for_cuda(dtype, act):
    """Lower (not run) both kernels through the Pallas Triton lowering; needs no GPU.

    The interpreter pads ragged edge tiles itself, so only this lowering exercises the GPU
    path: power-of-two blocks, masked loads/stores and every primitive in the kernel bodies.
    """
    spec = jax.ShapeDtypeStruct((3 * 37, 328), dtype)
    checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]

    def fwd(g, u):
        return glu(g, u, act=act, interpret=False)

    def bwd(g, u, dh):
        return _pullback(fwd, g, u, dh)

    for fn, args in ((fwd, (spec, spec)), (bwd, (spec, spec, spec))):
        module = export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
        calls = [line for line in module.splitlines() if "@__gpu$xla.gpu.triton(" in line]
        # One kernel each: the vjp's forward output is unused, so only the backward kernel remains.
        assert len(calls) == 1, module[:2000]
        assert "grid_x = 4 : i32, grid_y = 2 : i32" in calls[0]  # 32 x 256 tiles over 111 x 328
        n_out = 1 if fn is fwd else 2
        assert calls[0].lstrip().startswith("%0:2 =" if n_out == 2 else "%0 ="), calls[0][:200]


def test_negative_control_erf_gelu_fails_float32_check():
    g, u, dh = _inputs((3 * 37, 328), jnp.float32)
    h_erf = jax.jit(lambda g, u: jax.nn.gelu(g, approximate=False) * u)(g, u)
    assert _tol_ratio(h_erf, _ref_fwd_f64(g, u), jnp.float32) > 1.0

    def erf_geglu(a, b):
        return jax.nn.gelu(a, approximate=False) * b

    dg_erf, _ = jax.jit(lambda g, u, dh: _pullback(erf_geglu, g, u, dh))(g, u, dh)
    assert _tol_ratio(dg_erf, _ref_bwd_f64(g, u, dh)[0], jnp.float32) > 1.0


@pytest.mark.parametrize("interpret", [None, True, False])
def test_interpret_flag_reaches_pallas_call(interpret):
    g = jnp.ones((4, 4), jnp.float32)
    jaxpr = str(jax.make_jaxpr(lambda a, b: glu(a, b, interpret=interpret))(g, g))
    expected = (jax.default_backend() != "gpu") if interpret is None else interpret
    assert f"interpret={expected}" in jaxpr


def test_supported_dtypes_table_matches():
    assert set(TOLERANCES) == set(SUPPORTED_DTYPES)


def test_empty_input():
    g = jnp.zeros((0, 5), jnp.float32)
    assert glu(g, g).shape == (0, 5)


@pytest.mark.parametrize(
    ("g", "u", "kwargs", "match"),
    [
        (jnp.zeros((4, 4, 4)), jnp.zeros((4, 4, 4)), {}, "must be 2-D"),
        (jnp.zeros((4, 4)), jnp.zeros((4, 8)), {}, "same shape"),
        (jnp.zeros((4, 4)), jnp.zeros((4, 4), jnp.bfloat16), {}, "same dtype"),
        (jnp.zeros((4, 4), jnp.int32), jnp.zeros((4, 4), jnp.int32), {}, "int32; allowed: float32, bfloat16"),
        (jnp.zeros((4, 4)), jnp.zeros((4, 4)), {"interpret": 1}, "interpret must be"),
        (jnp.zeros((4, 4)), jnp.zeros((4, 4)), {"block_shape": (8, 100)}, "powers of two"),
        ([[1.0]], [[1.0]], {}, "must be an array"),
        (jnp.zeros((4, 4)), jnp.zeros((4, 4)), {"act": "relu"}, "act must be one of gelu_tanh, silu, got 'relu'"),
    ],
    ids=["rank", "shape", "dtype-mismatch", "dtype", "interpret", "block", "not-array", "act"],
)
def test_validation_errors(g, u, kwargs, match):
    with pytest.raises(ValueError, match=match):
        glu(g, u, **kwargs)
