"""Elementwise GeGLU step as hand-written Triton kernels.

The GeGLU MLP block is ``y = down(gelu_tanh(gate(x)) * up(x))``. This module implements
only the elementwise middle step ``h = gelu_tanh(g) * u`` (forward) and its backward, on
flattened contiguous tensors of any shape:

* :func:`geglu_forward` ``(g, u) -> h``
* :func:`geglu_backward` ``(dh, g, u) -> (dg, du)``
* :class:`GeGLUFunction` / :func:`geglu` -- autograd wrapper that saves ``g`` and ``u`` only
  and recomputes ``gelu(g)`` and ``gelu'(g)`` in the backward kernel.

All math runs in float32 inside the kernels; results are cast back to the input dtype.
GELU uses the tanh form ``0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))``, with
``tanh(z)`` computed as ``2 * sigmoid(2z) - 1`` because libdevice ``tanh`` does not run under
the Triton CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_env import FP_FUSION, interpreted

__all__ = [
    "SUPPORTED_DTYPES",
    "GeGLUFunction",
    "geglu",
    "geglu_backward",
    "geglu_forward",
    "interpreted",
]

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

# Module-level launch choice, fixed at import time like the kernels themselves (see
# _triton_env). Under the interpreter each program instance is one Python-level step over
# numpy arrays, so a few huge blocks are far cheaper than many small ones. On a GPU a
# 1024-element block with 4 warps (8 elements per thread) is a standard streaming shape.
_INTERPRET: bool = interpreted()
BLOCK_SIZE: int = 1 << 16 if _INTERPRET else 1024
NUM_WARPS: int = 4
# The interpreter's fp32 -> bf16 `.to()` truncates toward zero (up to 1 ulp error) where the GPU
# rounds to nearest even; when interpreting, the kernels round to bf16 by hand (see cast_out).
EXACT_BF16_CAST: bool = _INTERPRET
_LAUNCH_OPTS: dict = {"num_warps": NUM_WARPS, "enable_fp_fusion": FP_FUSION}


# Constants below are written as literals inside the kernels: sqrt(2/pi) = 0.7978845608028654,
# GELU cubic coefficient 0.044715.


@triton.jit
def _clamp_tanh_arg(z):
    """Clamp z to [-44, 44]: tanh(z) is already +-1 in fp32 there, and exp(-2z) inside
    tl.sigmoid stays finite (fp32 exp overflows past 88.7). Results are unchanged; it only
    avoids inf intermediates (and numpy overflow warnings under the interpreter)."""
    return tl.minimum(tl.maximum(z, -44.0), 44.0)


@triton.jit
def _tanh(z):
    """tanh(z) = 2 * sigmoid(2z) - 1 (fp32); avoids libdevice tanh, unavailable when interpreting."""
    z = _clamp_tanh_arg(z)
    return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def _gelu_inner(g):
    """sqrt(2/pi) * (g + 0.044715 * g^3)."""
    return 0.7978845608028654 * (g + 0.044715 * g * g * g)


@triton.jit
def gelu_tanh(g):
    """gelu_tanh(g) = 0.5 g (1 + tanh(inner(g))) for an fp32 block; shared with the fused GEMM epilogue."""
    return 0.5 * g * (1.0 + _tanh(_gelu_inner(g)))


@triton.jit
def _gelu_tanh_and_grad(g):
    """Return (gelu_tanh(g), d gelu_tanh / dg) for an fp32 block, sharing one tanh evaluation.

    d/dg [0.5 g (1 + tanh(z))] = 0.5 (1 + t) + 0.5 g (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2),
    with z = inner(g), t = tanh(z) = 2 s - 1, s = sigmoid(2z). 1 - t^2 is evaluated as
    4 s sigmoid(-2z) rather than 1 - t*t: the latter cancels to an absolute error of ~1e-7
    for large |z|, which the 0.5 g (1 + 3 a g^2) factor amplifies to ~1e-5 at |g| ~ 8.
    """
    z = _clamp_tanh_arg(_gelu_inner(g))
    s = tl.sigmoid(2.0 * z)
    t = 2.0 * s - 1.0  # tanh(z)
    sech2 = 4.0 * s * tl.sigmoid(-2.0 * z)  # 1 - tanh(z)^2
    gelu = 0.5 * g * (1.0 + t)
    d_inner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    dgelu = 0.5 * (1.0 + t) + 0.5 * g * sech2 * d_inner
    return gelu, dgelu


@triton.jit
def cast_out(x, dtype: tl.constexpr, EXACT_BF16: tl.constexpr):
    """Cast an fp32 block to ``dtype`` with round-to-nearest-even.

    ``EXACT_BF16`` is set only under the interpreter, whose fp32 -> bf16 conversion truncates:
    there the bf16 rounding is done on the bit pattern (add 0x7FFF plus the lowest kept bit,
    keep the high 16 bits; NaN passes through). On GPU the native conversion already rounds
    to nearest even and this branch is compiled out.
    """
    if EXACT_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        out = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        out = tl.where(x != x, x.to(tl.bfloat16), out)
    else:
        out = x.to(dtype)
    return out


@triton.jit
def _geglu_fwd_kernel(g_ptr, u_ptr, h_ptr, n_elements, BLOCK: tl.constexpr, EXACT_BF16: tl.constexpr):
    # Traffic: reads g and u once, writes h once -> 3 * numel * itemsize bytes; no
    # intermediate (gelu(g)) ever reaches memory. ~12 FLOPs + 1 exp per element.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: safe past 2**31 elements
    mask = offs < n_elements  # masked tail: numel need not be a multiple of BLOCK
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h = gelu_tanh(g) * u
    tl.store(h_ptr + offs, cast_out(h, h_ptr.dtype.element_ty, EXACT_BF16), mask=mask)


@triton.jit
def _geglu_bwd_kernel(
    dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n_elements, BLOCK: tl.constexpr, EXACT_BF16: tl.constexpr
):
    # Traffic: reads dh, g, u and writes dg, du -> 5 * numel * itemsize bytes. gelu(g) is
    # recomputed from g instead of being saved by the forward (saves numel * itemsize of
    # activation memory and one read). ~25 FLOPs + 2 exps per element.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    gelu, dgelu = _gelu_tanh_and_grad(g)  # recomputed from g, tanh-form derivative
    du = dh * gelu
    dg = dh * u * dgelu
    tl.store(dg_ptr + offs, cast_out(dg, dg_ptr.dtype.element_ty, EXACT_BF16), mask=mask)
    tl.store(du_ptr + offs, cast_out(du, du_ptr.dtype.element_ty, EXACT_BF16), mask=mask)


def _check_same(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> None:
    """Raise ValueError unless all tensors share shape, dtype and device and the dtype is supported."""
    for name, t in zip(names, tensors, strict=True):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    ref_name, ref = names[0], tensors[0]
    for name, t in zip(names[1:], tensors[1:], strict=True):
        if t.shape != ref.shape:
            raise ValueError(
                f"{name} and {ref_name} must have the same shape; got {name}: {tuple(t.shape)}, "
                f"{ref_name}: {tuple(ref.shape)}"
            )
        if t.dtype != ref.dtype:
            raise ValueError(
                f"{name} and {ref_name} must have the same dtype; got {name}: {t.dtype}, "
                f"{ref_name}: {ref.dtype}"
            )
        if t.device != ref.device:
            raise ValueError(
                f"{name} and {ref_name} must be on the same device; got {name}: {t.device}, "
                f"{ref_name}: {ref.device}"
            )
    if ref.dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"unsupported dtype {ref.dtype} for {', '.join(names)}; allowed: {allowed}")


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK_SIZE),)


def geglu_forward(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """h = gelu_tanh(g) * u, elementwise, in one Triton pass.

    Args:
        g: gate pre-activation, any shape ``S``, float32/bfloat16/float16.
        u: up projection, shape ``S``, same dtype and device as ``g``.

    Returns:
        h: shape ``S``, contiguous, dtype of the inputs (math in fp32).

    Bytes moved: ``3 * numel * itemsize`` (read g, read u, write h).
    """
    _check_same(("g", "u"), (g, u))
    g_c, u_c = g.contiguous(), u.contiguous()
    h = torch.empty_like(g_c)
    n = g_c.numel()
    if n == 0:
        return h
    _geglu_fwd_kernel[_grid(n)](g_c, u_c, h, n, BLOCK=BLOCK_SIZE, EXACT_BF16=EXACT_BF16_CAST, **_LAUNCH_OPTS)
    return h


def geglu_backward(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of h = gelu_tanh(g) * u in one Triton pass, recomputing gelu(g) from g.

    Args:
        dh: upstream gradient, shape ``S``.
        g: gate pre-activation saved by the forward, shape ``S``.
        u: up projection saved by the forward, shape ``S``.
        All three share dtype (float32/bfloat16/float16) and device.

    Returns:
        ``(dg, du)``, each shape ``S`` in the input dtype, with ``du = dh * gelu_tanh(g)`` and
        ``dg = dh * u * gelu_tanh'(g)`` (tanh-form derivative, fp32 math).

    Bytes moved: ``5 * numel * itemsize`` (read dh, g, u; write dg, du).
    """
    _check_same(("dh", "g", "u"), (dh, g, u))
    dh_c, g_c, u_c = dh.contiguous(), g.contiguous(), u.contiguous()
    dg = torch.empty_like(g_c)
    du = torch.empty_like(u_c)
    n = g_c.numel()
    if n == 0:
        return dg, du
    _geglu_bwd_kernel[_grid(n)](
        dh_c, g_c, u_c, dg, du, n, BLOCK=BLOCK_SIZE, EXACT_BF16=EXACT_BF16_CAST, **_LAUNCH_OPTS
    )
    return dg, du


class GeGLUFunction(torch.autograd.Function):
    """Autograd wrapper: forward runs :func:`geglu_forward`, backward :func:`geglu_backward`.

    Saves only ``g`` and ``u`` (never ``gelu(g)``); the backward kernel recomputes it.
    """

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        h = geglu_forward(g, u)
        ctx.save_for_backward(g, u)
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        g, u = ctx.saved_tensors
        return geglu_backward(dh.to(g.dtype), g, u)


def geglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Differentiable h = gelu_tanh(g) * u (shape of ``g``) via :class:`GeGLUFunction`."""
    return GeGLUFunction.apply(g, u)
