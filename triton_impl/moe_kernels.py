"""The Triton grouped GEMMs of a mixture-of-experts block's experts, free of any framework: the ``gate_up`` GEMM over
the token-expert assignments sorted by expert with the gated activation in its epilogue, and a plain grouped GEMM
(the ``down`` projection, and the backward's input gradients).

What they compute (``compare.problem.moe``'s experts; torch's ``(out, in)`` weight layout): the ``M = T * k``
assignments sorted by expert, expert ``e`` owning rows ``[s_e, e_e)``, row ``r`` the assignment of token
``rows[r]``. Shapes: ``x [T, D]``, ``gate_up [E, 2I, D]``, ``gate_up_bias [E, 2I]``, ``down [E, D, I]``,
``down_bias [E, D]``.

* :func:`_moe_glu_kernel` ``-> h [M, I]``: for each row ``r`` of expert ``e``, ``g = x[rows[r]] @ Wg[e].T (+
  bg[e])`` and ``u = x[rows[r]] @ Wu[e].T (+ bu[e])`` into two fp32 accumulators from the same loaded ``x`` tile
  (the permute's gather folded into the load), then ``h = silu(g) * u`` (``GLU="swiglu"``) or gpt-oss's
  ``(clamp(u, -L, L) + 1) * min(g, L) * sigmoid(alpha * min(g, L))`` (``"clamped"``) in the epilogue: only ``h`` is
  written, ``g`` and ``u`` never reach memory. ``Wg``, ``Wu`` are rows of ``gate_up[e]``: ``INTERLEAVED`` (gpt-oss)
  gate at even rows and up at odd, else gate rows ``[0, I)`` and up ``[I, 2I)``; the biases alike.
* the same kernel with ``BACKWARD`` ``(dh [M, I]) -> h [M, I], dgu [M, 2I]``: the same main loop recomputes ``g`` and
  ``u``, the epilogue writes ``h`` (the ``down`` weight gradient's operand) and ``d gate_up`` in ``gate_up``'s row
  layout: ``dg = dh (u_c + 1) glu'(g_c) [g <= L]``, ``du = dh glu(g_c) [|u| <= L]`` (a clamp passes the gradient
  where its input is within the limits, bounds included: the golden's rule) or SwiGLU's ``dg = dh u silu'(g)``,
  ``du = dh silu(g)``. Again ``g`` and ``u`` stay in registers.
* :func:`_moe_matmul_kernel` ``c [M, N] = a [M, K] @ b[e] (+ bias[e])`` per row's expert, ``b [E, K, N]`` through
  its strides (``down`` as ``[E, I, D]`` for the forward: ``h @ down[e].T``; ``down`` as ``[E, D, I]`` for ``dh =
  dout @ down[e]``; ``gate_up`` as ``[E, 2I, D]`` for ``dx_sorted = dgu @ gate_up[e]``).

The grid is ``(tiles, cdiv(N, BLOCK_N))`` over a tile table ``tiles_idx [tiles, 3]`` (int32: expert, first row,
end row), each tile at most ``BLOCK_M`` rows of one expert (an expert with ``n`` rows has ``cdiv(n, BLOCK_M)``
tiles; experts without rows none). The launcher builds the table (``torch_impl.ops.moe_triton``).

Precision: fp32 accumulation and epilogue for every input dtype, one rounding on each store; fp32 inputs use
``input_precision="ieee"`` (no TF32). Interpreter gaps, handled as :mod:`triton_impl.glu_matmul_kernels` does:
bf16/fp16 ``tl.dot`` is wrong under the interpreter (triton issue 11584), so there the tiles are upcast to fp32 before
the dot (``UPCAST``); its fp32 -> bf16 cast truncates, so :func:`~triton_impl.glu_kernels.cast_out` rounds by hand
(``EXACT_BF16``); the sigmoid is :func:`~triton_impl.glu_kernels._sigmoid_pair` (``tl.exp`` of ``-|s|``: no
libdevice, which returns None under the interpreter).

Cost of the fused forward per tile ``BM x BN``: ``2 * 2 * BM * BN * D`` FLOPs, ``x`` gathered once per N-tile,
each of ``Wg``, ``Wu`` once per tile; the unfused grouped form (``torch-moe-grouped``) writes and reads back
``g``, ``u`` (``[M, 2I]``) as well.

:data:`GPU_BUILD` declares what the GPU build compiles of this module: each kernel at its one GPU launch config.
"""

from __future__ import annotations

from . import env

#: True when the kernels below were decorated for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import).
INTERPRETED: bool = env.choose()  # before `import triton`: decorating a kernel reads the choice

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .env import FP_FUSION  # noqa: E402
from .glu_kernels import EXACT_BF16_CAST, _sigmoid_pair, activation_and_grad, cast_out  # noqa: E402
from .glu_matmul_kernels import dot_loop, dual_dot  # noqa: E402
from .gpu_build.entry import BuildEntry, K, N  # noqa: E402

