"""The stages of one cell (backend, case, mode), written once for every runner: the in-process path
(``compare.run.harness``, which the sweep's worker runs too) and the tensor-parallel worker (``compare.run.tp_worker``).

A cell goes through them in this order; a runner adds only what is its own (how it prepares and times a step, how
it syncs, when its fresh reference exists, the processes a tensor-parallel group gathers):

1. :func:`skipped`: a backend that does not implement the case's model or the mode, or is not available here;
2. :func:`no_fresh`: a prepared step that cannot run on new inputs is an ``error``, judged on nothing;
3. :func:`first_call`: the first call, timed alone (``compare.timing.timer.first_call``: compile + run), and the
   gate's verdict on every device copy of its output (:func:`judge_copies`; a single-device step has one copy);
4. the runner times the step; :func:`judge_copies` on the last timed call's output (a replayed stale answer fails);
5. :func:`fresh_step`: the step once on fresh inputs (``Prepared.fresh``, a draw of ``compare.gate.fresh.draw``), its
   copies read and kept (``compare.gate.fresh.compact``) until the draw's reference exists, which the runner computes
   only once the step has returned;
6. :func:`judge_fresh`: the gate's verdict on each kept copy against that reference (``FreshCheck``);
7. :func:`verdicts`: per device copy the three verdicts (:class:`CopyVerdicts`, its tier and its findings), the
   stored parity record (:func:`parity_record`: the worst copy's numbers) and :func:`result`: the status from the
   findings (``compare.run.cell.status_of``) and the :class:`~compare.results.document.Result` with what the result
   keeps of its step (:class:`Kept`), its timing, kernels and cost.

A *copy* is ``(device, tensors)``: one device's copy of a step's outputs, ``{"y": [batch, seq, out], "dx": [batch,
seq, dim], "d<param>": <param's shape>}`` as float64 arrays (float32 where that loses nothing, after
:func:`fresh_step`), only the tensors the mode checks (``compare.run.cell.MODE_TENSORS``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare.backends.registry import BackendSpec, Prepared
from compare.gate import fresh
from compare.gate.fresh import FreshCheck, FreshReference
from compare.gate.parity import Parity, worst_tier
from compare.gate.parity_record import CopyVerdict, ParityRecord
from compare.kernels.summary import Kernels
from compare.problem.cases import Case
from compare.results.document import Result
from compare.results.memory import NO_HOOK, Memory
from compare.run.cell import MODE_TENSORS, judge, model_cost, status_of
from compare.timing import timer as timing
from compare.timing.timer import Timing

#: ``(device, tensors)`` of every device copy of one output that a process holds (module docstring).
Copies = list[tuple[str, dict[str, np.ndarray]]]
#: ``(device, verdict)`` of the gate on every copy of :data:`Copies`.
Judged = list[tuple[str, Parity]]


def who(spec: BackendSpec, mode: str) -> str:
    """How the cell's errors name it: ``"<backend> in mode <mode>"``."""
    return f"{spec.name} in mode {mode}"


