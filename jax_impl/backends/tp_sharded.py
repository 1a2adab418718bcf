"""``jax-tp``: the flax.nnx module with partitioned parameters under ``jax.jit``; XLA's SPMD partitioner (Shardy)
inserts the collectives.

The module is the single-device one (``jax_impl.models.build_module``, golden weights), each parameter annotated with
its Megatron partition spec (the ``out_sharding`` metadata ``nnx.with_partitioning`` sets) and moved onto the mesh
with ``nnx.update(module, jax.device_put(state, nnx.get_named_sharding(state, mesh)))``. The mesh is
``AxisType.Auto`` (see ``jax_impl.tp_common``); ``x`` and ``dy`` are placed replicated and every step's ``y`` and
``dx`` are asked for replicated (``out_shardings``), the parameter gradients sharded like the parameters. The steps
per mode are ``jax_impl.runner``'s (``fwd``; ``fwd+bwd`` one jitted ``jax.vjp``; ``bwd`` the forward's VJP closure
built once, each step a jitted call of it). The collectives are whatever the partitioner chose, read off the
compiled HLO.
"""

from __future__ import annotations

import time
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from compare.backends.registry import Availability, Prepared
from compare.backends.tp import Group
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import tp_common as tc
from jax_impl.models import PARAM_PATHS, XLA_ACT_MUL, build_module, canonical_grads


def _annotate(module: nnx.Module, model: str) -> None:
    """Give each parameter its partition spec, as ``nnx.with_partitioning`` would have at creation."""
    for name, spec in tc.param_specs(model).items():
        owner_name, attr = PARAM_PATHS[model][name]
        owner = module if owner_name is None else getattr(module, owner_name)
        getattr(owner, attr).set_metadata(out_sharding=tuple(spec))


class ShardedBackend:
    name = "jax-tp"

    def availability(self) -> Availability:
        return Availability(True, device=dev.platform())

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        model = problem.case.model
        tc.check_divisible(problem, group.world_size)
        precision = dev.pin_precision()
        mesh = tc.make_mesh(group.world_size)
        t0 = time.perf_counter()
        module = build_module(problem)
        _annotate(module, model)
        t1 = time.perf_counter()
        state = nnx.state(module, nnx.Param)
        nnx.update(module, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
        graphdef, state = nnx.split(module)
        shardings = nnx.get_named_sharding(state, mesh)
        _, x, dy = tc.place_problem(mesh, problem)
        t2 = time.perf_counter()
        replicated = NamedSharding(mesh, P())

        def apply(st: Any, xx: jax.Array) -> jax.Array:
            return nnx.merge(graphdef, st)(xx)

        step: tc.Jitted
        if mode == "fwd":
            step = tc.Jitted(jax.jit(apply, out_shardings=replicated), (state, x), lambda xx, _g: (state, xx))
        elif mode == "fwd+bwd":

            def fwd_bwd(st: Any, xx: jax.Array, g: jax.Array) -> Any:
                y, vjp = jax.vjp(apply, st, xx)
                return y, vjp(g)

            jitted = jax.jit(fwd_bwd, out_shardings=(replicated, (shardings, replicated)))
            step = tc.Jitted(jitted, (state, x, dy), lambda xx, g: (state, xx, g))
        elif mode == "bwd":
            forward = jax.jit(apply, out_shardings=replicated)
            _, vjp_fn = jax.vjp(forward, state, x)
            # other inputs: a new forward's VJP closure (the same pytree structure: no recompile of the backward)
            step = tc.Jitted(
                jax.jit(lambda f, g: f(g), out_shardings=(shardings, replicated)),
                (vjp_fn, dy),
                lambda xx, g: (jax.vjp(forward, state, xx)[1], g),
            )
        else:
            raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")

        def canonical(out: Any) -> Any:
            """The outputs in the explicit step's form: ``dstate`` as gradients by canonical parameter name."""
            if mode == "fwd":
                return out
            grads = out[1] if mode == "fwd+bwd" else out
            named = (canonical_grads(nnx.merge(graphdef, grads[0]), model), grads[1])
            return (out[0], named) if mode == "fwd+bwd" else named

        to_numpy = tc.step_to_numpy(mode)
        params, px, pdy = tc.place_problem(mesh, problem)
        return tc.prepared(
            mesh,
            step,
            to_numpy=lambda out: to_numpy(canonical(out)),
            compute=tc.shard_step(mesh, model, mode, XLA_ACT_MUL.get(model), params, px, pdy, reduce=False),
            dtype=problem.case.dtype,
            precision=precision,
            setup_s={"build": t1 - t0, "weights": t2 - t1},
            layout=tc.layout(model, problem.case.shape.hidden, group.world_size)
            + "; nnx params placed by nnx.get_named_sharding, jax.jit + NamedSharding (AxisType.Auto mesh)",
            note="first call includes XLA compile (SPMD partitioner)",
        )


BACKEND = ShardedBackend()