__all__ = ["CONFIG", "GLUS", "GPU_BUILD", "INTERPRETED", "glu_kernel", "matmul_kernel"]

#: The values of the kernels' ``GLU`` constexpr (``compare.problem.moe.GLUS``).
GLUS: tuple[str, ...] = ("swiglu", "clamped")

#: The one launch config (no autotuning: the tile table depends on ``BLOCK_M``). Under the interpreter each program
#: is a Python-level step, and the CPU presets' experts hold 1 to 10 rows: 16-row tiles (``tl.dot``'s smallest) and
#: N and K tiles that cover the CPU presets' widths (64, 32) in one step. On a GPU 64 x 64 x 32 tiles, 4 warps: built
#: for sm_90 and sm_80 (reports/gpu-build/GPU_BUILD.md, Triton 3.9.0) no bf16/fp16 launch spills (the fused kernel
#: 123 registers forward, 210 backward on sm_90); fp32 spills on sm_80 only (about 650 B a thread, fused kernel).
CONFIG: dict[str, int] = (
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4}
    if INTERPRETED
    else {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4}
)


@triton.jit
def _tile(tiles_idx_ptr, BLOCK_M: tl.constexpr):
    """This program's tile: its expert, its row offsets ``[BLOCK_M]`` and their mask (rows past the tile's end)."""
    t = tl.program_id(0)
    e = tl.load(tiles_idx_ptr + 3 * t)
    start = tl.load(tiles_idx_ptr + 3 * t + 1)
    end = tl.load(tiles_idx_ptr + 3 * t + 2)
    offs_m = start + tl.arange(0, BLOCK_M)
    return e, offs_m, offs_m < end


@triton.jit
def _gate_up_rows(offs_n, N, INTERLEAVED: tl.constexpr):
    """The rows of ``gate_up[e]`` (and columns of its bias) holding gate and up column ``offs_n``."""
    if INTERLEAVED:
        g_rows = 2 * offs_n
        u_rows = g_rows + 1
    else:
        g_rows = offs_n
        u_rows = offs_n + N
    return g_rows, u_rows


