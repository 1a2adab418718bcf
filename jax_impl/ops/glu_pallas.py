"""Fused gated-MLP gating, ``h = act(g) * u`` (GeGLU: ``act = gelu_tanh``; SwiGLU: ``act = silu``), as a Pallas
kernel with a Pallas backward.

This is the elementwise middle of the gated MLP block ``y = down(act(gate(x)) * up(x))``:
``g = gate(x)`` and ``u = up(x)`` come in as two ``[M, N]`` arrays and ``h`` goes out to ``down``.
The activation is a static argument (``act``, one of :data:`ACTIVATIONS`): each value traces its own kernel, the
other activation's code is not in it. :func:`glu` is the entry point (default ``act="gelu_tanh"``, GeGLU's).

Layout
    One ``pl.pallas_call`` over a 2-D grid of ``(block_m, block_n)`` tiles,
    ``grid = (cdiv(M, block_m), cdiv(N, block_n))``, with ``BlockSpec``s mapping program
    ``(i, j)`` to tile ``(i, j)`` of every operand. The backward pass is a second
    ``pl.pallas_call`` with the same grid that reads ``(dh, g, u)`` and writes ``(dg, du)``.

Ragged edges: pad-free, masked blocks
    ``M`` and ``N`` need not be multiples of the block (e.g. ``111 x 328``). Nothing is padded
    or sliced in this module: the edge tiles load through ``plgpu.load(..., mask=..., other=0)``
    and store through ``plgpu.store(..., mask=...)``, with the mask built from
    ``pl.program_id`` and the true ``M``/``N``. The masks are needed on a GPU, because the
    Pallas Triton lowering does not bounds-check plain ``ref[...]`` accesses: an edge tile
    would read and write past the end of the buffer. Under ``interpret=True`` Pallas itself
    pads the operands to whole blocks (with NaN/garbage) and slices the outputs back; the
    mask keeps that padding out of the math too.

Precision
    Inputs may be float32, bfloat16 or float16 (both operands the same shape and dtype). Every
    tile is upcast to float32, all of the math runs in float32, and each result is rounded to
    the input dtype exactly once, on the store.

GELU
    The tanh approximation, as ``jax.nn.gelu(x, approximate=True)`` and PyTorch's
    ``gelu(x, approximate="tanh")``, and its exact derivative::

        gelu(x)  = 0.5 * x * (1 + t),   t = tanh(z),  z = k * (x + a * x**3),  k = sqrt(2/pi), a = 0.044715
        gelu'(x) = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * k * (1 + 3 * a * x**2)

    The kernels evaluate the same function through the identities ``0.5 * (1 + tanh(z)) =
    sigmoid(2z)`` and ``0.25 * (1 - tanh(z)**2) = sigmoid(2z) * sigmoid(-2z)``, using
    ``e = exp(-2|z|)``. Written literally with ``tanh``, ``1 + t`` and ``1 - t**2`` cancel to
    zero in float32 once ``x < ~-4.5`` (``tanh`` rounds to -1): e.g. at ``x = -4.92`` the true
    ``gelu'`` is ~-1.3e-5 and the literal form returns 0. ``glu_reference`` (and
    ``jax.nn.gelu``) keep the literal form and that error.

SiLU
    ``silu(x) = x * sigmoid(x)`` and ``silu'(x) = sigmoid(x) * (1 + x * sigmoid(-x))``, both sigmoids from the same
    ``e = exp(-|x|)`` (no overflow, and ``sigmoid(-x) = 1 - sigmoid(x)`` without the subtraction's cancellation).

Autodiff
    ``glu`` is a ``jax.custom_vjp``. The forward saves only ``g`` and ``u`` (not ``h`` and not
    ``act(g)``); the backward recomputes ``act(g)`` and ``act'(g)`` from ``g``::

        du = dh * act(g)
        dg = dh * u * act'(g)

``glu_reference`` is the plain ``jax.numpy`` formula, kept beside the kernel the way JAX's
``pallas/ops/gpu/layer_norm.py`` keeps ``layer_norm_reference``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["ACTIVATIONS", "DEFAULT_BLOCK_SHAPE", "SUPPORTED_DTYPES", "glu", "glu_reference"]

#: The activations the kernels take (their static ``act``): GeGLU's tanh-form GELU and SwiGLU's SiLU.
ACTIVATIONS: tuple[str, ...] = ("gelu_tanh", "silu")
#: The pallas_call names per activation (``<family>_fwd``, ``<family>_bwd``), as profiles show them.
_FAMILY: dict[str, str] = {"gelu_tanh": "geglu", "silu": "swiglu"}

#: Input dtypes the kernel accepts; the math inside is always float32.
SUPPORTED_DTYPES: tuple[jnp.dtype, ...] = (
    jnp.dtype(jnp.float32),
    jnp.dtype(jnp.bfloat16),
    jnp.dtype(jnp.float16),
)

#: Default ``(block_m, block_n)`` tile. Triton wants power-of-two block sizes; a 32 x 256 tile
#: is 8192 elements (32 KiB per float32 operand), i.e. 64 elements per thread at 4 warps.
DEFAULT_BLOCK_SHAPE: tuple[int, int] = (32, 256)

# Triton launch parameters. Passing Triton ``CompilerParams`` also pins the Triton lowering on
# GPU (rather than Mosaic GPU, which ``jax_pallas_use_mosaic_gpu`` would otherwise select).
# Ignored under ``interpret=True``.
_NUM_WARPS = 4
_NUM_STAGES = 1

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


# --------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------


def glu_reference(g: jax.Array, u: jax.Array, act: str = "gelu_tanh") -> jax.Array:
    """Plain ``jax.numpy`` gating: ``jax.nn.gelu(g, approximate=True) * u`` or ``jax.nn.silu(g) * u``.

    Args:
        g: gate pre-activation, ``[M, N]``.
        u: up projection, ``[M, N]``, same dtype as ``g``.
        act: ``"gelu_tanh"`` or ``"silu"``.

    Returns:
        ``h``: ``[M, N]`` in the input dtype, computed at the input dtype (no upcast), the way
        an unfused framework graph computes it. Differentiable with ordinary JAX autodiff.
    """
    _check_act(act)
    if act == "silu":
        return jax.nn.silu(g) * u
    return jax.nn.gelu(g, approximate=True) * u


def _check_act(act: object) -> None:
    """Raise ValueError unless ``act`` is one of :data:`ACTIVATIONS`."""
    if act not in ACTIVATIONS:
        raise ValueError(f"glu: act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")


# --------------------------------------------------------------------------------------------
# float32 math shared by both kernels (runs on float32 tiles inside the kernel bodies)
# --------------------------------------------------------------------------------------------


def _gelu_terms_f32(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Stable pieces of the tanh-form GELU for a float32 tile.

    With ``z = k * (x + a * x**3)`` and ``t = tanh(z)``, returns ``(s, s1ms, z')`` where
    ``s = 0.5 * (1 + t)`` (= ``sigmoid(2z)``), ``s1ms = s * (1 - s)`` (= ``0.25 * (1 - t**2)``)
    and ``z' = dz/dx = k * (1 + 3a * x**2)``. Both are evaluated through ``e = exp(-2|z|)``,
    which lies in ``(0, 1]`` and so never overflows, instead of ``1 + tanh(z)`` and ``1 - t**2``,
    which cancel catastrophically once ``tanh(z)`` rounds to -1 (float32: ``x < ~-4.5``).
    """
    x2 = x * x
    z = _SQRT_2_OVER_PI * (x + _GELU_A * x2 * x)
    e = jnp.exp(-2.0 * jnp.abs(z))
    r = 1.0 / (1.0 + e)
    s = jnp.where(z >= 0, r, e * r)
    s1ms = e * r * r
    dz = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_A * x2)
    return s, s1ms, dz


