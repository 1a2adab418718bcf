"""``jax-module-unfused``: a user's own MLP file's ``jax_function`` without any jit: each jnp op runs as its own
computation, dispatched from Python, and ``jax.vjp`` runs outside any jit (JAX's op-by-op baseline, as
``jax-unfused`` is of ``jax-xla``; ``jax_impl.runner.prepare_params`` with ``outer_jit=False``)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl.backends.module_jit import prepare_module


class ModuleUnfusedBackend:
    name = "jax-module-unfused"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        note = "no jit: each op its own computation, dispatched from Python; first call compiles each"
        return prepare_module(problem, mode, outer_jit=False, note=note)


BACKEND = ModuleUnfusedBackend()
