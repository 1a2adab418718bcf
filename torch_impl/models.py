"""The PyTorch modules: ``nn.Linear`` and the seed's ``SimpleGeGLUMLP``, built from golden weights."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from compare.golden import Problem
from compare.weights import linear_weight

#: Canonical parameter name -> torch parameter path, per model.
PARAM_PATHS: dict[str, dict[str, str]] = {
    "linear": {"weight": "weight", "bias": "bias"},
    "geglu": {"gate": "gate_proj.weight", "up": "up_proj.weight", "down": "down_proj.weight"},
}

ActMul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def eager_geglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(g) * u`` as two eager kernels (GELU, then mul). Tanh form asked for explicitly."""
    return F.gelu(g, approximate="tanh") * u


class SimpleGeGLUMLP(nn.Module):
    """``y = down(act_mul(gate(x), up(x)))``; ``x, y [..., dim]``, hidden ``[..., hidden]``; bias-free."""

    def __init__(self, dim: int, hidden: int, act_mul: ActMul = eager_geglu) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act_mul = act_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_mul(self.gate_proj(x), self.up_proj(x)))


def build_module(
    problem: Problem, device: torch.device, dtype: torch.dtype, act_mul: ActMul = eager_geglu
) -> nn.Module:
    """The case's module on ``device`` in ``dtype``, every parameter copied from the golden weights."""
    s = problem.case.shape
    module: nn.Module
    if problem.case.model == "linear":
        module = nn.Linear(s.dim, s.hidden, bias=True)
    else:
        module = SimpleGeGLUMLP(s.dim, s.hidden, act_mul)
    module = module.to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, path in PARAM_PATHS[problem.case.model].items():
            w = torch.from_numpy(linear_weight(problem.params[name], "torch"))
            module.get_parameter(path).copy_(w.to(dtype))
    return module


def canonical_params(module: nn.Module, model: str) -> dict[str, nn.Parameter]:
    """The module's parameters under canonical names (torch layout is already canonical)."""
    return {name: module.get_parameter(path) for name, path in PARAM_PATHS[model].items()}
