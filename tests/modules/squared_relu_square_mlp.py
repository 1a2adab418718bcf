"""A module file for the tests (``tests/test_module_activations.py``): ``down(square(relu(up(x))))`` with biases,
the square as ``torch.square`` (``examples/squared_relu_mlp.py`` writes ``** 2``) and ``jnp.square``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.square(torch.relu(self.up(x))))


def torch_module(dim: int, hidden: int) -> nn.Module:
    return MLP(dim, hidden)


def jax_function(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = x @ params["up.weight"].T + params["up.bias"]
    return jnp.square(jax.nn.relu(h)) @ params["down.weight"].T + params["down.bias"]