def _gelu_tanh_f32(x: jax.Array) -> jax.Array:
    """``gelu_tanh(x) = 0.5 * x * (1 + tanh(z))`` for a float32 tile."""
    s, _, _ = _gelu_terms_f32(x)
    return x * s


def _gelu_tanh_and_grad_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(gelu_tanh(x), d gelu_tanh / dx)`` for a float32 tile, sharing one ``exp``.

    ``gelu'(x) = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * z' = s + 2 * x * s1ms * z'``.
    """
    s, s1ms, dz = _gelu_terms_f32(x)
    # s1ms == 0 only where exp(-2|z|) underflowed (|x| > ~9); there the second term is 0, but
    # x * z' may already be inf (|x| > ~5e19), and 0 * inf would give NaN.
    tail = jnp.where(s1ms > 0, (2.0 * s1ms * x) * dz, 0.0)
    return x * s, s + tail


def _sigmoid_pair_f32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(sigmoid(x), sigmoid(-x))`` for a float32 tile through ``e = exp(-|x|)`` in ``(0, 1]``."""
    e = jnp.exp(-jnp.abs(x))
    r = 1.0 / (1.0 + e)
    er = e * r
    return jnp.where(x >= 0, r, er), jnp.where(x >= 0, er, r)


def _act_f32(x: jax.Array, act: str) -> jax.Array:
    """``act(x)`` for a float32 tile; ``act`` is static (the other form is not traced)."""
    if act == "silu":
        return x * _sigmoid_pair_f32(x)[0]
    return _gelu_tanh_f32(x)


