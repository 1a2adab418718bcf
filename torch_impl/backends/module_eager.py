"""``torch-module``: a user's own MLP file (``--module``), its ``torch_module`` eager in the case dtype, parameters
from the case (``torch_impl.user_module.build``), under the shared runner (gradients by ``state_dict`` name)."""

from __future__ import annotations

import torch

from compare.problem.golden import Problem
from torch_impl import user_module
from torch_impl.backends.eager import EagerBackend


def build(problem: Problem, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The case's module from its file, on ``device`` in ``dtype``, its parameters the problem's."""
    return user_module.build(problem.case, problem.params, device, dtype)


BACKEND = EagerBackend("torch-module", build=build)
