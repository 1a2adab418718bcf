"""``jax-unfused``: JAX's unfused baseline, the analogue of ``torch-eager`` (one computation per op).

The same ``flax.nnx`` module as ``jax-xla`` (``jax_impl.models.build_module``, the golden weights), but each op of the
block is its own ``jax.jit`` computation, called one after another from Python with no jit above them
(``runner.prepare(..., outer_jit=False)``): each Linear (its GEMM and, in GPT-2's MLP, its bias add: one program,
as torch's ``addmm`` is one call; XLA:CPU runs the add as a kernel after the GEMM), the activation and the gating mul.
Every intermediate (GeGLU/SwiGLU: ``g, u, a, h`` ``[T, H]``; GPT-2's MLP: ``f, a``) is written to memory between two
dispatches, and XLA, which only ever sees one op at a time, cannot fuse the activation into anything.

Backward (``fwd+bwd``, ``bwd``): ``jax.vjp`` of that op-by-op forward, outside any jit. Each op's forward runs as one
computation that also returns what its backward reads, and each op's backward (the transpose JAX makes of it) is
another: a Linear's backward is one computation with its dx and dW GEMMs (and the bias's token sum), the mul's
computes ``dh * u`` and ``dh * a``, and dx's two terms (x feeds gate and up) are summed by one more dispatch, as
eager autograd adds them. The activation is wrapped in ``jax.checkpoint``: like torch's GELU/SiLU autograd it keeps
only its input ``g`` and its backward recomputes ``act'(g)`` from it. (Without it JAX's linearization of the tanh
form keeps four more ``[T, H]`` tensors of its own, written forward and read backward: 32 bytes of traffic per
element of ``g`` in float32 that eager never moves.)

The profile reads every program the step dispatches, with XLA's per-kernel times (``jax_impl.dispatch_profile``).
The timed median also holds what runs in Python between the programs: dispatch, and in ``fwd+bwd``/``bwd`` JAX's
autodiff of the step (``jax.vjp``'s linearization and transposes run from Python on every step, where torch's
autograd runs in C++). On small cases that is most of the step; the summary never calls it fusion (a saving beyond
this baseline's kernel time outside GEMMs is said to come from elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import build_module

Op = Callable[..., jax.Array]


def _gelu_tanh(g: jax.Array) -> jax.Array:
    """GELU's tanh form, as every model here asks for it (``approximate=True``)."""
    return jax.nn.gelu(g, approximate=True)


#: The activation of each model, alone (the fused backends compute it inside ``act(g) * u``).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "geglu": _gelu_tanh,
    "swiglu": jax.nn.silu,
    "gelu-mlp": _gelu_tanh,
}


def _named(name: str, fn: Callable[..., jax.Array]) -> Op:
    """``fn`` under ``jax.jit`` as a computation of its own, called ``jit_<name>`` in HLO dumps and traces."""

    def op(*args: Any) -> jax.Array:
        return fn(*args)

    op.__name__ = op.__qualname__ = name
    return jax.jit(op)


def _linear(module: nnx.Module, name: str) -> Op:
    """One Linear submodule as one computation: ``op(state, x)`` merges the submodule from its state inside the
    jit (at trace time only) and calls flax's own ``nnx.Linear``: the GEMM, then the bias add where it has one."""
    graphdef, _ = nnx.split(module)
    return _named(name, lambda st, x: nnx.merge(graphdef, st)(x))


def _activation(model: str) -> Op:
    """The activation as one computation that keeps only its input for the backward (``jax.checkpoint``)."""
    return _named("act", jax.checkpoint(ACTIVATIONS[model]))


def op_by_op(module: nnx.Module, model: str) -> Callable[[Any, jax.Array], jax.Array]:
    """The forward ``(state, x) -> y`` of ``build_module``'s ``module`` (``state`` from ``nnx.split(module)``), one
    jitted computation per op, dispatched from Python in the eager module's order; ``x [batch, seq, dim]``."""
    if model == "linear":
        return _linear(module, "linear")
    if model == "gelu-mlp":
        fc1, fc2 = (_linear(getattr(module, name), name) for name in ("fc1", "fc2"))
        act = _activation(model)

        def gelu_mlp(st: Any, x: jax.Array) -> jax.Array:
            f = fc1(st["fc1"], x)  # [T, H] written: x fc1 + b1
            return fc2(st["fc2"], act(f))  # a = gelu(f) [T, H] written, read by fc2

        return gelu_mlp
    gate, up, down = (_linear(getattr(module, name), name) for name in ("gate", "up", "down"))
    act, mul = _activation(model), _named("mul", lambda a, u: a * u)

    def gated(st: Any, x: jax.Array) -> jax.Array:
        g = gate(st["gate"], x)  # each [T, H] result is written to memory and read back by the next op
        u = up(st["up"], x)
        return down(st["down"], mul(act(g), u))  # a = act(g), then h = a * u: two more [T, H] round trips

    return gated


class UnfusedBackend:
    name = "jax-unfused"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem)
        return runner.prepare(
            problem,
            mode,
            module,
            forward=op_by_op(module, problem.case.model),
            outer_jit=False,
            note="one jitted computation per op, dispatched from Python; first call compiles each",
        )


BACKEND = UnfusedBackend()
