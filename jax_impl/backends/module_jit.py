"""``jax-module``: a user's own MLP file (``--module``), its ``jax_function(params, x)`` under ``jax.jit``; the
backward is ``jax.vjp`` of it inside the same jit (``jax_impl.runner.prepare_params``, as ``jax-xla`` runs its nnx
modules). ``params`` is a dict of the case's parameters by their ``state_dict`` names, torch layout, in the case
dtype, an argument of the jitted function (never a constant)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory
from jax_impl import device as dev
from jax_impl import runner
from torch_impl import user_module


def applied(problem: Problem) -> tuple[dict[str, jax.Array], Callable[[Any, jax.Array], jax.Array]]:
    """The case's parameters on the device in its dtype, by ``state_dict`` name, and the file's ``jax_function``."""
    dtype = dev.JAX_DTYPES[problem.case.dtype]
    params = {k: jax.device_put(np.asarray(v)).astype(dtype) for k, v in problem.params.items()}
    return params, user_module.jax_function(problem.case)


def prepare_module(problem: Problem, mode: str, *, outer_jit: bool, note: str) -> Prepared:
    """The step of ``mode`` over the file's ``jax_function``, its parameters placed on the device once."""
    params, function = applied(problem)
    names = list(problem.params)  # not ``problem`` itself: its float32 weights would stay held by the closure

    def grads_np(dparams: Any) -> dict[str, np.ndarray]:
        return {f"d{k}": runner.host(dparams[k]) for k in names}

    return runner.prepare_params(problem, mode, params, function, grads_np, outer_jit=outer_jit, note=note)


class ModuleJitBackend:
    name = "jax-module"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return prepare_module(problem, mode, outer_jit=True, note="first call includes XLA compile")

    def shape_sweep(
        self, make: GoldenFactory, tokens: Sequence[int], *, budget_s: float, mode: str = "fwd"
    ) -> list[dict[str, Any]]:
        """The compile-cost sweep: one ``jax.jit`` of the file's ``jax_function`` over every token count."""
        from jax_impl import recompiles

        return recompiles.shape_sweep(make, tokens, name=self.name, build=applied, mode=mode, budget_s=budget_s)


BACKEND = ModuleJitBackend()
