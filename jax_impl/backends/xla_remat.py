"""``jax-xla-remat``: ``jax-xla``'s module with its forward under ``jax.checkpoint`` and a named policy,
``save_only_these_names`` of the GEMM outputs the activation reads (tagged with ``checkpoint_name``: GeGLU/SwiGLU's
``g`` and ``u``, GPT-2's MLP's ``f = fc1(x) + b1``).

The forward keeps those (and its inputs) for the backward, nothing else: the activation's output (``h = act(g) * u``;
``a = gelu(f)``), which the down GEMM's weight gradient reads, is recomputed in the backward from them, and the GEMMs
are not (what they produced is saved by name). The cost model's ``fused-ew-remat`` plan. ``linear`` has no
activation to recompute (the registry's ``models``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import GatedMLP, GeluMLP, build_module

#: The name the GEMM outputs the activation reads are saved under (the policy's one name).
SAVED_NAME = "pre_activation"
#: The named policy: keep only what is tagged :data:`SAVED_NAME`, recompute everything else the backward needs.
POLICY = jax.checkpoint_policies.save_only_these_names(SAVED_NAME)


class XLARematBackend:
    name = "jax-xla-remat"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem)
        return runner.prepare(
            problem, mode, module, forward=remat_forward(module), note="first call includes XLA compile"
        )


def remat_forward(module: nnx.Module) -> Callable[[Any, jax.Array], jax.Array]:
    """The forward ``(state, x) -> y`` of ``module`` (a ``GatedMLP`` or ``GeluMLP`` of ``jax_impl.models``; ``state``
    from ``nnx.split(module)``) under ``jax.checkpoint`` with :data:`POLICY`."""
    if not isinstance(module, GatedMLP | GeluMLP):
        raise ValueError(f"{type(module).__name__} has no activation between two GEMMs to recompute")
    graphdef, _ = nnx.split(module)

    def forward(state: Any, x: jax.Array) -> jax.Array:
        m: GatedMLP | GeluMLP = nnx.merge(graphdef, state)
        y: jax.Array = m.tail(*(checkpoint_name(p, SAVED_NAME) for p in m.heads(x)))
        return y

    return jax.checkpoint(forward, policy=POLICY)


BACKEND = XLARematBackend()
