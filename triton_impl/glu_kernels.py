"""The Triton gated-MLP elementwise kernels, free of torch: ``h = act(g) * u`` and its backward, with the activation
a compile-time parameter: ``ACT = "gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU).

This module imports only ``triton``, ``triton.language`` and :mod:`triton_impl.env`, so every framework launches
the very same ``@triton.jit`` functions: ``torch_impl.ops.glu`` launches them on torch tensors
(``kernel[grid](...)``), ``jax_impl.backends.triton`` on JAX arrays through ``jax_triton.triton_call``.

Kernels (1-D grid of ``cdiv(n_elements, BLOCK)`` programs over flattened, contiguous, row-major buffers of any
shape ``S``; ``n_elements = prod(S)``; float32/bfloat16/float16, all math in fp32, one rounding on the store):

* :data:`glu_fwd_kernel` ``(g_ptr, u_ptr, h_ptr, n_elements, BLOCK, EXACT_BF16, ACT)``: reads ``g, u: S``,
  writes ``h: S``;
* :data:`glu_bwd_kernel` ``(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n_elements, BLOCK, EXACT_BF16, ACT)``: reads
  ``dh, g, u: S``, writes ``dg, du: S``, recomputing ``act(g)`` and ``act'(g)`` from ``g``.

The kernels (``_glu_fwd_kernel``, ``_glu_bwd_kernel``) are named by what they compute; committed data from before
the rename names them ``_geglu_*``, which ``compare.kernels`` classifies alike. One kernel per direction serves both
activations: ``ACT`` is a ``tl.constexpr``, so each value compiles to its own specialisation with the other branch
compiled out. :func:`activation` and :func:`activation_and_grad` are the shared fp32 math (the fused GEMM's
epilogue in :mod:`triton_impl.glu_matmul_kernels` uses :func:`activation` too); :data:`ACTIVATIONS` lists the
values.

Output pointers come before ``n_elements``. jax-triton appends the output buffers after every positional
argument, so it passes ``n_elements`` (like ``BLOCK``, ``EXACT_BF16`` and ``ACT``) by keyword, as a compile-time
constant; torch passes it as a runtime scalar. The generated code is the same up to that specialisation.

GELU uses the tanh form ``0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))``, with ``tanh(z)`` computed as
``2 * sigmoid(2z) - 1`` because libdevice ``tanh`` does not run under the Triton CPU interpreter. SiLU is
``s * sigmoid(s)`` with ``sigmoid`` evaluated through ``exp(-|s|)`` (never overflows, also under the interpreter).

Whether the kernels are compiled GPU kernels or interpreted (``TRITON_INTERPRET=1``) is the process's one choice
(:func:`triton_impl.env.choose`), made by the first statement below if it was not made before, and in any case
before triton is imported; the launch constants below follow it.

:data:`GPU_BUILD` declares what the GPU build (:mod:`triton_impl.gpu_build`) compiles of this module.
"""

from __future__ import annotations

from . import env

#: True when the kernels below were decorated for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import).
INTERPRETED: bool = env.choose()  # before `import triton`: decorating a kernel reads the choice

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .env import FP_FUSION  # noqa: E402
from .gpu_build.entry import BuildEntry, flat_ints  # noqa: E402

__all__ = [
    "ACTIVATIONS",
    "BLOCK_SIZE",
    "EXACT_BF16_CAST",
    "GPU_BUILD",
    "INTERPRETED",
    "NUM_WARPS",
    "activation",
    "activation_and_grad",
    "cast_out",
    "gelu_tanh",
    "glu_bwd_kernel",
    "glu_fwd_kernel",
]

# Launch choice, fixed at import time like the kernels themselves. Under the interpreter each program instance is
# one Python-level step over numpy arrays, so a few huge blocks are far cheaper than many small ones. On a GPU a
# 1024-element block with 4 warps (8 elements per thread) is a standard streaming shape. Built for sm_90 and sm_80
# (reports/gpu-build/GPU_BUILD.md, Triton 3.9.0): forward 31-32 registers, backward 32-37, no spills, no shared
# memory, in every dtype; sm_90 residency 64 warps/SM forward (the SM's maximum), 48 backward (register-bound).
BLOCK_SIZE: int = 1 << 16 if INTERPRETED else 1024
NUM_WARPS: int = 4
# The interpreter's fp32 -> bf16 `.to()` truncates toward zero (up to 1 ulp error) where the GPU rounds to nearest
# even; when interpreting, the kernels round to bf16 by hand (see cast_out).
EXACT_BF16_CAST: bool = INTERPRETED
#: The values of the kernels' ``ACT`` constexpr: GeGLU's tanh-form GELU and SwiGLU's SiLU.
ACTIVATIONS: tuple[str, ...] = ("gelu_tanh", "silu")


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
def _sigmoid_pair(s):
    """(sigmoid(s), sigmoid(-s)) for an fp32 block through e = exp(-|s|) in (0, 1]: never overflows (tl.sigmoid's
    exp(-s) does past |s| ~ 88, an inf and a numpy warning under the interpreter), and sigmoid(-s) = 1 - sigmoid(s)
    comes without the subtraction's cancellation. 1 exp + ~5 FLOPs."""
    e = tl.exp(-tl.abs(s))
    r = 1.0 / (1.0 + e)
    er = e * r
    return tl.where(s >= 0, r, er), tl.where(s >= 0, er, r)


