"""``torch-eager``: the plain ``nn.Module`` (GeGLU: 3 GEMMs, a GELU kernel and a mul kernel per forward)."""

from __future__ import annotations

from compare.golden import Problem
from compare.registry import Availability, Prepared
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import build_module


class EagerBackend:
    name = "torch-eager"

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        return runner.prepare(problem, mode, module)


BACKEND = EagerBackend()
