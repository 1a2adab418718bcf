"""``jax-xla``: ``flax.nnx`` modules under ``jax.jit``; XLA decides the fusions."""

from __future__ import annotations

from compare.golden import Problem
from compare.registry import Availability, Prepared
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import build_module


class XLABackend:
    name = "jax-xla"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return runner.prepare(problem, mode, build_module(problem), note="first call includes XLA compile")


BACKEND = XLABackend()