def _act_and_grad_f32(x: jax.Array, act: str) -> tuple[jax.Array, jax.Array]:
    """``(act(x), act'(x))`` for a float32 tile, sharing one ``exp``; ``act`` is static.

    SiLU: ``silu'(x) = sigmoid(x) * (1 + x * sigmoid(-x))``."""
    if act == "silu":
        sig, sig_neg = _sigmoid_pair_f32(x)
        return x * sig, sig * (1.0 + x * sig_neg)
    return _gelu_tanh_and_grad_f32(x)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


def _tile_mask(m: int, n: int, block_m: int, block_n: int) -> jax.Array:
    """``[block_m, block_n]`` bool mask of the tile elements that lie inside the ``[m, n]`` array."""
    rows = pl.program_id(0) * block_m + jnp.arange(block_m)
    cols = pl.program_id(1) * block_n + jnp.arange(block_n)
    return (rows[:, None] < m) & (cols[None, :] < n)


def _glu_fwd_kernel(g_ref, u_ref, h_ref, *, m: int, n: int, block_m: int, block_n: int, act: str):
    # Per tile: reads 2 * block_m * block_n * itemsize (g, u), writes block_m * block_n * itemsize (h).
    mask = _tile_mask(m, n, block_m, block_n)
    g = plgpu.load(g_ref, mask=mask, other=0).astype(jnp.float32)
    u = plgpu.load(u_ref, mask=mask, other=0).astype(jnp.float32)
    h = _act_f32(g, act) * u
    plgpu.store(h_ref, h.astype(h_ref.dtype), mask=mask)


def _glu_bwd_kernel(dh_ref, g_ref, u_ref, dg_ref, du_ref, *, m: int, n: int, block_m: int, block_n: int, act: str):
    # Per tile: reads 3 * block_m * block_n * itemsize (dh, g, u),
    # writes 2 * block_m * block_n * itemsize (dg, du).
    mask = _tile_mask(m, n, block_m, block_n)
    dh = plgpu.load(dh_ref, mask=mask, other=0).astype(jnp.float32)
    g = plgpu.load(g_ref, mask=mask, other=0).astype(jnp.float32)
    u = plgpu.load(u_ref, mask=mask, other=0).astype(jnp.float32)
    a, da = _act_and_grad_f32(g, act)
    plgpu.store(du_ref, (dh * a).astype(du_ref.dtype), mask=mask)
    plgpu.store(dg_ref, (dh * u * da).astype(dg_ref.dtype), mask=mask)


