"""``jax-xla``: ``flax.nnx`` modules under ``jax.jit``; XLA decides the fusions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import build_module


class XLABackend:
    name = "jax-xla"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return runner.prepare(problem, mode, build_module(problem), note="first call includes XLA compile")

    def shape_sweep(
        self, make: GoldenFactory, tokens: Sequence[int], *, budget_s: float, mode: str = "fwd"
    ) -> list[dict[str, Any]]:
        """The compile-cost sweep: one ``jax.jit`` of this backend's module over every token count."""
        from jax_impl import recompiles

        return recompiles.shape_sweep(make, tokens, name=self.name, build=build_module, mode=mode, budget_s=budget_s)


BACKEND = XLABackend()
