"""Fused gate/up GEMM with a gated-activation epilogue (GeGLU, SwiGLU), plus a plain GEMM: the torch launchers and
autograd of the Triton GEMMs in :mod:`triton_impl.glu_matmul_kernels`.

For the gated MLP block ``y = down(act(gate(x)) * up(x))`` (bias-free linears, torch weight layout ``(out, in)``;
``act`` = ``"gelu_tanh"`` for GeGLU or ``"silu"`` for SwiGLU, the kernel's compile-time ``ACT``, the same
constexpr as the elementwise kernels') this module provides:

* :func:`glu_matmul` ``(x [M, K], w_gate [N, K], w_up [N, K], act) -> h [M, N]`` -- both
  projections computed tile by tile from the same loaded ``x`` tile into two fp32
  accumulators; ``act(g) * u`` is applied in the epilogue and only ``h`` is written. ``g`` and ``u``
  never reach memory.
* :func:`matmul` ``(a [M, K], b [N, K]) -> a @ b.T [M, N]`` -- plain GEMM with the same tiling
  rules, used for the down projection.
* :class:`GLUMatmulFunction` / :func:`fused_glu` -- autograd wrapper around the fused
  kernel; the backward recomputes ``g`` and ``u`` with torch matmuls and uses the Triton
  elementwise :func:`~torch_impl.ops.glu.glu_backward` kernel with the same activation.

The kernels, their cost model, autotune lists and precision rules are in :mod:`triton_impl.glu_matmul_kernels`
(no torch there); this module checks shapes, allocates outputs, picks the interpreter tiles, launches, and adds
autograd. Under the interpreter bf16/fp16 tiles are upcast to fp32 before the dot (``UPCAST``: triton issue 11584).
"""

from __future__ import annotations

import math

import torch
import triton

from triton_impl.env import FP_FUSION
from triton_impl.glu_matmul_kernels import (
    INTERP_NUM_WARPS,
    INTERPRETED,
    glu_matmul_launch,
    interp_config,
    matmul_launch,
)

from ._launch import launch
from .glu import EXACT_BF16_CAST, SUPPORTED_DTYPES, check_act, glu_backward

__all__ = [
    "GLUMatmulFunction",
    "LinearFunction",
    "fused_glu",
    "glu_matmul",
    "matmul",
    "triton_linear",
]

_INTERPRET: bool = INTERPRETED

# The kernels form element offsets in int32 (offs * stride with int32 offs and strides): every tensor they address,
# inputs and the output alike, must have its largest element offset <= 2**31 - 1 (a [700k, 3072] output, 2.15e9
# elements, would wrap around and write out of bounds).
_INT32_MAX = 2**31 - 1


