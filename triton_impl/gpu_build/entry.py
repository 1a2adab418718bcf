"""A kernel module's declaration of what the GPU build compiles: :class:`BuildEntry`, one per kernel.

A kernel module that a backend launches (its ``BackendSpec.kernels``) ends with ``GPU_BUILD: tuple[BuildEntry,
...]``, one entry per ``@triton.jit`` function it exports, each naming the function, how the product launches it
(the runtime integer arguments of every launch with its own specialisation) and its configs (the module's autotune
list of a GEMM, or the one fixed launch of an elementwise kernel). :mod:`triton_impl.gpu_build.catalogue` reads
the entries; nothing else lists kernels.

The canonical launch: Triton specialises a kernel on its arguments when it is launched (an integer equal to 1
becomes a compile-time constant, an integer or pointer divisible by 16 gets ``tt.divisibility=16``), so any M, N,
K that are multiples of 16 give the same code. The entries use :data:`M`, :data:`N`, :data:`K` (the GeGLU block of
the d_model 768 / d_ff 3072 model at 4096 tokens) through :func:`gemm_ints` and :func:`flat_ints`.

Imports no triton: a kernel module imports this after its interpreter choice, and the compare side never needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_NUM_STAGES", "DTYPES", "SPECIALIZATION", "BuildEntry", "K", "M", "N", "flat_ints", "gemm_ints"]

#: The dtypes a kernel is built for: name -> Triton pointer element type of its ``*_ptr`` arguments.
DTYPES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: The canonical GEMM extents (multiples of 16; any such triple specialises the same way).
M, N, K = 4096, 3072, 768
#: Triton's default ``num_stages`` for CUDA: what a launch that does not set it gets.
DEFAULT_NUM_STAGES = 3

#: How the build models a launch, in words (the table's "Launch modelled" line).
SPECIALIZATION = (
    f"each kernel's launches as its module declares them (GPU_BUILD; the launch name says the operands' layout: "
    f"contiguous activations, torch (out, in) weights, contiguous outputs, transposed views for a backward GEMM). "
    f"M, N, K are multiples of 16 (built with M={M}, N={N}, K={K}). As Triton's launcher does, unit strides become "
    f"compile-time constants and 16-divisible integers and 16-byte-aligned pointers get tt.divisibility=16. "
    f"num_stages={DEFAULT_NUM_STAGES} (Triton's default) where a launch does not set it."
)


@dataclass(frozen=True)
class BuildEntry:
    """One ``@triton.jit`` kernel of a module and how the product launches it.

    Attributes:
        id: the kernel's id in the build table (unique over every built module), e.g. ``"matmul"``.
        function: the name of the ``@triton.jit`` function in the declaring module (as profiler traces show it).
        launches: launch description -> the runtime integer arguments that launch passes (pointer arguments, named
            ``*_ptr``, are every other non-constexpr parameter). Each launch with its own specialisation is its own
            compiled kernel, so each is built.
        autotune_list: for an autotuned kernel, the name of the module-level ``list[triton.Config]``; every entry
            is built.
        config: for a kernel launched with one fixed config, its constexprs plus ``num_warps`` (and
            ``num_stages``, default :data:`DEFAULT_NUM_STAGES`). Exactly one of ``autotune_list`` and ``config``.
        fixed: the constexprs every launch of the product passes besides the config, with their GPU values.
        enable_fp_fusion: the ``enable_fp_fusion`` option the launches pass.
    """

    id: str
    function: str
    launches: Mapping[str, Mapping[str, int]]
    autotune_list: str | None = None
    config: Mapping[str, int] | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    enable_fp_fusion: bool = True

    def __post_init__(self) -> None:
        if (self.autotune_list is None) is (self.config is None):
            raise ValueError(f"build entry {self.id!r}: give exactly one of autotune_list and config")
        if self.config is not None and "num_warps" not in self.config:
            raise ValueError(f"build entry {self.id!r}: its config needs num_warps, got {dict(self.config)}")
        if not self.launches:
            raise ValueError(f"build entry {self.id!r}: no launches")


def gemm_ints(operands: tuple[str, str, str], a_k_contiguous: bool, b_k_contiguous: bool) -> dict[str, int]:
    """Integer arguments of a GEMM launch on ``a [M, K]``, ``b [N, K]`` (each K-contiguous or a transposed view)
    and a contiguous ``c [M, N]``.

    ``operands`` names the kernel's operands as its stride arguments do, e.g. ``("x", "wg", "h")`` ->
    ``stride_xm``, ``stride_xk``, ``stride_wgn``, ``stride_wgk``, ``stride_hm``, ``stride_hn``.
    """
    a, b, c = operands
    return {
        "M": M, "N": N, "K": K,
        f"stride_{a}m": K if a_k_contiguous else 1, f"stride_{a}k": 1 if a_k_contiguous else M,
        f"stride_{b}n": K if b_k_contiguous else 1, f"stride_{b}k": 1 if b_k_contiguous else N,
        f"stride_{c}m": N, f"stride_{c}n": 1,
    }  # fmt: skip


def flat_ints() -> dict[str, int]:
    """Integer arguments of an elementwise launch over a flat, contiguous ``[M * N]`` buffer: ``n_elements``."""
    return {"n_elements": M * N}
