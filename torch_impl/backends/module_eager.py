"""``torch-module``: a user's own MLP file (``--module``), its ``torch_module`` eager in the case dtype, parameters
from the case (``torch_impl.user_module.build``), under the shared runner (gradients by ``state_dict`` name)."""

from __future__ import annotations

import torch

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import runner, user_module


def build(problem: Problem, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The case's module from its file, on ``device`` in ``dtype``, its parameters the problem's."""
    return user_module.build(problem.case, problem.params, device, dtype)


class ModuleEagerBackend:
    name = "torch-module"

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return runner.prepare(problem, mode, build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype]))


BACKEND = ModuleEagerBackend()
