"""What a tensor-parallel result stores beyond a single-process one (``result.tp`` in ``results.json``): how its
process group was launched, the collectives one step issued, its collectives and its compute timed apart, and the
set-up it paid. Written by the TP worker (``compare.run.tp_worker``); read by the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compare.backends.tp import Collective
from compare.formats.codec import LATER
from compare.timing.timer import Timing


@dataclass(frozen=True)
class TPInfo:
    """A tensor-parallel cell: ``world_size`` ranks on ``nproc`` processes started by ``launch`` with
    ``threads_per_process`` threads each, talking over ``transport``; the weights' ``layout``; the collectives one
    step issued (per rank); the step's collectives alone (``comm``) and its compute alone (``compute``), timed by the
    shared timer; seconds of set-up by name (``setup_s``); how many ranks' outputs were checked; and the
    communication model's entry for the step (``comm_model``, ``compare.cost.comm``; None where not modelled), the
    hosts the group ran on, and the group's measured all-reduce bandwidth (``bandwidth``: payload, ring bytes per
    rank, bus bytes per second and the probe's timing, or ``error``; None where not probed)."""

    world_size: int
    nproc: int
    launch: str
    threads_per_process: int
    transport: str
    layout: str
    collectives: tuple[Collective, ...] = ()
    comm: Timing | None = None
    compute: Timing | None = None
    setup_s: dict[str, float] = field(default_factory=dict)
    ranks_checked: int = 0
    comm_model: dict[str, Any] | None = field(default=None, metadata=LATER)
    hosts: tuple[str, ...] = field(default=(), metadata=LATER)
    bandwidth: dict[str, Any] | None = field(default=None, metadata=LATER)
