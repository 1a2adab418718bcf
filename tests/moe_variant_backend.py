"""A test-only MoE backend that computes a near variant of gpt-oss's block: its gate and up rows taken as two halves
(``layout="concat"``) where gpt-oss interleaves them. An honest-looking implementation of the wrong function: the gate
must fail it (``tests/test_moe_cases.py`` registers it)."""

from __future__ import annotations

import dataclasses

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.problem.cases import MOE_MODELS
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import moe_ops, runner

NAME = "torch-moe-layout-swapped"
SPEC = BackendSpec(
    name=NAME,
    framework="torch",
    target="tests.moe_variant_backend",
    about="gpt-oss's block with gate and up concatenated instead of interleaved (a wrong variant)",
    models=MOE_MODELS,
)


class LayoutSwapped:
    name = NAME

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        block = moe_ops.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], moe_ops.moe_loop)
        block.spec = dataclasses.replace(
            block.spec, layout="concat" if block.spec.layout == "interleaved" else "interleaved"
        )
        return runner.prepare(problem, mode, block)


BACKEND = LayoutSwapped()
