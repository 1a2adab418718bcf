"""``jax-xla-gemm-fusion``: ``jax-xla`` in a process whose XLA runs with its GPU GEMM-fusion flags (:data:`FLAGS`):
every GEMM XLA's Triton emitter supports goes through it, so the autotuner may fuse an elementwise epilogue (the
activation, the mul) into the GEMM, where plain ``jax-xla`` keeps cuBLAS and fuses only when the autotuner prefers
Triton.

XLA reads ``XLA_FLAGS`` once, when JAX starts its backends, for every computation of the process: the flags cannot
be set for one backend beside another. So this backend sets nothing; it runs only where the process was started
with the flags in ``XLA_FLAGS`` (then every JAX backend of that process runs with them, so it runs alone:
``XLA_FLAGS="--xla_gpu_enable_triton_gemm=true --xla_gpu_triton_gemm_any=true" python -m compare run --backend
jax-xla-gemm-fusion``, as ``scripts/gpu_check.sh`` does, and ``compare diff`` sets it beside a plain ``jax-xla``
run). On a CPU the flags mean nothing: it is unavailable, saying why."""

from __future__ import annotations

import os

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import build_module

#: XLA's GPU flags that route every supported GEMM through its Triton emitter (epilogue fusion, autotuned).
FLAGS: tuple[str, ...] = ("--xla_gpu_enable_triton_gemm=true", "--xla_gpu_triton_gemm_any=true")


def missing_flags(xla_flags: str) -> list[str]:
    """The flags of :data:`FLAGS` not in ``xla_flags`` (an ``XLA_FLAGS`` value)."""
    given = set(xla_flags.split())
    return [f for f in FLAGS if f not in given]


class XLAGemmFusionBackend:
    name = "jax-xla-gemm-fusion"

    def availability(self) -> Availability:
        platform = dev.platform()
        if platform != "gpu":
            return Availability(
                False, f"GPU only: XLA's GPU GEMM-fusion flags ({' '.join(FLAGS)}); JAX's backend here is {platform!r}"
            )
        missing = missing_flags(os.environ.get("XLA_FLAGS", ""))
        if missing:
            return Availability(
                False,
                f"GPU only, in a process started with XLA_FLAGS holding {' '.join(FLAGS)} (XLA reads its flags once, "
                f"for every JAX backend of the process); missing: {' '.join(missing)}",
            )
        return Availability(True, device=platform)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        note = f"first call includes XLA compile and GEMM autotuning; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"
        return runner.prepare(problem, mode, build_module(problem), note=note)


BACKEND = XLAGemmFusionBackend()