def _check_int32_span(name: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Raise ValueError when a tensor of ``shape``/``strides`` (elements) has an element offset past int32.

    The largest offset the kernels form is ``sum((size - 1) * |stride|)``; an empty tensor is never addressed.
    Takes shapes, not tensors, so the output can be checked before it is allocated.
    """
    if math.prod(shape) == 0:
        return
    span = sum((size - 1) * abs(st) for size, st in zip(shape, strides, strict=True))
    if span > _INT32_MAX:
        raise ValueError(
            f"{name} of shape {tuple(shape)} spans {span + 1} elements; the Triton GEMMs use int32 offsets, "
            f"which allow at most {_INT32_MAX + 1} (2**31): split the batch"
        )


def _check_gemm(
    x_name: str, x: torch.Tensor, w_names: tuple[str, ...], ws: tuple[torch.Tensor, ...], out_name: str
) -> None:
    """Validate ``x [..., K]`` against weights ``[N, K]`` and the output ``out_name [M, N]`` (contiguous, not yet
    allocated; ``M = prod(x.shape[:-1])``); raise ValueError naming the problem."""
    for name, t in ((x_name, x), *zip(w_names, ws, strict=True)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{x_name} must have shape [..., K] (at least 1 dim); got a 0-dim tensor")
    if x.dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"unsupported dtype {x.dtype} for {x_name}; allowed: {allowed}")
    K = x.shape[-1]
    for name, w in zip(w_names, ws, strict=True):
        if w.dim() != 2 or w.shape[1] != K:
            raise ValueError(
                f"{name} must have shape [N, K] with K = {x_name}.shape[-1] = {K} (torch (out, in) layout); "
                f"got {tuple(w.shape)}"
            )
        if w.shape != ws[0].shape:
            raise ValueError(
                f"{name} and {w_names[0]} must have the same shape; got {tuple(w.shape)} and {tuple(ws[0].shape)}"
            )
        if w.dtype != x.dtype:
            raise ValueError(f"{name} must have the dtype of {x_name} ({x.dtype}); got {w.dtype}")
        if w.device != x.device:
            raise ValueError(f"{name} must be on the device of {x_name} ({x.device}); got {w.device}")
    for name, t in ((x_name, x), *zip(w_names, ws, strict=True)):
        _check_int32_span(name, tuple(t.shape), t.stride())  # x is addressed after flattening to 2-D: same span
    M, N = math.prod(x.shape[:-1]), ws[0].shape[0]
    _check_int32_span(out_name, (M, N), (N, 1))  # the output is allocated contiguous [M, N]


def _grid(M: int, N: int):
    return lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)


def _launch_kwargs(dtype: torch.dtype, M: int, N: int, K: int) -> dict:
    kw: dict = {
        "UPCAST": _INTERPRET and dtype != torch.float32,
        "EXACT_BF16": EXACT_BF16_CAST,
        "enable_fp_fusion": FP_FUSION,
    }
    if _INTERPRET:
        kw.update(interp_config(M, N, K), num_warps=INTERP_NUM_WARPS)
    return kw


def glu_matmul(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
    """h = act(x @ w_gate.T) * (x @ w_up.T) in one fused Triton GEMM (no autograd).

    Args:
        x: activations ``[M, K]`` (leading batch dims ``[..., K]`` are flattened into M).
        w_gate: gate weight ``[N, K]`` (torch ``(out, in)`` layout).
        w_up: up weight ``[N, K]``.
        All share dtype (float32/bfloat16/float16) and device; any strides.
        act: ``"gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU), the kernel's compile-time ``ACT``.

    Returns:
        h: ``[M, N]`` (or ``[..., N]``) in x's dtype; accumulation and activation math in fp32.

    Work: ``4 * M * N * K`` FLOPs; writes only h (``M * N * itemsize`` bytes).
    """
    check_act(act)
    _check_gemm("x", x, ("w_gate", "w_up"), (w_gate, w_up), "h")
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(math.prod(lead), K)
    M, N = x2.shape[0], w_gate.shape[0]
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M > 0 and N > 0:
        with launch("_glu_matmul_kernel"):
            glu_matmul_launch[_grid(M, N)](
                x2, w_gate, w_up, h,
                M, N, K,
                x2.stride(0), x2.stride(1),
                w_gate.stride(0), w_gate.stride(1),
                w_up.stride(0), w_up.stride(1),
                h.stride(0), h.stride(1),
                ACT=act,
                **_launch_kwargs(x.dtype, M, N, K),
            )  # fmt: skip
    return h.reshape(*lead, N)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = a @ b.T as a plain Triton GEMM (no autograd); used for the down projection.

    Args:
        a: ``[M, K]`` (leading batch dims ``[..., K]`` are flattened into M).
        b: ``[N, K]`` (torch ``(out, in)`` weight layout), same dtype and device as ``a``.

    Returns:
        c: ``[M, N]`` (or ``[..., N]``) in a's dtype, fp32 accumulation.

    Work: ``2 * M * N * K`` FLOPs.
    """
    _check_gemm("a", a, ("b",), (b,), "c")
    lead, K = a.shape[:-1], a.shape[-1]
    a2 = a.reshape(math.prod(lead), K)
    M, N = a2.shape[0], b.shape[0]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M > 0 and N > 0:
        with launch("_matmul_kernel"):
            matmul_launch[_grid(M, N)](
                a2, b, c,
                M, N, K,
                a2.stride(0), a2.stride(1),
                b.stride(0), b.stride(1),
                c.stride(0), c.stride(1),
                **_launch_kwargs(a.dtype, M, N, K),
            )  # fmt: skip
    return c.reshape(*lead, N)


class GLUMatmulFunction(torch.autograd.Function):
    """Autograd for h = act(x @ w_gate.T) * (x @ w_up.T) with x ``[M, K]``, weights ``[N, K]``.

    Forward: the fused Triton kernel; saves x, w_gate, w_up only (no ``[M, N]`` activations).
    Backward (recompute): ``g = x @ w_gate.T`` and ``u = x @ w_up.T`` are recomputed with torch
    matmuls (``4 * M * N * K`` extra FLOPs instead of storing ``2 * M * N`` activations), then
    the Triton :func:`~torch_impl.ops.glu.glu_backward` kernel (same ``act``) gives dg, du, and
    ``dx = dg @ w_gate + du @ w_up``, ``dW_gate = dg.T @ x``, ``dW_up = du.T @ x``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"GLUMatmulFunction expects x of shape [M, K]; got {tuple(x.shape)} (use fused_glu)")
        h = glu_matmul(x, w_gate, w_up, act)
        ctx.save_for_backward(x, w_gate, w_up)
        ctx.act = act
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        x, w_gate, w_up = ctx.saved_tensors
        need_x, need_wg, need_wu = ctx.needs_input_grad[:3]
        g = x @ w_gate.T  # recompute [M, N]
        u = x @ w_up.T  # recompute [M, N]
        dg, du = glu_backward(dh.to(x.dtype).contiguous(), g, u, ctx.act)
        dx = torch.addmm(dg @ w_gate, du, w_up) if need_x else None  # [M, K]
        dw_gate = dg.T @ x if need_wg else None  # [N, K]
        dw_up = du.T @ x if need_wu else None  # [N, K]
        return dx, dw_gate, dw_up, None


def fused_glu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
    """Differentiable h = act(x @ w_gate.T) * (x @ w_up.T) via :class:`GLUMatmulFunction`.

    Args:
        x: ``[..., K]``; leading dims are flattened to M for the kernel and restored after.
        w_gate, w_up: ``[N, K]``.
        act: ``"gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU).

    Returns:
        h: ``[..., N]`` in x's dtype.
    """
    check_act(act)
    _check_gemm("x", x, ("w_gate", "w_up"), (w_gate, w_up), "h")
    lead, K = x.shape[:-1], x.shape[-1]
    h = GLUMatmulFunction.apply(x.reshape(math.prod(lead), K), w_gate, w_up, act)
    return h.reshape(*lead, w_gate.shape[0])


class LinearFunction(torch.autograd.Function):
    """Autograd for the bias-free linear ``y = x @ w.T`` with every GEMM in :func:`matmul` (Triton).

    x ``[M, K]``, w ``[N, K]``. Backward: ``dx = dy @ w`` (``matmul(dy, w.T)``) and
    ``dw = dy.T @ x`` (``matmul(dy.T, x.T)``): both Triton GEMMs over strided views, no copies.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return matmul(x, w)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = matmul(dy, w.T) if ctx.needs_input_grad[0] else None  # [M, K]
        dw = matmul(dy.T, x.T) if ctx.needs_input_grad[1] else None  # [N, K]
        return dx, dw


def triton_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Differentiable ``x @ w.T`` (x ``[..., K]``, w ``[N, K]``) with Triton GEMMs forward and backward."""
    lead, K = x.shape[:-1], x.shape[-1]
    y = LinearFunction.apply(x.reshape(math.prod(lead), K), w)
    return y.reshape(*lead, w.shape[0])
