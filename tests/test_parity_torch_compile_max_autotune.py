"""torch-compile-max-autotune against the float64 golden (``tests/parity_backends.py``): a group of its own, in the
slow tier, since each case is an autotuned compile, on four committed cases that cover its three MLP families, both
input distributions and two dtypes (every committed case took 7 min 03 s with cold Inductor caches on 2 loaded
cores, 10 to 29 s per fwd+bwd case). Out of the capped-ISA pass: on a CPU Inductor's GEMM templates need frozen
weights, so its kernels are torch-compile's, whose every case that pass reruns."""

from __future__ import annotations

import pytest

from compare.problem.cases import PRESETS, Case
from tests.parity_backends import backend_parity_tests

pytestmark = pytest.mark.slow

#: (model, preset, dtype) of the cases it is checked on
CHOSEN = {
    ("geglu", "tiny", "float32"),
    ("geglu", "odd", "bfloat16"),
    ("swiglu", "tiny", "bfloat16"),
    ("gelu-mlp", "odd", "float32"),
}


def _chosen(case: Case) -> bool:
    return any(case.model == m and case.shape == PRESETS[p].shape and case.dtype == d for m, p, d in CHOSEN)


test_forward_parity, test_gradient_parity_fwd_bwd, test_gradient_parity_bwd_alone = backend_parity_tests(
    "torch-compile-max-autotune", cases=_chosen, isa=False
)
