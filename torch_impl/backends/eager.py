"""``torch-eager``: the plain ``nn.Module`` (GeGLU: 3 GEMMs, a GELU kernel and a mul kernel per forward)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import Build, build_module


class EagerBackend:
    """The module as it is; ``build`` makes it (default: the case's built-in model, ``torch_impl.models``)."""

    def __init__(self, name: str = "torch-eager", build: Build = build_module) -> None:
        self.name = name
        self.build = build

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = self.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        return runner.prepare(problem, mode, module)

    def shape_sweep(
        self, make: GoldenFactory, tokens: Sequence[int], *, budget_s: float, mode: str = "fwd"
    ) -> list[dict[str, Any]]:
        """The compile-cost sweep: the plain module over every token count (shape-generic: compiles nothing)."""
        from torch_impl import recompiles

        def build(problem: Problem) -> tuple[nn.Module, nn.Module]:
            module = self.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
            return module, module

        return recompiles.shape_sweep(make, tokens, name=self.name, build=build, mode=mode, budget_s=budget_s)


BACKEND = EagerBackend()
