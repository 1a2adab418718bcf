"""A squared-ReLU MLP, not one of fusion-compare's built-in models: ``y = down(relu(up(x)) ** 2)``, biases on both
linears (Primer's activation, So et al. 2021, "Primer: Searching for Efficient Transformers for Language Modeling").

Run it through the same parity gate, timer and report as the built-in models::

    python -m compare run --module examples/squared_relu_mlp.py --dim 96 --hidden 328 \\
        --dtype float32 bfloat16 --mode fwd fwd+bwd

The three functions describe one MLP: ``torch_module`` (its ``state_dict`` names and shapes are the case's
parameters: ``up.weight [hidden, dim]``, ``up.bias [hidden]``, ``down.weight [dim, hidden]``, ``down.bias
[dim]``), ``jax_function`` (the same names and shapes, torch's ``(out, in)`` layout) and ``reference`` (numpy
float64, checked once against the golden computed from ``torch_module``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn


class SquaredReluMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)) ** 2)


def torch_module(dim: int, hidden: int) -> nn.Module:
    return SquaredReluMLP(dim, hidden)


def jax_function(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = x @ params["up.weight"].T + params["up.bias"]
    return jnp.square(jax.nn.relu(h)) @ params["down.weight"].T + params["down.bias"]


def reference(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = x @ params["up.weight"].T + params["up.bias"]
    return np.maximum(h, 0.0) ** 2 @ params["down.weight"].T + params["down.bias"]
