"""The Triton GEMMs of the gated MLP block, free of any framework: a fused gate/up GEMM with the gated activation
(GeGLU, SwiGLU) in its epilogue, and a plain GEMM, with their autotune lists and interpreter tiles.

For ``y = down(act(gate(x)) * up(x))`` (bias-free linears, weights in torch's ``(out, in)`` layout; ``act`` =
``"gelu_tanh"`` for GeGLU or ``"silu"`` for SwiGLU, the kernel's compile-time ``ACT``, the same constexpr as the
elementwise kernels' in :mod:`triton_impl.glu_kernels`):

* :func:`_glu_matmul_kernel` ``(x [M, K], w_gate [N, K], w_up [N, K]) -> h [M, N]`` -- both projections computed
  tile by tile from the same loaded ``x`` tile into two fp32 accumulators; ``act(g) * u`` is applied in the
  epilogue and only ``h`` is written. ``g`` and ``u`` never reach memory.
* :func:`_matmul_kernel` ``(a [M, K], b [N, K]) -> a @ b.T [M, N]`` -- plain GEMM with the same tiling rules.

Both take any strides (a transposed view is a stride swap) and a 1-D grid of ``cdiv(M, BLOCK_M) * cdiv(N,
BLOCK_N)`` programs. :data:`glu_matmul_launch` and :data:`matmul_launch` are what a launcher calls: autotuned
over :data:`GLU_MATMUL_CONFIGS` / :data:`MATMUL_CONFIGS` on a GPU, the plain kernels under the interpreter (where
the launcher passes :func:`interp_config`'s tiles). ``torch_impl.ops.glu_matmul`` launches
them on torch tensors with autograd. Committed data from before the rename names the fused kernel
``_geglu_matmul_kernel``; ``compare.kernels`` classifies both names as a GEMM.

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

Compiled or interpreted is the process's one choice (:func:`triton_impl.env.choose`), made by the first statement
below if it was not made before, and in any case before triton is imported. :data:`GPU_BUILD` declares what the
GPU build (:mod:`triton_impl.gpu_build`) compiles of this module.
"""

from __future__ import annotations

from . import env

#: True when the kernels below were decorated for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import).
INTERPRETED: bool = env.choose()  # before `import triton`: decorating a kernel reads the choice

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .env import FP_FUSION  # noqa: E402
from .glu_kernels import EXACT_BF16_CAST, activation, cast_out  # noqa: E402
from .gpu_build.entry import BuildEntry, K, gemm_ints  # noqa: E402

__all__ = [
    "GLU_MATMUL_CONFIGS",
    "GPU_BUILD",
    "INTERPRETED",
    "INTERP_CONFIG",
    "INTERP_LARGE_CONFIG",
    "INTERP_LARGE_MNK",
    "INTERP_NUM_WARPS",
    "MATMUL_CONFIGS",
    "dot_loop",
    "dual_dot",
    "glu_matmul_launch",
    "interp_config",
    "matmul_launch",
]

# Under the interpreter: one small fixed config and no autotuning (the autotuner would run,
# i.e. interpret, every config). num_warps is ignored by the interpreter.
INTERP_CONFIG: dict[str, int] = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}
# Large problems (M * N * K above this) use big tiles under the interpreter: each tile op costs a Python-level
# step, and every load gathers its tile element by element through a pointer array, so the elements gathered,
# M * K * cdiv(N, BN) + 2 * N * K * cdiv(M, BM), set the time. At 1024 x 3072 x 768 (cpu-mlp's fused GEMM) the
# 32 x 64 x 32 tiles took 83 s, 128 x 256 x 128 2.2 s and 512 x 1024 x 256 0.43 s (float32, one call, on a
# 2-core Xeon): :func:`interp_config` takes tiles up to :data:`INTERP_LARGE_CONFIG`, each no larger than its
# dimension rounded up to a power of 2 (a tile mostly masked computes its masked lanes too). Small problems (the
# tests) keep small tiles, so masked edges and the K loop are exercised (the committed cases: 66 to 1024 rows, the
# last tile masked where the rows are not a multiple of 64; K of 32 to 160, one to five steps); 64 x 128 x 32 made
# their interpreted parity three times faster than 32 x 64 x 32 (a geglu fwd+bwd test: 3.2 s to 1.0 s).
INTERP_LARGE_MNK = 1 << 24
INTERP_LARGE_CONFIG: dict[str, int] = {"BLOCK_M": 512, "BLOCK_N": 1024, "BLOCK_K": 256, "GROUP_M": 8}
INTERP_NUM_WARPS = 4