@triton.jit
def _silu_and_grad(s):
    """Return (silu(s), d silu / ds) for an fp32 block: silu = s * sigmoid(s) (1 FLOP on the pair),
    silu' = sigmoid(s) * (1 + s * sigmoid(-s)) (3 FLOPs)."""
    sig, sig_neg = _sigmoid_pair(s)
    return s * sig, sig * (1.0 + s * sig_neg)


@triton.jit
def activation(g, ACT: tl.constexpr):
    """act(g) for an fp32 block: ``gelu_tanh`` or ``silu`` (compile-time choice; an unknown name fails to compile)."""
    if ACT == "silu":
        sig, _ = _sigmoid_pair(g)
        out = g * sig
    else:
        tl.static_assert(ACT == "gelu_tanh", "ACT must be 'gelu_tanh' or 'silu'")
        out = gelu_tanh(g)
    return out


@triton.jit
def activation_and_grad(g, ACT: tl.constexpr):
    """(act(g), act'(g)) for an fp32 block, sharing the transcendental evaluation (compile-time choice of ACT)."""
    if ACT == "silu":
        out, grad = _silu_and_grad(g)
    else:
        tl.static_assert(ACT == "gelu_tanh", "ACT must be 'gelu_tanh' or 'silu'")
        out, grad = _gelu_tanh_and_grad(g)
    return out, grad


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
def _glu_fwd_kernel(g_ptr, u_ptr, h_ptr, n_elements, BLOCK: tl.constexpr, EXACT_BF16: tl.constexpr, ACT: tl.constexpr):
    # Traffic: reads g and u once, writes h once -> 3 * numel * itemsize bytes; no
    # intermediate (act(g)) ever reaches memory. Per element: gelu_tanh ~12 FLOPs + 1 exp,
    # silu ~7 FLOPs + 1 exp (with the mul).
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: safe past 2**31 elements
    mask = offs < n_elements  # masked tail: numel need not be a multiple of BLOCK
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h = activation(g, ACT) * u
    tl.store(h_ptr + offs, cast_out(h, h_ptr.dtype.element_ty, EXACT_BF16), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n_elements,
    BLOCK: tl.constexpr, EXACT_BF16: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
    # Traffic: reads dh, g, u and writes dg, du -> 5 * numel * itemsize bytes. act(g) is
    # recomputed from g instead of being saved by the forward (saves numel * itemsize of
    # activation memory and one read). Per element: gelu_tanh ~25 FLOPs + 2 exps, silu
    # ~12 FLOPs + 1 exp.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, dact = activation_and_grad(g, ACT)  # recomputed from g
    du = dh * act
    dg = dh * u * dact
    tl.store(dg_ptr + offs, cast_out(dg, dg_ptr.dtype.element_ty, EXACT_BF16), mask=mask)
    tl.store(du_ptr + offs, cast_out(du, du_ptr.dtype.element_ty, EXACT_BF16), mask=mask)


# Public handles; the underscored functions are the kernel names in profiler traces.
# jax_impl.backends.triton launches them by these names (getattr), tests/test_jax_triton.py checks them.
glu_fwd_kernel = _glu_fwd_kernel
glu_bwd_kernel = _glu_bwd_kernel

# What the GPU build compiles of this module (triton_impl.gpu_build): each kernel at its one GPU launch config over
# a flat contiguous buffer. Built as GeGLU's (ACT="gelu_tanh"); SwiGLU's "silu" specialisation is not in the table.
_GPU_FIXED = {"EXACT_BF16": EXACT_BF16_CAST, "ACT": "gelu_tanh"}
_GPU_CONFIG = {"BLOCK": BLOCK_SIZE, "num_warps": NUM_WARPS}
GPU_BUILD: tuple[BuildEntry, ...] = (
    BuildEntry("glu_fwd", "_glu_fwd_kernel", {"h = gelu(g) * u (flat, contiguous)": flat_ints()},
               config=_GPU_CONFIG, fixed=_GPU_FIXED, enable_fp_fusion=FP_FUSION),
    BuildEntry("glu_bwd", "_glu_bwd_kernel", {"dg, du (flat, contiguous)": flat_ints()},
               config=_GPU_CONFIG, fixed=_GPU_FIXED, enable_fp_fusion=FP_FUSION),
)  # fmt: skip
