"""``jax-moe-dense``: a mixture-of-experts case's block as the one-hot dense baseline (``jax_impl.moe_ops.moe_dense``:
every token through every expert, combined with weights zero off each token's top k) under ``jax.jit``, backward by
``jax.vjp``; its step's output carries the experts its router chose (``routing``)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import moe_ops, runner


class MoeDenseBackend:
    name = "jax-moe-dense"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return runner.prepare_moe(problem, mode, moe_ops.moe_dense, note="first call includes XLA compile")


BACKEND = MoeDenseBackend()