# --------------------------------------------------------------------------------------------
# pallas_call wrappers
# --------------------------------------------------------------------------------------------


def _grid_and_spec(shape: tuple[int, int], block_shape: tuple[int, int]) -> tuple[tuple[int, int], pl.BlockSpec]:
    m, n = shape
    block_m, block_n = block_shape
    grid = (pl.cdiv(m, block_m), pl.cdiv(n, block_n))
    spec = pl.BlockSpec((block_m, block_n), lambda i, j: (i, j))
    return grid, spec


def _glu_fwd_call(g: jax.Array, u: jax.Array, act: str, interpret: bool, block_shape: tuple[int, int]) -> jax.Array:
    """Forward kernel launch: ``[M, N], [M, N] -> [M, N]``.

    HBM traffic: reads ``2 * M * N * itemsize`` (g, u) and writes ``M * N * itemsize`` (h),
    ``3 * M * N * itemsize`` in all: the minimum for this op.
    """
    m, n = g.shape
    if m == 0 or n == 0:
        return jnp.zeros((m, n), g.dtype)
    grid, spec = _grid_and_spec((m, n), block_shape)
    kernel = functools.partial(_glu_fwd_kernel, m=m, n=n, block_m=block_shape[0], block_n=block_shape[1], act=act)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), g.dtype),
        grid=grid,
        in_specs=[spec, spec],
        out_specs=spec,
        compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=_NUM_STAGES),
        interpret=interpret,
        name=f"{_FAMILY[act]}_fwd",
    )(g, u)


def _glu_bwd_call(
    dh: jax.Array, g: jax.Array, u: jax.Array, act: str, interpret: bool, block_shape: tuple[int, int]
) -> tuple[jax.Array, jax.Array]:
    """Backward kernel launch: ``dh, g, u: [M, N] -> (dg, du): [M, N] each``.

    HBM traffic: reads ``3 * M * N * itemsize`` (dh, g, u) and writes ``2 * M * N * itemsize``
    (dg, du), ``5 * M * N * itemsize`` in all.
    """
    m, n = g.shape
    if m == 0 or n == 0:
        return jnp.zeros((m, n), g.dtype), jnp.zeros((m, n), u.dtype)
    grid, spec = _grid_and_spec((m, n), block_shape)
    kernel = functools.partial(_glu_bwd_kernel, m=m, n=n, block_m=block_shape[0], block_n=block_shape[1], act=act)
    out_shape = jax.ShapeDtypeStruct((m, n), g.dtype)
    dg, du = pl.pallas_call(
        kernel,
        out_shape=(out_shape, out_shape),
        grid=grid,
        in_specs=[spec, spec, spec],
        out_specs=(spec, spec),
        compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=_NUM_STAGES),
        interpret=interpret,
        name=f"{_FAMILY[act]}_bwd",
    )(dh, g, u)
    return dg, du


# --------------------------------------------------------------------------------------------
# custom_vjp
# --------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _glu(g: jax.Array, u: jax.Array, act: str, interpret: bool, block_shape: tuple[int, int]) -> jax.Array:
    return _glu_fwd_call(g, u, act, interpret, block_shape)


def _glu_vjp_fwd(g, u, act, interpret, block_shape):
    # Residuals are exactly (g, u): 2 * M * N * itemsize kept alive for the backward pass.
    return _glu_fwd_call(g, u, act, interpret, block_shape), (g, u)


def _glu_vjp_bwd(act, interpret, block_shape, residuals, dh):
    g, u = residuals
    # The cotangent arrives in h's dtype, which is the input dtype; cast defensively anyway.
    return _glu_bwd_call(dh.astype(g.dtype), g, u, act, interpret, block_shape)


_glu.defvjp(_glu_vjp_fwd, _glu_vjp_bwd)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _default_interpret() -> bool:
    """Interpret unless the default backend is a GPU (the Pallas Triton lowering's target)."""
    return jax.default_backend() not in ("gpu", "cuda", "rocm")


