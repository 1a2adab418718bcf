"""``jax-tp-shardmap``: Megatron written out by hand with ``jax.shard_map``: each device computes its partial output
from its weight shards and the collectives are explicit ``psum``s, one of the partial ``y`` (forward) and one of the
partial ``dx`` (backward, the gate and up contributions summed locally first), whatever the mode
(``jax_impl.tp_common.shard_step``). GeGLU and SwiGLU run the project's Pallas kernel for ``act(g) * u`` on the local
``[tokens, hidden/p]`` slice (XLA's partitioner cannot see into a custom kernel, so it must run inside
``shard_map``); the Pallas call carries no varying-axis type, so these run with ``check_vma=False``. GPT-2's MLP
(``gelu-mlp``) is plain jnp with ``check_vma=True``. On a machine without a GPU the Pallas kernel is interpreted:
GLU cells are parity only, not timed (as ``jax-pallas``); ``gelu-mlp`` is timed.
"""

from __future__ import annotations

import time

from compare.backends.registry import Availability, Prepared
from compare.backends.tp import Group
from compare.problem.cases import GLU_ACTIVATIONS, GLU_MODELS
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import tp_common as tc
from jax_impl.backends.pallas import BACKEND as PALLAS
from jax_impl.backends.pallas import INTERPRETED_NOTE, pallas_act_mul


class ShardMapBackend:
    name = "jax-tp-shardmap"

    def availability(self) -> Availability:
        return PALLAS.availability()  # the same kernel, the same needs

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        model = problem.case.model
        tc.check_divisible(problem, group.world_size)
        precision = dev.pin_precision()
        mesh = tc.make_mesh(group.world_size)
        glu = model in GLU_MODELS
        act_mul = pallas_act_mul(GLU_ACTIVATIONS[model]) if glu else None
        timed = tc.on_gpu() or not glu
        t0 = time.perf_counter()
        params, x, dy = tc.place_problem(mesh, problem)
        t1 = time.perf_counter()
        step = tc.shard_step(mesh, model, mode, act_mul, params, x, dy, check_vma=not glu)
        compute = tc.shard_step(mesh, model, mode, act_mul, params, x, dy, check_vma=not glu, reduce=False)
        t2 = time.perf_counter()
        kernel = f"Pallas {GLU_ACTIVATIONS[model]} kernel per shard, check_vma=False" if glu else "jnp, check_vma=True"
        return tc.prepared(
            mesh,
            step,
            to_numpy=tc.step_to_numpy(mode),
            compute=compute,
            dtype=problem.case.dtype,
            precision=precision,
            setup_s={"weights": t1 - t0, "build": t2 - t1},
            layout=tc.layout(model, problem.case.shape.hidden, group.world_size)
            + f"; jax.shard_map with explicit psum of y and of dx ({kernel})",
            timed=timed,
            note="first call includes XLA compile" if timed else INTERPRETED_NOTE,
        )


BACKEND = ShardMapBackend()
