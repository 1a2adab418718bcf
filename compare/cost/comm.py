"""The communication model of tensor-parallel steps, and the per-rank shard a TP backend computes. Pure Python.

Megatron's layout (``compare.backends.tp``) moves ``[tokens, dim]`` tensors only: one all-reduce of the output per
forward,
one of ``dx`` per backward. A *communication plan* lists, per mode, the all-reduce operations of one step, each as
the number of ``[tokens, dim]`` tensors it carries (a combiner that merges two reductions into one operation makes
one entry of 2). Payload bytes are what the reduced tensors hold; a ring all-reduce sends (and receives)
``2 (p - 1) / p`` times that per rank (``compare.backends.tp.ring_bytes``), the traffic that bounds its time.

At world size 1 every plan issues no collective (one rank holds the whole sum; Megatron skips the reduction too).

Which plan a backend follows is its registry line's ``comm``; the report checks the collectives each backend
actually issued (counted by the backend from its framework: ``CommDebugMode``, the compiled HLO) against it: the same
kinds, each as many calls, byte for byte.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compare.backends.tp import ring_bytes
from compare.cost.model import ITEMSIZE
from compare.problem.cases import MODES, TP_MODELS, Case, InputError, Shape, check_name

MEGATRON: dict[str, tuple[int, ...]] = {"fwd": (1,), "bwd": (1,), "fwd+bwd": (1, 1)}
COMBINED: dict[str, tuple[int, ...]] = {"fwd": (1,), "bwd": (1,), "fwd+bwd": (2,)}


@dataclass(frozen=True)
class CommPlan:
    """Per model (``"*"``: any) and mode, the all-reduce operations of one step, each as its number of
    ``[tokens, dim]`` tensors. ``f32_on_cpu``: XLA:CPU reduces 16-bit floats in float32 (its all-reduce of a bf16
    tensor is compiled as convert, f32 all-reduce, convert), so on a CPU their payload is 4 bytes an element."""

    ops: dict[str, dict[str, tuple[int, ...]]]
    f32_on_cpu: bool = False
    about: str = ""


COMM_PLANS: dict[str, CommPlan] = {
    "megatron": CommPlan(
        {"*": MEGATRON},
        about="one all-reduce of y per forward; the backward sums the column-parallel layers' partial dx locally, "
        "then one all-reduce of dx",
    ),
    "megatron-combined": CommPlan(
        {"*": COMBINED},
        f32_on_cpu=True,
        about="Megatron's tensors, with XLA's all-reduce combiner merging the forward's y and the backward's dx into "
        "one operation of 2 tensors in fwd+bwd",
    ),
    "xla-auto": CommPlan(
        {
            "*": {"fwd": (1,), "bwd": (2,), "fwd+bwd": (3,)},
            "gelu-mlp": COMBINED,
        },
        f32_on_cpu=True,
        about="XLA's partitioner: the GLU families' gate and up partial dx are reduced separately (one more tensor "
        "in the backward than Megatron's), merged by the combiner into one operation",
    ),
}


@dataclass(frozen=True)
class CommCost:
    """Modelled collectives of one step: ``ops`` operations of ``kind`` (every plan's are all-reduces, named as the
    backends count them, ``compare.backends.tp.Collective.kind``) carrying ``tensors`` ``[tokens, dim]`` tensors,
    ``payload_bytes`` in all, ``ring_bytes_per_rank`` on the wire per rank."""

    plan: str
    world_size: int
    ops: int
    tensors: int
    payload_bytes: int
    ring_bytes_per_rank: float
    kind: str = "all-reduce"


def check_world_size_value(world_size: int, option: str = "world size") -> int:
    """Return ``world_size`` if it is a positive integer (1: one device); else an InputError naming ``option``. The one
    rule every world size is held to, wherever it comes from (``run``, ``tp-job``, a job file)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise InputError(f"{option} must be a positive integer (1 or more; 1 is one device), got {world_size!r}")
    return world_size


def check_world_size(case: Case, world_size: int) -> int:
    """Return ``world_size`` if it is a positive integer that divides ``case``'s hidden width; else InputError."""
    check_world_size_value(world_size)
    if case.shape.hidden % world_size:
        divisors = [d for d in range(1, min(case.shape.hidden, 64) + 1) if case.shape.hidden % d == 0]
        raise InputError(
            f"world size {world_size} does not divide hidden {case.shape.hidden} of case {case.name}: each rank "
            f"holds hidden / world size columns; world sizes that divide it: {', '.join(map(str, divisors))}"
        )
    return world_size


def shard(case: Case, world_size: int) -> Case:
    """The case one rank computes: the same tokens and dim, ``hidden / world_size`` of the hidden width."""
    check_world_size(case, world_size)
    s = case.shape
    return dataclasses.replace(case, shape=Shape(s.batch, s.seq, s.dim, s.hidden // world_size))


def comm_cost(case: Case, plan: str, mode: str, world_size: int, device: str = "cpu") -> CommCost:
    """The modelled all-reduces of one step of ``plan`` on ``case`` at ``world_size``, on ``device`` (module
    docstring)."""
    check_name("communication plan", plan, list(COMM_PLANS))
    check_name("mode", mode, MODES)
    check_world_size(case, world_size)
    if case.model not in TP_MODELS:
        raise InputError(f"model {case.model!r} has no tensor-parallel layout; models with one: {', '.join(TP_MODELS)}")
    p = COMM_PLANS[plan]
    ops = p.ops.get(case.model, p.ops["*"])[mode] if world_size > 1 else ()  # one rank: nothing to reduce
    itemsize = 4 if p.f32_on_cpu and device.startswith("cpu") else ITEMSIZE[case.dtype]
    unit = case.shape.tokens * case.shape.dim * itemsize
    payload = sum(ops) * unit
    return CommCost(plan, world_size, len(ops), sum(ops), payload, ring_bytes(payload, world_size))
