"""``jax-moe-ragged``: a mixture-of-experts case's routed block (``jax_impl.moe_ops.moe_ragged``: the assignments
sorted by expert, ``jax.lax.ragged_dot`` over the experts' row groups, a scatter-add back to the tokens) under
``jax.jit``, backward by ``jax.vjp``; its step's output carries the experts its router chose (``routing``)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import moe_ops, runner


class MoeRaggedBackend:
    name = "jax-moe-ragged"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return runner.prepare_moe(problem, mode, moe_ops.moe_ragged, note="first call includes XLA compile")


BACKEND = MoeRaggedBackend()