def _next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _is_power_of_2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _validate(g, u, act, interpret, block_shape) -> None:
    _check_act(act)
    for name, x in (("g", g), ("u", u)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(
                f"glu: {name} must be an array with .shape and .dtype (jax.Array or numpy array), "
                f"got {type(x).__name__}"
            )
        if len(x.shape) != 2:
            raise ValueError(
                f"glu: {name} must be 2-D [M, N], got {len(x.shape)}-D with shape {tuple(x.shape)}; "
                "reshape leading dimensions into M first"
            )
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            allowed = ", ".join(d.name for d in SUPPORTED_DTYPES)
            raise ValueError(f"glu: {name} has dtype {jnp.dtype(x.dtype).name}; allowed: {allowed}")
    if tuple(g.shape) != tuple(u.shape):
        raise ValueError(f"glu: g and u must have the same shape, got g {tuple(g.shape)} and u {tuple(u.shape)}")
    if jnp.dtype(g.dtype) != jnp.dtype(u.dtype):
        raise ValueError(
            f"glu: g and u must have the same dtype, got g {jnp.dtype(g.dtype).name} and "
            f"u {jnp.dtype(u.dtype).name}; cast one of them first"
        )
    if interpret is not None and not isinstance(interpret, bool):
        raise ValueError(f"glu: interpret must be True, False or None, got {interpret!r}")
    if block_shape is not None:
        ok = (
            isinstance(block_shape, tuple | list)
            and len(block_shape) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and _is_power_of_2(b) for b in block_shape)
        )
        if not ok:
            raise ValueError(
                "glu: block_shape must be None or a pair of positive powers of two (block_m, block_n) "
                f"(the Triton lowering requires power-of-two blocks), got {block_shape!r}"
            )


def glu(
    g: jax.Array,
    u: jax.Array,
    *,
    act: str = "gelu_tanh",
    interpret: bool | None = None,
    block_shape: tuple[int, int] | None = None,
) -> jax.Array:
    """Fused ``h = act(g) * u`` (Pallas forward, Pallas backward via ``jax.custom_vjp``).

    Args:
        g: gate pre-activation, ``[M, N]``; float32, bfloat16 or float16.
        u: up projection, ``[M, N]``; same shape and dtype as ``g``.
        act: ``"gelu_tanh"`` (GeGLU, the default) or ``"silu"`` (SwiGLU); static (each traces its own kernels).
        interpret: run the kernels in the Pallas interpreter. ``None`` (default): interpret
            when ``jax.default_backend()`` is not a GPU, so the same call works on CPU.
        block_shape: ``(block_m, block_n)`` tile, positive powers of two. ``None`` uses
            ``DEFAULT_BLOCK_SHAPE`` shrunk to the next power of two >= ``M`` / ``N`` for
            small arrays. Edge tiles of arrays that are not block multiples are masked.

    Returns:
        ``h``: ``[M, N]`` in the input dtype (float32 math inside, one rounding on the store).

    Raises:
        ValueError: ``g``/``u`` not 2-D, shapes or dtypes differ, dtype unsupported, bad
            ``act``, ``interpret`` or ``block_shape``.

    HBM traffic: forward ``3 * M * N * itemsize`` (reads g, u; writes h); backward
    ``5 * M * N * itemsize`` (reads dh, g, u; writes dg, du). Works under ``jax.jit``,
    ``jax.grad`` and ``jax.vjp``.
    """
    _validate(g, u, act, interpret, block_shape)
    g = jnp.asarray(g)
    u = jnp.asarray(u)
    if interpret is None:
        interpret = _default_interpret()
    m, n = g.shape
    if block_shape is None:
        block_shape = (
            min(DEFAULT_BLOCK_SHAPE[0], _next_power_of_2(m)),
            min(DEFAULT_BLOCK_SHAPE[1], _next_power_of_2(n)),
        )
    return _glu(g, u, act, interpret, tuple(block_shape))
