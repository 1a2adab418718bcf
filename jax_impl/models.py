"""The ``flax.nnx`` modules matching ``torch_impl.models``, built from golden weights."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from compare.problem.golden import Problem
from compare.problem.weights import linear_weight
from jax_impl.device import JAX_DTYPES, PRECISION

ActMul = Callable[[jax.Array, jax.Array], jax.Array]

_GLU_PATHS: dict[str, tuple[str | None, str]] = {
    "gate": ("gate", "kernel"),
    "up": ("up", "kernel"),
    "down": ("down", "kernel"),
}
#: Canonical parameter name -> (submodule attribute or None, parameter attribute), per model.
PARAM_PATHS: dict[str, dict[str, tuple[str | None, str]]] = {
    "linear": {"weight": (None, "kernel"), "bias": (None, "bias")},
    "geglu": _GLU_PATHS,
    "swiglu": _GLU_PATHS,
    "gelu-mlp": {"fc1": ("fc1", "kernel"), "b1": ("fc1", "bias"), "fc2": ("fc2", "kernel"), "b2": ("fc2", "bias")},
}


def xla_geglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """``gelu_tanh(g) * u`` in jnp; XLA fuses it. Tanh form asked for explicitly (``approximate=True``)."""
    return jax.nn.gelu(g, approximate=True) * u


def xla_swiglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """``silu(g) * u`` in jnp (``jax.nn.silu(g) = g * sigmoid(g)``); XLA fuses it."""
    return jax.nn.silu(g) * u


#: The jnp ``act(g) * u`` of each gated (GLU) model.
XLA_ACT_MUL: dict[str, ActMul] = {"geglu": xla_geglu, "swiglu": xla_swiglu}


def _linear(i: int, o: int, dtype: jnp.dtype, rngs: nnx.Rngs, bias: bool) -> nnx.Linear:
    return nnx.Linear(i, o, use_bias=bias, dtype=dtype, param_dtype=dtype, precision=PRECISION, rngs=rngs)


class GatedMLP(nnx.Module):
    """``y = down(act_mul(gate(x), up(x)))``; ``x, y [..., dim]``, hidden ``[..., hidden]``; bias-free.

    ``act_mul(g, u) = act(g) * u``: GeGLU (:func:`xla_geglu`, the default), SwiGLU (:func:`xla_swiglu`) or a
    hand-written kernel of either."""

    def __init__(self, dim: int, hidden: int, dtype: jnp.dtype, rngs: nnx.Rngs, act_mul: ActMul = xla_geglu) -> None:
        self.gate = _linear(dim, hidden, dtype, rngs, bias=False)
        self.up = _linear(dim, hidden, dtype, rngs, bias=False)
        self.down = _linear(hidden, dim, dtype, rngs, bias=False)
        self.act_mul = act_mul

    def heads(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """The GEMM outputs the activation reads: ``(g, u)``."""
        return self.gate(x), self.up(x)

    def tail(self, g: jax.Array, u: jax.Array) -> jax.Array:
        """The activation and the GEMM that reads it: ``down(act(g) * u)``."""
        return self.down(self.act_mul(g, u))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.tail(*self.heads(x))


class GeluMLP(nnx.Module):
    """GPT-2's MLP: ``y = fc2(gelu_tanh(fc1(x)))`` with biased linears; ``x, y [..., dim]``, hidden
    ``[..., hidden]``; GELU's tanh form asked for explicitly (``approximate=True``)."""

    def __init__(self, dim: int, hidden: int, dtype: jnp.dtype, rngs: nnx.Rngs) -> None:
        self.fc1 = _linear(dim, hidden, dtype, rngs, bias=True)
        self.fc2 = _linear(hidden, dim, dtype, rngs, bias=True)

    def heads(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """The GEMM output the activation reads: ``(f,)``, ``f = fc1(x)``."""
        return (self.fc1(x),)

    def tail(self, f: jax.Array) -> jax.Array:
        """The activation and the GEMM that reads it: ``fc2(gelu_tanh(f))``."""
        return self.fc2(jax.nn.gelu(f, approximate=True))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.tail(*self.heads(x))


def _param(module: nnx.Module, path: tuple[str | None, str]) -> nnx.Param:
    owner = module if path[0] is None else getattr(module, path[0])
    return getattr(owner, path[1])


def build_module(problem: Problem, act_mul: ActMul | None = None) -> nnx.Module:
    """The case's nnx module in the case dtype, every parameter copied from the golden weights.

    ``act_mul`` replaces a gated model's jnp ``act(g) * u`` (default: :data:`XLA_ACT_MUL` of the model); it must
    compute that model's activation. Models without a gate take none."""
    s = problem.case.shape
    model = problem.case.model
    dtype = JAX_DTYPES[problem.case.dtype]
    rngs = nnx.Rngs(0)
    module: nnx.Module
    if model == "linear":
        module = _linear(s.dim, s.hidden, dtype, rngs, bias=True)
    elif model == "gelu-mlp":
        if act_mul is not None:
            raise ValueError(f"model {model!r} has no gated activation to replace (act_mul is for GLU models)")
        module = GeluMLP(s.dim, s.hidden, dtype, rngs)
    else:
        module = GatedMLP(s.dim, s.hidden, dtype, rngs, act_mul if act_mul is not None else XLA_ACT_MUL[model])
    for name, path in PARAM_PATHS[model].items():
        _param(module, path).set_value(jnp.asarray(linear_weight(problem.params[name], "flax"), dtype=dtype))
    return module


def canonical_grads(module: nnx.Module, model: str) -> dict[str, jax.Array]:
    """Read each parameter's value from a gradient-state module, under canonical names (flax layout)."""
    return {name: _param(module, path)[...] for name, path in PARAM_PATHS[model].items()}
