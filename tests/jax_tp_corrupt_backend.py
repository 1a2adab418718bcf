"""A negative control for the per-device parity check of the JAX TP backends: ``jax-tp-shardmap`` whose step, after
running, scales device 1's copy of the replicated ``y`` (a ``[tokens, dim]`` array, ``P()`` on the mesh) by
:data:`FACTOR` and leaves every other copy (device 0's) right. Reading device 0's copy alone (what ``to_host`` of a
replicated array does) sees a right answer; judging every device's copy must fail, naming device 1. Its step on fresh
inputs (``Prepared.bind``) is corrupted the same way."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.backends.tp import Group
from compare.problem.cases import TP_MODELS
from compare.problem.golden import Problem
from jax_impl import tp_common as tc
from jax_impl.backends.tp_shardmap import BACKEND as SHARDMAP

NAME = "jax-tp-corrupt-device1"
SPEC = BackendSpec(
    name=NAME,
    framework="jax",
    target="tests.jax_tp_corrupt_backend",
    about="jax-tp-shardmap with device 1's copy of y scaled after each step (a negative control: must fail parity)",
    models=TP_MODELS,
    runtime="jax_impl.tp_runtime",
    launches=("devices", "processes"),
)
#: The scale of device 1's copy of ``y``: far past the gate's float32 and bfloat16 bounds.
FACTOR = 1.01
#: The mesh position of the device whose copy is corrupted.
BAD = 1


def scale_copy(a: jax.Array, device: jax.Device, factor: float) -> jax.Array:
    """``a`` with ``device``'s pieces (when this process holds them) multiplied by ``factor``, every other device's
    pieces as they are: one wrong copy of a replicated array (``jax.make_array_from_single_device_arrays``)."""
    pieces = [s.data * factor if s.device == device else s.data for s in a.addressable_shards]
    return jax.make_array_from_single_device_arrays(a.shape, a.sharding, pieces)


class CorruptDevice1:
    name = NAME

    def availability(self) -> Availability:
        return SHARDMAP.availability()

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        if mode == "bwd":
            raise ValueError(f"{NAME} corrupts y, which mode bwd does not return")
        p = SHARDMAP.prepare(problem, mode, group)
        bad = tc.make_mesh(group.world_size).devices.flat[BAD]
        step, bind = p.step, p.bind
        assert bind is not None

        def corrupt(out: Any) -> Any:
            if mode == "fwd":
                return scale_copy(out, bad, FACTOR)
            return scale_copy(out[0], bad, FACTOR), out[1]

        def corrupted() -> Any:
            return corrupt(step())

        def corrupted_bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
            run = bind(inputs, slot)
            return lambda: corrupt(run())

        return dataclasses.replace(p, step=corrupted, bind=corrupted_bind)


BACKEND = CorruptDevice1()
