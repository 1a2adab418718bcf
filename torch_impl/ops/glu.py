"""Elementwise gated-MLP step (GeGLU, SwiGLU) as hand-written Triton kernels.

The gated MLP block is ``y = down(act(gate(x)) * up(x))`` with ``act`` the tanh-form GELU (GeGLU) or SiLU
(SwiGLU). This module implements only the elementwise middle step ``h = act(g) * u`` (forward) and its backward,
on flattened contiguous tensors of any shape; ``act`` is ``"gelu_tanh"`` (the default) or ``"silu"``, passed to the
kernels as their compile-time ``ACT``:

* :func:`glu_forward` ``(g, u, act) -> h``
* :func:`glu_backward` ``(dh, g, u, act) -> (dg, du)``
* :class:`GLUFunction` / :func:`glu` -- autograd wrapper that saves ``g`` and ``u`` only
  and recomputes ``act(g)`` and ``act'(g)`` in the backward kernel.

The ``@triton.jit`` kernels themselves live in :mod:`triton_impl.glu_kernels` (no torch import there, so JAX
launches the same kernels through jax-triton); this module launches them on torch tensors.

All math runs in float32 inside the kernels; results are cast back to the input dtype.
GELU uses the tanh form ``0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))``, with
``tanh(z)`` computed as ``2 * sigmoid(2z) - 1`` because libdevice ``tanh`` does not run under
the Triton CPU interpreter; SiLU is ``s * sigmoid(s)``.
"""

from __future__ import annotations

import torch
import triton

from triton_impl.env import FP_FUSION
from triton_impl.glu_kernels import ACTIVATIONS, BLOCK_SIZE, EXACT_BF16_CAST, INTERPRETED, NUM_WARPS
from triton_impl.glu_kernels import glu_bwd_kernel as _glu_bwd_kernel
from triton_impl.glu_kernels import glu_fwd_kernel as _glu_fwd_kernel

from ._launch import launch

__all__ = [
    "SUPPORTED_DTYPES",
    "GLUFunction",
    "check_act",
    "glu",
    "glu_backward",
    "glu_forward",
]

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

# The kernels and their launch constants (BLOCK_SIZE, NUM_WARPS, EXACT_BF16_CAST: fixed at import time, interpreter
# or GPU) live in the framework-free triton_impl.glu_kernels, which JAX launches too; this module adds the torch
# launch on tensors and autograd.
_INTERPRET: bool = INTERPRETED
_LAUNCH_OPTS: dict = {"num_warps": NUM_WARPS, "enable_fp_fusion": FP_FUSION}


def check_act(act: str) -> str:
    """Return ``act`` if it is one of :data:`ACTIVATIONS`; else raise ValueError listing them."""
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; known: {', '.join(ACTIVATIONS)}")
    return act


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
                f"{name} and {ref_name} must have the same dtype; got {name}: {t.dtype}, {ref_name}: {ref.dtype}"
            )
        if t.device != ref.device:
            raise ValueError(
                f"{name} and {ref_name} must be on the same device; got {name}: {t.device}, {ref_name}: {ref.device}"
            )
    if ref.dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"unsupported dtype {ref.dtype} for {', '.join(names)}; allowed: {allowed}")


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK_SIZE),)


def glu_forward(g: torch.Tensor, u: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
    """h = act(g) * u, elementwise, in one Triton pass.

    Args:
        g: gate pre-activation, any shape ``S``, float32/bfloat16/float16.
        u: up projection, shape ``S``, same dtype and device as ``g``.
        act: ``"gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU): the kernel's compile-time ``ACT``.

    Returns:
        h: shape ``S``, contiguous, dtype of the inputs (math in fp32).

    Bytes moved: ``3 * numel * itemsize`` (read g, read u, write h).
    """
    check_act(act)
    _check_same(("g", "u"), (g, u))
    g_c, u_c = g.contiguous(), u.contiguous()
    h = torch.empty_like(g_c)
    n = g_c.numel()
    if n == 0:
        return h
    with launch("_glu_fwd_kernel"):
        _glu_fwd_kernel[_grid(n)](g_c, u_c, h, n, BLOCK=BLOCK_SIZE, EXACT_BF16=EXACT_BF16_CAST, ACT=act, **_LAUNCH_OPTS)
    return h


def glu_backward(
    dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, act: str = "gelu_tanh"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of h = act(g) * u in one Triton pass, recomputing act(g) from g.

    Args:
        dh: upstream gradient, shape ``S``.
        g: gate pre-activation saved by the forward, shape ``S``.
        u: up projection saved by the forward, shape ``S``.
        All three share dtype (float32/bfloat16/float16) and device.
        act: ``"gelu_tanh"`` or ``"silu"``, as in the forward.

    Returns:
        ``(dg, du)``, each shape ``S`` in the input dtype, with ``du = dh * act(g)`` and
        ``dg = dh * u * act'(g)`` (for GELU the tanh-form derivative; fp32 math).

    Bytes moved: ``5 * numel * itemsize`` (read dh, g, u; write dg, du).
    """
    check_act(act)
    _check_same(("dh", "g", "u"), (dh, g, u))
    dh_c, g_c, u_c = dh.contiguous(), g.contiguous(), u.contiguous()
    dg = torch.empty_like(g_c)
    du = torch.empty_like(u_c)
    n = g_c.numel()
    if n == 0:
        return dg, du
    with launch("_glu_bwd_kernel"):
        _glu_bwd_kernel[_grid(n)](
            dh_c, g_c, u_c, dg, du, n, BLOCK=BLOCK_SIZE, EXACT_BF16=EXACT_BF16_CAST, ACT=act, **_LAUNCH_OPTS
        )
    return dg, du


class GLUFunction(torch.autograd.Function):
    """Autograd wrapper: forward runs :func:`glu_forward`, backward :func:`glu_backward`, with one activation.

    Saves only ``g`` and ``u`` (never ``act(g)``); the backward kernel recomputes it.
    """

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
        h = glu_forward(g, u, act)
        ctx.save_for_backward(g, u)
        ctx.act = act
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        g, u = ctx.saved_tensors
        dg, du = glu_backward(dh.to(g.dtype), g, u, ctx.act)
        return dg, du, None


def glu(g: torch.Tensor, u: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
    """Differentiable h = act(g) * u (shape of ``g``) via :class:`GLUFunction`."""
    return GLUFunction.apply(g, u, act)
