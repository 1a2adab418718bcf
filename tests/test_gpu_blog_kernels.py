"""The blog post's GPU kernel table as a specification (``shared/SEED.md``): what one GeGLU forward launches on CUDA.

On the blog post's case (``blog-mlp``: 64 x 128 tokens, 768 -> 3072, bfloat16):

- eager: 5 kernels, 3 GEMMs + a GELU kernel + a mul kernel;
- ``torch.compile``: the 3 GEMMs stay, and one fused Triton kernel absorbs GELU and mul
  (``triton_poi_fused__unsafe_view_gelu_mul_0``);
- ``torch-triton-fused``: 2 kernels (the fused gate/up GEMM with its GeGLU epilogue, and the down GEMM).

Marked ``gpu``: they skip, with the reason, where there is no CUDA, and run in ``scripts/gpu_check.sh``. The
inputs are random values of the right shapes (a :class:`~compare.problem.golden.Problem` without a reference): kernel
counts do not depend on the values, and the float64 golden of this size would cost more than the check.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from compare.backends.registry import spec
from compare.kernels import summary as ks
from compare.problem.cases import PRESETS
from compare.problem.golden import Problem

pytestmark = [pytest.mark.gpu, pytest.mark.standard]

CASE = PRESETS["blog-mlp"].case("bfloat16")


def _problem() -> Problem:
    rng = np.random.default_rng(0)
    s = CASE.shape
    shapes = CASE.weight_shapes()
    params = {k: (rng.standard_normal(v) / np.sqrt(v[-1])).astype(np.float32) for k, v in shapes.items()}
    inputs = {
        "x": rng.standard_normal(CASE.input_shape()).astype(np.float32),
        "dy": rng.standard_normal(CASE.output_shape()).astype(np.float32),
    }
    assert s.tokens == 8192
    return Problem(case=CASE, inputs=inputs, params=params)


@functools.cache
def _summary(backend: str) -> dict[str, Any]:
    from torch_impl import profiling

    previous = profiling.enable_inductor_kernel_profile(backend == "torch-compile")
    try:
        prepared = spec(backend).load().prepare(_problem(), "fwd")
        prepared.sync(prepared.step())
    finally:
        profiling.enable_inductor_kernel_profile(previous)
    s = profiling.profile_step(prepared.step, prepared.sync, device=prepared.device)
    assert str(s["device"]).startswith("cuda"), s["device"]
    print(ks.describe(s))
    return s


def test_eager_geglu_forward_launches_five_kernels() -> None:
    s = _summary("torch-eager")
    assert s["kernels_per_step"] == 5 and ks.count_by_kind(s) == {"gemm": 3, "elementwise": 2}, s["kernels"]
    names = " ".join(k["name"] for k in s["kernels"] if k["kind"] == "elementwise").lower()
    assert "gelu" in names and "mul" in names, s["kernels"]


def test_compile_keeps_three_gemms_and_fuses_gelu_and_mul_into_one_triton_kernel() -> None:
    s = _summary("torch-compile")
    fused = [k for k in s["kernels"] if k["kind"] == "fused"]
    assert ks.count_by_kind(s) == {"gemm": 3, "fused": 1}, s["kernels"]
    assert fused[0]["name"] == "triton_poi_fused__unsafe_view_gelu_mul_0"
    assert {"gelu", "mul"} <= set(fused[0]["absorbed"])


def test_triton_fused_launches_two_kernels() -> None:
    s = _summary("torch-triton-fused")
    assert s["kernels_per_step"] == 2, s["kernels"]
    names = [k["name"] for k in s["kernels"]]
    assert any("_glu_matmul_kernel" in n for n in names) and any("_matmul_kernel" in n for n in names), names