@triton.jit
def _gate_up_tile(
    x_ptr, rows_idx_ptr, tiles_idx_ptr, w_ptr, b_ptr, N, K,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """This program's ``(g, u, offs_m, offs_n, mask)``: fp32 ``[BLOCK_M, BLOCK_N]`` tiles of ``x[rows] @ Wg[e].T (+
    bg[e])`` and the same for up (one gathered ``x`` tile per K-step feeding both dots), the tile's row and column
    offsets and its ``[BLOCK_M, BLOCK_N]`` mask."""
    e, offs_m, mask_m = _tile(tiles_idx_ptr, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    tok = tl.load(rows_idx_ptr + offs_m, mask=mask_m, other=0)  # each sorted row's token
    offs_k = tl.arange(0, BLOCK_K)
    g_rows, u_rows = _gate_up_rows(offs_n, N, INTERLEAVED)
    x_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_e = w_ptr + e * stride_we
    wg_ptrs = w_e + offs_k[:, None] * stride_wk + g_rows[None, :] * stride_wn  # [BK, BN] of Wg[e]^T
    wu_ptrs = w_e + offs_k[:, None] * stride_wk + u_rows[None, :] * stride_wn
    acc_g, acc_u = dual_dot(
        x_ptrs, wg_ptrs, wu_ptrs, mask_m, mask_n, K, stride_xk, stride_wk, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST
    )
    if HAS_BIAS:
        b_e = b_ptr + e * stride_be
        acc_g += tl.load(b_e + g_rows, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_e + u_rows, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    return acc_g, acc_u, offs_m, offs_n, mask_m[:, None] & mask_n[None, :]


@triton.jit
def _moe_glu_kernel(
    x_ptr, rows_idx_ptr, tiles_idx_ptr, w_ptr, b_ptr, h_ptr, dh_ptr, dgu_ptr,
    N, K,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_be, stride_hm, stride_dgum,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
    BACKWARD: tl.constexpr, UPCAST: tl.constexpr, EXACT_BF16: tl.constexpr,
):  # fmt: skip
    # One program: one [BLOCK_M, BLOCK_N] tile of h, BLOCK_M rows of one expert (N = I, K = D; h, dh contiguous with
    # row stride stride_hm). BACKWARD also reads that tile of dh and writes the matching gate and up columns of
    # dgu [M, 2N] in gate_up's row layout (forward launches pass any pointer for dh and dgu: never touched).
    g, u, offs_m, offs_n, mask = _gate_up_tile(
        x_ptr, rows_idx_ptr, tiles_idx_ptr, w_ptr, b_ptr, N, K, stride_xm, stride_xk, stride_we, stride_wn,
        stride_wk, stride_be, BLOCK_M, BLOCK_N, BLOCK_K, INTERLEAVED, HAS_BIAS, UPCAST,
    )  # fmt: skip
    hd = offs_m[:, None] * stride_hm + offs_n[None, :]
    if GLU == "clamped":  # gpt-oss: gate clamped above, up to [-LIMIT, LIMIT]
        gc = tl.minimum(g, LIMIT)
        uc = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
        sig, sig_neg = _sigmoid_pair(ALPHA * gc)
        glu = gc * sig
        h = (uc + 1.0) * glu
    else:
        tl.static_assert(GLU == "swiglu", "GLU must be 'swiglu' or 'clamped'")
        act, dact = activation_and_grad(g, "silu")
        h = act * u
    tl.store(h_ptr + hd, cast_out(h, h_ptr.dtype.element_ty, EXACT_BF16), mask=mask)
    if BACKWARD:
        dh = tl.load(dh_ptr + hd, mask=mask, other=0.0).to(tl.float32)
        if GLU == "clamped":  # the clamps pass the gradient within their limits, bounds included
            dglu = sig * (1.0 + ALPHA * gc * sig_neg)  # d/dg of g sigmoid(alpha g)
            dg = tl.where(g <= LIMIT, dh * (uc + 1.0) * dglu, 0.0)
            du = tl.where(tl.abs(u) <= LIMIT, dh * glu, 0.0)
        else:
            dg = dh * u * dact
            du = dh * act
        g_cols, u_cols = _gate_up_rows(offs_n, N, INTERLEAVED)
        dgu_rows = dgu_ptr + offs_m[:, None] * stride_dgum
        tl.store(dgu_rows + g_cols[None, :], cast_out(dg, dgu_ptr.dtype.element_ty, EXACT_BF16), mask=mask)
        tl.store(dgu_rows + u_cols[None, :], cast_out(du, dgu_ptr.dtype.element_ty, EXACT_BF16), mask=mask)


@triton.jit
def _moe_matmul_kernel(
    a_ptr, tiles_idx_ptr, b_ptr, bias_ptr, c_ptr,
    N, K,
    stride_am, stride_ak, stride_be, stride_bk, stride_bn, stride_biase, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, EXACT_BF16: tl.constexpr,
):  # fmt: skip
    # c[r] = a[r] @ b[e] (+ bias[e]) for the BLOCK_M rows of one expert's tile; b[e] is [K, N] through its strides.
    e, offs_m, mask_m = _tile(tiles_idx_ptr, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + e * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = dot_loop(a_ptrs, b_ptrs, mask_m, mask_n, K, stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * stride_biase + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, cast_out(acc, c_ptr.dtype.element_ty, EXACT_BF16), mask=mask_m[:, None] & mask_n[None, :])


# Public handles; the underscored names are the kernel names in profiler traces.
glu_kernel = _moe_glu_kernel
matmul_kernel = _moe_matmul_kernel

# What the GPU build compiles of this module (triton_impl.gpu_build): each kernel at its one GPU launch config, on
# contiguous operands (x [T, D], gate_up [E, 2I, D], down [E, D, I], outputs [M, *]) with D = K and I = N of the
# canonical extents. Built as gpt-oss's form (clamped SwiGLU, interleaved, biases), the widest epilogue; the matmul
# at its forward launch (h @ down[e].T: b = down seen as [E, I, D]).
_GPU_FIXED = {"UPCAST": False, "EXACT_BF16": EXACT_BF16_CAST, "HAS_BIAS": True}
_GLU_FIXED = {**_GPU_FIXED, "INTERLEAVED": True, "GLU": "clamped", "ALPHA": 1.702, "LIMIT": 7.0}
_GPU_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4}
_GLU_INTS = {
    "N": N, "K": K, "stride_xm": K, "stride_xk": 1, "stride_we": 2 * N * K, "stride_wn": K, "stride_wk": 1,
    "stride_be": 2 * N, "stride_hm": N, "stride_dgum": 2 * N,
}  # fmt: skip
GPU_BUILD: tuple[BuildEntry, ...] = (
    BuildEntry("moe_glu_fwd", "_moe_glu_kernel", {"h = glu(x[rows] @ gate_up[e]^T) (sorted rows)": _GLU_INTS},
               config=_GPU_CONFIG, fixed={**_GLU_FIXED, "BACKWARD": False}, enable_fp_fusion=FP_FUSION),
    BuildEntry("moe_glu_bwd", "_moe_glu_kernel", {"h, dgu from dh (sorted rows)": _GLU_INTS},
               config=_GPU_CONFIG, fixed={**_GLU_FIXED, "BACKWARD": True}, enable_fp_fusion=FP_FUSION),
    BuildEntry("moe_matmul", "_moe_matmul_kernel",
               {"out = h @ down[e]^T + bd[e] (sorted rows)": {
                   "N": K, "K": N, "stride_am": N, "stride_ak": 1, "stride_be": K * N, "stride_bk": 1,
                   "stride_bn": N, "stride_biase": K, "stride_cm": K}},
               config=_GPU_CONFIG, fixed=_GPU_FIXED, enable_fp_fusion=FP_FUSION),
)  # fmt: skip