def checked(mode: str, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors of ``tensors`` (a reference: ``y`` and every gradient) that ``mode`` checks, read by name only (a
    lazy reference computes no gradient a forward-only mode does not check)."""
    want = MODE_TENSORS[mode]
    return {k: tensors[k] for k in tensors if want(k)}


def skipped(spec: BackendSpec, case: Case, mode: str) -> Result | None:
    """The ``skipped`` result of a backend that does not implement ``case``'s model or ``mode``, or that is not
    available on this machine (its ``availability()``, which may raise: the caller's cell then errs); None when it
    runs."""
    if case.model not in spec.models:
        reason = f"implements {', '.join(spec.models)} only, not {case.model}"
        return Result.for_case(spec.name, case, mode, "skipped", reason=reason)
    if mode not in spec.modes:
        reason = f"supports modes {', '.join(spec.modes)} only, not {mode}"
        return Result.for_case(spec.name, case, mode, "skipped", reason=reason)
    avail = spec.availability()
    if not avail.ok:
        return Result.for_case(spec.name, case, mode, "skipped", reason=avail.reason, device=avail.device)
    return None


def no_fresh(spec: BackendSpec, case: Case, mode: str, prepared: Prepared) -> Result | None:
    """The ``error`` result of a prepared step without ``fresh`` (it cannot be checked to compute its answer from
    its inputs, so it is never a pass), decided before its first call; None when it has one."""
    if prepared.fresh is not None:
        return None
    why = (
        f"{who(spec, mode)}: its Prepared has no fresh (a step on inputs it has never seen): it cannot be checked "
        "to compute its answer from its inputs"
    )
    return Result.for_case(spec.name, case, mode, "error", reason=why, note=prepared.note, device=prepared.device)


def named(prepared: Prepared) -> bool:
    """Whether the step's copies are read one per device (``TPParts.copies``), so each verdict names its device."""
    return prepared.tp is not None and prepared.tp.copies is not None


def read_copies(prepared: Prepared, output: Any, name: str) -> Copies:
    """Every device's copy of ``output`` that this process holds (``TPParts.copies``; one copy, ``to_numpy``'s on
    ``Prepared.device``, when the backend has none). In a group every process makes the same calls (reading a copy
    may gather). ``name``: the cell in errors."""
    tp = prepared.tp
    if tp is None or tp.copies is None:
        return [(prepared.device, prepared.to_numpy(output))]
    copies = tp.copies(output)
    if not copies:
        raise RuntimeError(f"{name}: the backend's TPParts.copies returned no device copy to judge")
    return [(c.device, c.tensors) for c in copies]


def judge_read(
    copies: Copies, ref: dict[str, np.ndarray], plain: dict[str, np.ndarray], dtype: str, name: str, by_device: bool
) -> Judged:
    """The gate's verdict (``compare.run.cell.judge``) on copies already read; a copy holding other tensors than
    ``ref`` is an error naming ``name`` (and its device when ``by_device``)."""
    return [(d, judge(t, ref, plain, dtype, f"{name} on {d}" if by_device else name)) for d, t in copies]


def judge_copies(
    prepared: Prepared, output: Any, ref: dict[str, np.ndarray], plain: dict[str, np.ndarray], dtype: str, name: str
) -> Judged:
    """The gate's verdict on every device's copy of ``output`` that this process holds (:func:`read_copies`)."""
    return judge_read(read_copies(prepared, output, name), ref, plain, dtype, name, named(prepared))


def first_call(
    prepared: Prepared,
    sync: Callable[[Any], None],
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
    name: str,
) -> tuple[float, Judged]:
    """The step's first call, timed alone (compile + run; ``sync`` ends it: a group's barrier too), and the gate's
    verdict on every copy of its output against ``ref`` (the tensors the mode checks): ``(seconds, verdicts)``."""
    first_s, out = timing.first_call(prepared.step, sync)
    return first_s, judge_copies(prepared, out, ref, plain, dtype, name)


@dataclass(frozen=True)
class FreshRun:
    """The step's output on fresh inputs, read and kept until the draw's reference exists: ``copies``
    (:data:`Copies`, compacted), the seconds of the step (``step_s``) and of reading its copies (``read_s``)."""

    copies: Copies
    step_s: float
    read_s: float


def fresh_step(prepared: Prepared, sync: Callable[[Any], None], inputs: dict[str, np.ndarray], name: str) -> FreshRun:
    """Run the step once on ``inputs`` (``compare.gate.fresh.draw``: ``{"x", "dy"}``) through ``Prepared.fresh``
    (:func:`no_fresh` refused a step without it), ``sync`` it, and read every copy of its output, compacted."""
    if prepared.fresh is None:
        raise RuntimeError(f"{name}: its Prepared has no fresh (refused before its first call)")
    t0 = time.perf_counter()
    out = prepared.fresh(inputs)
    sync([out])
    t1 = time.perf_counter()
    copies = [(d, fresh.compact(t)) for d, t in read_copies(prepared, out, f"{name} on fresh inputs")]
    del out
    return FreshRun(copies, t1 - t0, time.perf_counter() - t1)


def judge_fresh(
    run: FreshRun,
    reference: FreshReference,
    dtype: str,
    mode: str,
    seed: int,
    name: str,
    by_device: bool,
) -> list[FreshCheck]:
    """The gate's verdict on every copy of a :class:`FreshRun` against the draw's ``reference``
    (``compare.gate.fresh.reference``: the float64 reference and the plain computation of the tensors ``mode``
    checks, of every token or of the tokens it drew), as one :class:`~compare.gate.fresh.FreshCheck` of ``seed`` per
    copy."""
    want = checked(mode, reference.ref)
    got = [(d, reference.take({k: v.astype(np.float64) for k, v in t.items()})) for d, t in run.copies]
    judged = judge_read(got, want, reference.plain, dtype, f"{name} on fresh inputs", by_device)
    return [FreshCheck.of(seed, p, reference) for _, p in judged]


def worst_fresh(checks: Sequence[FreshCheck]) -> FreshCheck:
    """The first of the worst tier among ``checks`` (non-empty)."""
    tier = worst_tier(c.tier for c in checks)
    return next(c for c in checks if c.tier == tier)


@dataclass(frozen=True)
class CopyVerdicts:
    """The gate's three verdicts on one device's copy of a cell's outputs: the first call's, the last timed call's
    (None when the step is not timed) and the fresh inputs' (``compare.gate.fresh``)."""

    device: str
    first: Parity
    again: Parity | None
    fresh: FreshCheck

    @property
    def tier(self) -> str:
        """The worst of the three: a failure on fresh inputs counts as ``fail``, a deviation there is recorded only."""
        again = [self.again.tier] if self.again is not None else []
        return worst_tier([self.first.tier, *again, *(["fail"] if self.fresh.reasons else [])])

    def failures(self, prefix: str = "") -> list[str]:
        """The fail-tier findings, each after ``prefix``: the first call's, the last timed call's, the fresh ones."""
        again = self.again.failures() if self.again is not None else []
        found = [*self.first.failures(), *(f"last timed call: {f}" for f in again), *self.fresh.reasons]
        return [prefix + f for f in found]

    def deviations(self, prefix: str = "") -> list[str]:
        """The deviates-tier findings, each after ``prefix``: the first call's and the last timed call's."""
        again = self.again.deviations() if self.again is not None else []
        return [prefix + f for f in [*self.first.deviations(), *(f"last timed call: {f}" for f in again)]]

    def record(self) -> CopyVerdict:
        """This copy's line in a process's stored verdict."""
        tier = self.tier
        return CopyVerdict(self.device, tier == "pass", tier)


def verdicts(first: Judged, again: Judged | None, checks: Sequence[FreshCheck]) -> list[CopyVerdicts]:
    """Per device copy (the same order in each: one process reads its copies in one order), its three verdicts."""
    later: list[Parity | None] = [p for _, p in again] if again is not None else [None] * len(first)
    return [CopyVerdicts(d, p, a, c) for (d, p), a, c in zip(first, later, checks, strict=True)]


def findings(copies: Sequence[CopyVerdicts], by_device: bool) -> tuple[list[str], list[str]]:
    """``(failures, deviations)`` of every copy, in order, each after ``"device <device>: "`` when ``by_device``."""

    def prefix(v: CopyVerdicts) -> str:
        return f"device {v.device}: " if by_device else ""

    return [f for v in copies for f in v.failures(prefix(v))], [f for v in copies for f in v.deviations(prefix(v))]


def parity_record(copies: Sequence[CopyVerdicts], fresh_check: FreshCheck) -> ParityRecord:
    """The stored parity of a cell: the numbers of its worst copy (the first failing one, else the first deviating
    one, else the first) and ``fresh_check``, the worst fresh verdict of every copy judged (in a group: of every
    process)."""
    tier = worst_tier(c.tier for c in copies)
    shown = next(c for c in copies if c.tier == tier)
    return ParityRecord.of(shown.first, shown.again, fresh_check)


def profile(prepared: Prepared, trace: Path | None = None, relative_to: Path | None = None) -> Kernels | None:
    """The kernel summary of one more step under the framework's profiler (``Prepared.profile``; None without
    one), with its trace written to ``trace`` when given, the trace's path then relative to ``relative_to``."""
    if prepared.profile is None:
        return None
    doc = prepared.profile(trace)
    if not doc:
        return None
    kernels = Kernels.from_dict(doc)
    if kernels.trace and relative_to is not None:  # relative to the output folder, for links
        kernels = replace(kernels, trace=os.path.relpath(kernels.trace, relative_to))
    return kernels


def memory(prepared: Prepared) -> Memory:
    """What one more step holds in memory (``Prepared.memory``, outside the timed samples): the tensors its forward
    saves for the backward and its peak (``compare.results.memory``); a step without the hook is "not measured" with
    the reason, never 0. A failure of the measurement is the caller's to record (the cell's parity stands)."""
    if prepared.memory is None:
        return Memory.not_measured(NO_HOOK)
    return Memory.from_dict(prepared.memory())


@dataclass(frozen=True)
class Kept:
    """What a result keeps of its :class:`~compare.backends.registry.Prepared` once the step is released."""

    note: str = ""
    device: str = ""
    threads: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def of(p: Prepared) -> Kept:
        return Kept(p.note, p.device, dict(p.threads), dict(p.extras))


def result(
    spec: BackendSpec,
    case: Case,
    mode: str,
    findings: tuple[list[str], list[str]],
    kept: Kept,
    parity: ParityRecord,
    timed: Timing | None,
    kernels: Kernels | None = None,
    extras: dict[str, Any] | None = None,
    cost_case: Case | None = None,
    cold: Timing | None = None,
    memory: Memory | None = None,
) -> Result:
    """The cell's result: its status and reason from ``findings`` (``(failures, deviations)`` of every copy,
    ``compare.run.cell.status_of``), what it kept of its step, its ``parity`` record, timing, kernels, ``extras``
    (over the step's own), its cold-cache timing (``cold``), its memory record (``memory``, None: not asked for) and
    the cost model's entry for ``cost_case`` (default ``case``; one rank's share of a tensor-parallel step)."""
    status, reason = status_of(*findings)
    return Result.for_case(
        spec.name,
        case,
        mode,
        status,
        reason=reason,
        note=kept.note,
        device=kept.device,
        parity=parity,
        timing=timed,
        cold=cold,
        threads=kept.threads,
        kernels=kernels,
        extras={**kept.extras, **(extras or {})},
        cost=model_cost(spec, cost_case or case, mode),
        memory=memory,
    )
