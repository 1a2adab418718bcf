"""The ``flax.nnx`` modules matching ``torch_impl.models``, built from golden weights."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from compare.golden import Problem
from compare.weights import linear_weight
from jax_impl.device import JAX_DTYPES, PRECISION

ActMul = Callable[[jax.Array, jax.Array], jax.Array]

#: Canonical parameter name -> (submodule attribute or None, parameter attribute), per model.
PARAM_PATHS: dict[str, dict[str, tuple[str | None, str]]] = {
    "linear": {"weight": (None, "kernel"), "bias": (None, "bias")},
    "geglu": {"gate": ("gate", "kernel"), "up": ("up", "kernel"), "down": ("down", "kernel")},
}


def xla_geglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """``gelu_tanh(g) * u`` in jnp; XLA fuses it. Tanh form asked for explicitly (``approximate=True``)."""
    return jax.nn.gelu(g, approximate=True) * u


class GeGLUMLP(nnx.Module):
    """``y = down(act_mul(gate(x), up(x)))``; ``x, y [..., dim]``, hidden ``[..., hidden]``; bias-free."""

    def __init__(self, dim: int, hidden: int, dtype: jnp.dtype, rngs: nnx.Rngs, act_mul: ActMul = xla_geglu) -> None:
        def lin(i: int, o: int) -> nnx.Linear:
            return nnx.Linear(i, o, use_bias=False, dtype=dtype, param_dtype=dtype, precision=PRECISION, rngs=rngs)

        self.gate = lin(dim, hidden)
        self.up = lin(dim, hidden)
        self.down = lin(hidden, dim)
        self.act_mul = act_mul

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.act_mul(self.gate(x), self.up(x)))


def _param(module: nnx.Module, path: tuple[str | None, str]) -> nnx.Param:
    owner = module if path[0] is None else getattr(module, path[0])
    return getattr(owner, path[1])  # type: ignore[no-any-return]


def build_module(problem: Problem, act_mul: ActMul = xla_geglu) -> nnx.Module:
    """The case's nnx module in the case dtype, every parameter copied from the golden weights."""
    s = problem.case.shape
    dtype = JAX_DTYPES[problem.case.dtype]
    rngs = nnx.Rngs(0)
    module: nnx.Module
    if problem.case.model == "linear":
        module = nnx.Linear(s.dim, s.hidden, use_bias=True, dtype=dtype, param_dtype=dtype, precision=PRECISION,
                            rngs=rngs)
    else:
        module = GeGLUMLP(s.dim, s.hidden, dtype, rngs, act_mul)
    for name, path in PARAM_PATHS[problem.case.model].items():
        _param(module, path).set_value(jnp.asarray(linear_weight(problem.params[name], "flax"), dtype=dtype))
    return module


def canonical_grads(module: nnx.Module, model: str) -> dict[str, jax.Array]:
    """Read each parameter's value from a gradient-state module, under canonical names (flax layout)."""
    return {name: _param(module, path)[...] for name, path in PARAM_PATHS[model].items()}
