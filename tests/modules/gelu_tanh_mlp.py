"""A module file for the tests (``tests/test_module_activations.py``): ``down(act(up(x)))`` with biases, the
activation ``nn.GELU(approximate='tanh')`` (GPT-2) and ``jax.nn.gelu(approximate=True)``."""

from __future__ import annotations

import jax
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def torch_module(dim: int, hidden: int) -> nn.Module:
    return MLP(dim, hidden)


def jax_function(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = x @ params["up.weight"].T + params["up.bias"]
    return jax.nn.gelu(h, approximate=True) @ params["down.weight"].T + params["down.bias"]
