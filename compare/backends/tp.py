"""Tensor parallelism: the contract between the core and a tensor-parallel (TP) backend. Framework-free.

Layout (Megatron): for the GLU families gate and up are split by output columns (each rank holds ``[hidden/p, dim]``
of each, torch layout), down by input rows (``[dim, hidden/p]``); the activation runs on the local
``[tokens, hidden/p]`` slice and ONE all-reduce of ``[tokens, dim]`` adds the partial outputs. The backward needs
one more all-reduce, of ``dx`` (the partial input gradients of the column-parallel layers, summed locally first).
``gelu-mlp`` is the same with fc1 split by columns (and ``b1`` with it) and fc2 by rows (``b2`` added once, after the
reduce). ``linear`` has no such pair and is not run tensor-parallel.

How a TP backend runs (``compare.run.tp_launch`` starts it, ``compare.run.tp_worker`` drives it):

- its registry line names a ``runtime`` module (``BackendSpec.runtime``) with ``LAUNCHES`` (the ways its ranks can
  start: ``"processes"``, one process per rank joined by the framework's distributed engine; ``"devices"``, one
  process with ``world_size`` devices) and ``init(launch: Launch) -> Group``;
- its backend object implements ``prepare(problem, mode, group) -> Prepared`` where ``problem`` holds the FULL
  golden inputs and weights (every rank gets the same), the backend keeps its own shard, and ``Prepared.tp`` is a
  :class:`TPParts`. ``to_numpy`` returns FULL tensors (weight gradients gathered, outside the timed step), so every
  process checks every tensor against the same golden with the same gate;
- a replicated output (``y``, ``dx``, a replicated gradient such as ``db2``) exists once per device, and a wrong
  copy on any one of them is a wrong result: ``TPParts.copies(output)`` returns one :class:`DeviceCopy` per device
  this process holds, each read from that device's own copy of every replicated tensor. The worker judges every
  copy (first call, and the calls on the harness's inputs: ``Prepared.bind``, which every TP backend
  implements, handed the same full ``x`` and ``dy`` on every rank) and counts the copies judged
  (``ranks_checked``). A backend whose process holds one device (torch's ranks) may leave it None: its one copy is
  ``to_numpy``'s, on ``Prepared.device``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: The ways a TP group's ranks can start (``Launch.how``).
LAUNCHES: tuple[str, ...] = ("processes", "devices")


@dataclass(frozen=True)
class Launch:
    """How one process of a worker group starts. ``world_size`` is the TP degree (the case's world size);
    ``nproc`` is the number of processes: ``world_size`` when ``how == "processes"``, 1 when ``"devices"``.
    ``rank`` is this process's index; ``addr:port`` the rendezvous (rank 0's listener); ``threads`` the compute
    threads of this process; ``timeout_s`` bounds every collective (a dead peer fails a call within it)."""

    world_size: int
    nproc: int
    rank: int
    how: str
    addr: str = "127.0.0.1"
    port: int = 0
    threads: int = 1
    timeout_s: float = 60.0


class Group(Protocol):
    """The processes of one TP group, as the worker and the shared timer see them. Process 0 reports."""

    world_size: int
    nproc: int
    rank: int
    #: The collectives' transport and device, e.g. ``"gloo/cpu"`` or ``"XLA:CPU x2 devices"``.
    backend: str

    def barrier(self) -> None:
        """Block until every process has arrived (bounded by the launch's timeout)."""
        ...

    def max_all(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum of ``values`` over the processes (same length on every process)."""
        ...

    def gather(self, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A JSON-able object from every process, in rank order, on process 0; None on the others."""
        ...

    def close(self) -> None:
        """Leave the group (destroy process groups, shut the distributed client down)."""
        ...

    def allreduce_probe(self, nbytes: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """A zero-argument all-reduce (sum) of an ``nbytes`` float32 buffer over the group's ranks, and its sync: the
        transport's bandwidth probe, timed once per group by the worker (``compare.run.tp_worker``)."""
        ...


@dataclass(frozen=True)
class Collective:
    """One kind of collective in one step, per rank: ``count`` calls moving ``bytes`` of payload in all (the
    size of the tensors reduced, before any ring traffic). ``source`` says how it was counted (``CommDebugMode``,
    ``compiled HLO``); ``detail`` what a combiner merged, or the operand shapes."""

    kind: str
    count: int
    bytes: int
    source: str
    detail: str = ""


@dataclass(frozen=True)
class DeviceCopy:
    """The step's output as one device holds it: ``tensors`` as ``Prepared.to_numpy`` maps them (full float64 arrays
    by canonical name), every replicated tensor read from ``device``'s copy and every sharded one gathered (the same
    in every copy). ``device`` names it as reports do, e.g. ``"cuda:0"``, ``"cpu:2048 (rank 1)"``."""

    device: str
    tensors: dict[str, np.ndarray]


@dataclass
class TPParts:
    """What a TP backend adds to its :class:`~compare.backends.registry.Prepared` (``Prepared.tp``).

    - ``collectives()``: the collectives of one step, counted (not timed; a backend may count once and keep the
      count); the step's output is consumed;
    - ``comm_only()``: the step's collectives alone, as counted or read off the step itself (kinds, counts and
      sizes; not the communication model's), on tensors of the same sizes (synced with ``Prepared.sync``);
    - ``compute_only()``: the step with its collectives left out (a wrong answer on purpose: timed, never judged);
    - ``setup_s``: seconds of set-up apart from the steady state, by name (``"weights"``: distributing or slicing
      the weights; ``"build"``: building the parallel module);
    - ``layout``: one line on how the weights are sharded and which plan was applied;
    - ``copies(output)``: every device's copy of a step's output that this process holds (:class:`DeviceCopy`, one
      per device, in device order); None: this process holds one device, and ``Prepared.to_numpy`` reads its copy.
    """

    collectives: Callable[[], list[Collective]]
    comm_only: Callable[[], Any]
    compute_only: Callable[[], Any]
    setup_s: dict[str, float] = field(default_factory=dict)
    layout: str = ""
    copies: Callable[[Any], list[DeviceCopy]] | None = None


#: The payload of the bandwidth probe: large enough that the ring's latency is a small share of its time.
PROBE_BYTES = 16 * 2**20


def megatron_allreduces(mode: str) -> int:
    """All-reduces of ``[tokens, dim]`` per step in Megatron's layout: 1 forward (the output), 1 backward (``dx``)."""
    return {"fwd": 1, "bwd": 1, "fwd+bwd": 2}[mode]


def ring_bytes(payload: int, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``payload`` bytes: ``2 (p-1)/p x payload``."""
    return 2.0 * (world_size - 1) / world_size * payload
