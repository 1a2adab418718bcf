"""Fused gate/up GEMM with a gated-activation epilogue (GeGLU, SwiGLU), plus a plain GEMM, as hand-written Triton
kernels.

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
  elementwise :func:`~torch_impl.ops.geglu.glu_backward` kernel with the same activation.

The GeGLU names (``geglu_matmul``, ``GeGLUMatmulFunction``, ``fused_geglu``) are the same functions (default
``act="gelu_tanh"``), kept for their callers; the kernel keeps its name ``_geglu_matmul_kernel`` (profiler traces,
the GPU build table).

Cost model of the fused forward (``s`` = itemsize, tiles ``BM x BN``, no cache reuse assumed):

* FLOPs: ``2 * (2 * M * N * K)`` for the two products plus, per output element, ~12 for GeGLU's epilogue or ~7
  for SwiGLU's (with 1 exp each).
* Bytes: ``x`` is read once per N-tile (``M * K * s * ceil(N / BN)``), each weight once per
  M-tile (``2 * N * K * s * ceil(M / BM)``), and ``h`` is written once (``M * N * s``).
  Unfused (two GEMMs, then an elementwise kernel) additionally writes ``g`` and ``u`` and reads
  them back: ``4 * M * N * s`` more bytes, and ``x`` is read by two GEMMs instead of one.

Precision: fp32 accumulation for every input dtype; fp32 inputs use ``input_precision="ieee"``
(no TF32). Under the Triton interpreter bf16/fp16 ``tl.dot`` returns garbage (triton issue
11584), so when interpreting the loaded tiles are upcast to fp32 before the dot (``UPCAST``);
on GPU the dots stay native bf16/fp16 with fp32 accumulation.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._launch import launch
from ._triton_env import FP_FUSION, interpreted
from .geglu import EXACT_BF16_CAST, SUPPORTED_DTYPES, activation, cast_out, check_act, glu_backward

__all__ = [
    "GLUMatmulFunction",
    "GeGLUMatmulFunction",
    "LinearFunction",
    "fused_geglu",
    "fused_glu",
    "geglu_matmul",
    "glu_matmul",
    "matmul",
    "triton_linear",
]

_INTERPRET: bool = interpreted()

# Under the interpreter: one small fixed config and no autotuning (the autotuner would run,
# i.e. interpret, every config). num_warps is ignored by the interpreter.
_INTERP_CONFIG: dict[str, int] = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
# Large problems (M * N * K above this) use big tiles under the interpreter: each tile op costs a Python-level
# step, so 128 x 256 x 128 tiles run a 1024 x 3072 x 768 GEMM ~25x faster than 32 x 64 x 32 (3.5 s vs 83 s here).
# Small problems (the tests) keep the small tiles, so masking and the K loop are exercised.
_INTERP_LARGE_MNK = 1 << 24
_INTERP_LARGE_CONFIG: dict[str, int] = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}
_INTERP_NUM_WARPS = 4


def _cfg(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps
    )


# Hopper/Ampere candidates. The fused kernel holds two fp32 accumulators, so its tiles stop
# at 128 x 128 (2 x 64 KiB of accumulator per program); the plain GEMM also tries 128 x 256.
#
# Every entry is justified by the GPU build table, reports/gpu-build/GPU_BUILD.md (`make gpu-build`: Triton 3.9.0
# compiles each config for sm_90 and sm_80 without a GPU, specialised as the launches below are). Per config:
# registers per thread, spill stores/loads in bytes per thread, shared memory per block (dynamic + the 1,024 B
# static section ptxas gives sm_90 kernels), theoretical resident warps per SM (regs: 65,536/SM in 256-register
# units per warp; shared: 233,472 B/SM on sm_90, 167,936 B on sm_80, +1,024 B reserved per block).
# The rule (tests/test_gpu_build.py checks the committed table): no bf16/fp16 config spills or exceeds shared
# memory on sm_90 (232,448 B per block). It holds for every entry below, in every launch (for the plain GEMM also
# the two transposed backward launches). fp32 runs with input_precision="ieee" (no tensor cores): it is the parity
# reference, not the headline, and fp32 configs that spill stay, with their numbers. A config that needs more
# shared memory than the GPU offers raises OutOfResources at launch, and the autotuner skips it.
_GEGLU_CONFIGS: list[triton.Config] = [
    # sm_90 bf16/fp16: 255 regs, no spills, 148,480 B, 8 warps/SM (registers and shared memory).
    # fp32 spills 4,244/4,032 B on sm_90. sm_80: bf16/fp16 spill 196/104 B, fp32 needs 196,608 B > 166,912 B.
    _cfg(128, 128, 64, 3, 8),
    # sm_90 bf16/fp16: 190 regs, no spills, 99,328 B, 8 warps/SM. fp32 on sm_90: 255 regs, no spills.
    # sm_80: bf16/fp16 spill 148/104 B, fp32 2,772/2,332 B.
    _cfg(128, 128, 32, 4, 8),
    # sm_90 bf16/fp16: 255 regs, no spills, 132,096 B, 4 warps/SM (one block: shared memory).
    # fp32 spills 4,432/4,208 B on sm_90. sm_80: bf16/fp16 spill 284/168 B, fp32 needs 196,608 B > 166,912 B.
    _cfg(128, 64, 64, 4, 4),
    # sm_90 bf16/fp16: 255 regs, no spills, 164,864 B, 4 warps/SM. Kept for bf16/fp16 although fp32 needs
    # 246,784 B (245,760 dynamic + 1,024 static) > 232,448 B on sm_90, and 245,760 B > 166,912 B on sm_80: in
    # fp32 it never launches (the autotuner skips it); fp32 also spills 4,524/4,176 B. sm_80 bf16/fp16: no spills.
    _cfg(64, 128, 64, 4, 4),
    # sm_90 bf16/fp16: 168 regs, no spills, 66,560 B, 12 warps/SM. fp32 spills 88/56 B on sm_90.
    # sm_80: bf16/fp16 249 regs, no spills; fp32 spills 2,876/2,464 B.
    _cfg(128, 64, 32, 4, 4),
    # sm_90 bf16/fp16: 127 regs, no spills, 99,328 B, 8 warps/SM. fp32 on sm_90: no spills, 148,480 B.
    # sm_80: fp32 spills 3,084/2,740 B.
    _cfg(64, 64, 64, 4, 4),
]
# Plain GEMM: numbers for the forward launch x @ W^T, then the backward launches dx = dy @ W and dW = dy^T @ x
# where they differ in kind. No bf16/fp16 entry spills on sm_90 or sm_80 in any launch.
_MATMUL_CONFIGS: list[triton.Config] = [
    # sm_90 bf16/fp16: 184 regs (dx 204, dW 220), no spills, 148,480 B, 8 warps/SM.
    # fp32 spills 6,220/5,916 B on sm_90 (dx 5,912/5,668, dW 5,828/5,648); sm_80 fp32 needs 196,608 B > 166,912 B.
    _cfg(128, 256, 64, 3, 8),
    # sm_90 bf16/fp16: 109 regs (dx 115, dW 116), no spills, 132,096 B, 8 warps/SM. fp32 on sm_90: no spills.
    # sm_80 fp32 needs 196,608 B > 166,912 B.
    _cfg(128, 128, 64, 4, 8),
    # sm_90 bf16/fp16: 168 regs (dx 193, dW 199), no spills, 66,560 B, 12 warps/SM (dx/dW 8).
    # fp32 spills 296/180 B on sm_90 (dx 108/108, dW 24/24); sm_80 fp32 1,616/1,092 B.
    _cfg(128, 128, 32, 4, 4),
    # sm_90 bf16/fp16: 128 regs (dx 137, dW 128), no spills, 99,328 B, 8 warps/SM.
    # fp32 spills 44/44 B on sm_90 (dx 8/8, dW none); sm_80 fp32 2,736/3,516 B.
    _cfg(128, 64, 64, 4, 4),
    # sm_90 bf16/fp16: 115 regs (dx 126, dW 128), no spills, 99,328 B, 8 warps/SM. fp32 on sm_90: no spills;
    # sm_80 fp32 2,660/3,428 B.
    _cfg(64, 128, 64, 4, 4),
    # sm_90 bf16/fp16: 58 regs (dx/dW 60), no spills, 33,792 B, 24 warps/SM. No spills anywhere, fp32 included.
    _cfg(64, 64, 32, 4, 4),
]


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map the 1-D program id to (pid_m, pid_n), GROUP_M row-tiles at a time (L2 reuse of weights)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _geglu_matmul_kernel(
    x_ptr, wg_ptr, wu_ptr, h_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wgn, stride_wgk,
    stride_wun, stride_wuk,
    stride_hm, stride_hn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr, EXACT_BF16: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
    # One program = one [BLOCK_M, BLOCK_N] tile of h. Per K-step it loads one x tile
    # [BM, BK] and feeds it to BOTH dots (x is read once per N-tile, not twice), plus one
    # [BK, BN] tile of each weight. FLOPs per program: 2 * 2 * BM * BN * K.
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # Weights are (N, K); address them as a [BK, BN] tile of W^T so tl.dot computes x @ W^T.
    wg_ptrs = wg_ptr + offs_k[:, None] * stride_wgk + offs_n[None, :] * stride_wgn
    wu_ptrs = wu_ptr + offs_k[:, None] * stride_wuk + offs_n[None, :] * stride_wun

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # masked K tail: zero-padding adds nothing to the dots
        x = tl.load(x_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        wg = tl.load(wg_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        wu = tl.load(wu_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        if UPCAST:  # interpreter only: bf16/fp16 tl.dot is broken there (triton issue 11584)
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        # input_precision only affects fp32 x fp32 dots: "ieee" = no TF32.
        acc_g = tl.dot(x, wg, acc_g, input_precision="ieee")
        acc_u = tl.dot(x, wu, acc_u, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        wg_ptrs += BLOCK_K * stride_wgk
        wu_ptrs += BLOCK_K * stride_wuk

    # Epilogue on the fp32 accumulators: h = act(g) * u (ACT: gelu_tanh or silu); only h is stored.
    h = activation(acc_g, ACT) * acc_u
    h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :] * stride_hn
    h = cast_out(h, h_ptr.dtype.element_ty, EXACT_BF16)
    tl.store(h_ptrs, h, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bn, stride_bk,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr, EXACT_BF16: tl.constexpr,
):  # fmt: skip
    # c = a @ b^T. FLOPs 2*M*N*K; bytes: a read once per N-tile, b once per M-tile, c written once.
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # [BK, BN] of b^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c = cast_out(acc, c_ptr.dtype.element_ty, EXACT_BF16)
    tl.store(c_ptrs, c, mask=mask_m[:, None] & mask_n[None, :])


if _INTERPRET:
    _geglu_matmul_launch = _geglu_matmul_kernel
    _matmul_launch = _matmul_kernel
else:
    _geglu_matmul_launch = triton.autotune(configs=_GEGLU_CONFIGS, key=["M", "N", "K"])(_geglu_matmul_kernel)
    _matmul_launch = triton.autotune(configs=_MATMUL_CONFIGS, key=["M", "N", "K"])(_matmul_kernel)

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
        cfg = _INTERP_LARGE_CONFIG if M * N * K > _INTERP_LARGE_MNK else _INTERP_CONFIG
        kw.update(cfg, num_warps=_INTERP_NUM_WARPS)
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
        with launch("_geglu_matmul_kernel"):
            _geglu_matmul_launch[_grid(M, N)](
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
            _matmul_launch[_grid(M, N)](
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
    the Triton :func:`~torch_impl.ops.geglu.glu_backward` kernel (same ``act``) gives dg, du, and
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


# The GeGLU names: the same functions with their default activation, gelu_tanh.
geglu_matmul = glu_matmul
GeGLUMatmulFunction = GLUMatmulFunction
fused_geglu = fused_glu


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