def interp_config(M: int, N: int, K: int) -> dict[str, int]:
    """The interpreter's tiles for an ``[M, K] x [K, N]`` GEMM: :data:`INTERP_CONFIG` up to
    :data:`INTERP_LARGE_MNK` multiply-adds, above it :data:`INTERP_LARGE_CONFIG`'s tiles capped at each dimension's
    next power of 2 (at least 16, ``tl.dot``'s smallest)."""
    if M * N * K <= INTERP_LARGE_MNK:
        return dict(INTERP_CONFIG)

    def cap(block: int, dim: int) -> int:
        return max(16, min(block, 1 << max(0, dim - 1).bit_length()))

    big = INTERP_LARGE_CONFIG
    return {
        "BLOCK_M": cap(big["BLOCK_M"], M),
        "BLOCK_N": cap(big["BLOCK_N"], N),
        "BLOCK_K": cap(big["BLOCK_K"], K),
        "GROUP_M": big["GROUP_M"],
    }


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
GLU_MATMUL_CONFIGS: list[triton.Config] = [
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
MATMUL_CONFIGS: list[triton.Config] = [
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
def dual_dot(
    x_ptrs, wg_ptrs, wu_ptrs, mask_m, mask_n, K, stride_xk, stride_wgk, stride_wuk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``(x @ wg, x @ wu)``: two fp32 ``[BLOCK_M, BLOCK_N]`` accumulators over ``K``, one ``[BM, BK]`` tile of ``x``
    per K-step feeding BOTH dots (``x`` read once per N-tile, not twice), plus one ``[BK, BN]`` tile of each weight;
    the pointer blocks address the first K-step, rows and columns masked by ``mask_m``, ``mask_n``."""
    offs_k = tl.arange(0, BLOCK_K)
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
    return acc_g, acc_u


@triton.jit
def dot_loop(
    a_ptrs, b_ptrs, mask_m, mask_n, K, stride_ak, stride_bk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``a @ b``: one fp32 ``[BLOCK_M, BLOCK_N]`` accumulator over ``K`` from ``[BM, BK]`` tiles of ``a`` and
    ``[BK, BN]`` tiles of ``b`` (pointer blocks at the first K-step, masked as :func:`dual_dot`'s)."""
    offs_k = tl.arange(0, BLOCK_K)
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
    return acc


@triton.jit
def _glu_matmul_kernel(
    x_ptr, wg_ptr, wu_ptr, h_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wgn, stride_wgk,
    stride_wun, stride_wuk,
    stride_hm, stride_hn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr, EXACT_BF16: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
    # One program = one [BLOCK_M, BLOCK_N] tile of h (both dots over K: dual_dot). FLOPs per program:
    # 2 * 2 * BM * BN * K.
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

    acc_g, acc_u = dual_dot(
        x_ptrs, wg_ptrs, wu_ptrs, mask_m, mask_n, K, stride_xk, stride_wgk, stride_wuk,
        BLOCK_M, BLOCK_N, BLOCK_K, UPCAST,
    )  # fmt: skip

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

    acc = dot_loop(a_ptrs, b_ptrs, mask_m, mask_n, K, stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c = cast_out(acc, c_ptr.dtype.element_ty, EXACT_BF16)
    tl.store(c_ptrs, c, mask=mask_m[:, None] & mask_n[None, :])


if INTERPRETED:
    glu_matmul_launch = _glu_matmul_kernel
    matmul_launch = _matmul_kernel
else:
    glu_matmul_launch = triton.autotune(configs=GLU_MATMUL_CONFIGS, key=["M", "N", "K"])(_glu_matmul_kernel)
    matmul_launch = triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])(_matmul_kernel)

# What the GPU build compiles of this module (triton_impl.gpu_build): every autotune config, at each launch with its
# own specialisation. The fused GEMM is launched once, on x [M, K] and w_gate/w_up [N, K] contiguous (its backward
# recomputes with torch); the plain GEMM by LinearFunction forward (x @ W^T, both K-contiguous) and backward
# (dx = matmul(dy, w.T): b a transposed view; dW = matmul(dy.T, x.T): both transposed views). Built as GeGLU's
# (ACT="gelu_tanh"); UPCAST is the interpreter's, False on a GPU.
_GPU_FIXED = {"UPCAST": False, "EXACT_BF16": EXACT_BF16_CAST}
GPU_BUILD: tuple[BuildEntry, ...] = (
    BuildEntry(
        "glu_matmul", "_glu_matmul_kernel",
        {"x @ W^T": {**gemm_ints(("x", "wg", "h"), True, True), "stride_wun": K, "stride_wuk": 1}},
        autotune_list="GLU_MATMUL_CONFIGS", fixed={**_GPU_FIXED, "ACT": "gelu_tanh"}, enable_fp_fusion=FP_FUSION,
    ),
    BuildEntry(
        "matmul", "_matmul_kernel",
        {
            "x @ W^T": gemm_ints(("a", "b", "c"), True, True),
            "dx = dy @ W": gemm_ints(("a", "b", "c"), True, False),
            "dW = dy^T @ x": gemm_ints(("a", "b", "c"), False, False),
        },
        autotune_list="MATMUL_CONFIGS", fixed=_GPU_FIXED, enable_fp_fusion=FP_FUSION,
    ),
)  # fmt: skip
