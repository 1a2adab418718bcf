"""A result's stored parity verdict (``result.parity`` in ``results.json``): the gate's numbers for every tensor
(:class:`~compare.gate.parity.TensorParity`), the worst tensor's summary, and which outputs were checked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compare.formats.codec import LATER
from compare.gate.fresh import FreshCheck
from compare.gate.parity import Parity, RoutingCheck, TensorParity, VariantCheck


@dataclass(frozen=True)
class LastTimed:
    """The verdict on the output of the last timed call (a backend must still be right after warm-up)."""

    passed: bool
    failures: tuple[str, ...] = ()
    tier: str = "pass"


@dataclass(frozen=True)
class CopyVerdict:
    """The verdict on one device's copy of a tensor-parallel step's outputs (``compare.backends.tp.DeviceCopy``):
    ``tier`` the worse of the first call's and, when timed, the last timed call's; ``passed`` when that is ``pass``."""

    device: str
    passed: bool
    tier: str = "pass"


@dataclass(frozen=True)
class ProcessVerdict:
    """A tensor-parallel process's own verdict on its outputs (every process checks the full tensors): ``tier``, the
    worst of the device copies it holds (``copies``, each copy's verdict), ``passed`` when that is ``pass``."""

    rank: int
    passed: bool
    tier: str = "pass"
    copies: tuple[CopyVerdict, ...] = ()


@dataclass(frozen=True)
class ParityRecord:
    """Parity of one result: ``tier`` (``pass``, ``deviates`` or ``fail``: the worst tensor's, first call), ``passed``
    (``tier == "pass"``), the worst tensor's max-check numbers (``max_abs_err``, ``max_rel_err``, ``bound``,
    ``ratio``), its ``worst_ratio`` over every check and its name, every check in the fail tier as ``tensor:check``
    (``failed``) and in the deviates tier (``deviated``), the tensors, the outputs ``checked`` ("first call", then
    "last timed call" when it was timed, then "fresh inputs"), ``last_timed``'s verdict, the verdict on fresh inputs
    (``fresh``, ``compare.gate.fresh``: the worst device copy's for a tensor-parallel result) and, for a tensor-parallel
    result, each process's verdict."""

    passed: bool
    tier: str = "pass"
    deviated: tuple[str, ...] = ()
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    bound: float = math.nan
    ratio: float = math.nan
    worst_ratio: float = math.nan
    worst_tensor: str = ""
    failed: tuple[str, ...] = ()
    tensors: tuple[TensorParity, ...] = ()
    checked: tuple[str, ...] = ()
    last_timed: LastTimed | None = field(default=None, metadata=LATER)
    processes: tuple[ProcessVerdict, ...] = field(default=(), metadata=LATER)
    fresh: FreshCheck | None = field(default=None, metadata=LATER)
    #: a mixture-of-experts step's routing on the first call (``compare.gate.routing``); None for any other step
    routing: RoutingCheck | None = field(default=None, metadata=LATER)
    #: what a failing or deviating step computes instead, its near variants checked (``compare.gate.near_variants``);
    #: None where the step passed or its model has none
    variants: VariantCheck | None = field(default=None, metadata=LATER)

    @staticmethod
    def of(parity: Parity, last_timed: Parity | None = None, fresh: FreshCheck | None = None) -> ParityRecord:
        """The record of the gate's verdict ``parity`` on the first call and, when the step was timed, ``last_timed``
        on the output of the last timed call, and ``fresh`` on fresh inputs (``checked`` says which were checked)."""
        checked = ["first call"]
        again = None
        if last_timed is not None:
            again = LastTimed(last_timed.passed, tuple(last_timed.failures()), last_timed.tier)
            checked.append("last timed call")
        if fresh is not None:
            checked.append("fresh inputs")
        w = parity.worst
        return ParityRecord(
            passed=parity.passed,
            tier=parity.tier,
            deviated=tuple(f"{t.tensor}:{c}" for t in parity.tensors for c in t.deviated),
            max_abs_err=w.max_abs_err,
            max_rel_err=w.max_rel_err,
            bound=w.bound,
            ratio=w.ratio,
            worst_ratio=w.worst_ratio,
            worst_tensor=w.tensor,
            failed=tuple(f"{t.tensor}:{c}" for t in parity.tensors for c in t.failed),
            tensors=parity.tensors,
            checked=tuple(checked),
            last_timed=again,
            fresh=fresh,
            routing=parity.routing,
            variants=parity.variants,
        )
