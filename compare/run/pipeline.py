"""The stages of one cell (backend, case, mode), written once for every runner: the in-process path
(``compare.run.harness``, which the sweep's worker runs too) and the tensor-parallel worker (``compare.run.tp_worker``).
A runner adds only what is its own (how it prepares and times a step, how it syncs, when its fresh reference exists,
what a group gathers). In order:

1. :func:`skipped`: a backend that does not implement the case's model or the mode, or is not available here;
2. :func:`no_fresh`: a prepared step that cannot be bound to new inputs is an ``error``, judged on nothing;
3. :func:`first_calls`: the first call on the golden inputs, timed alone (compile + run), judged on every device
   copy of its output (:func:`judge_read`), one call more whose bits say whether the step is ``deterministic``, and
   the step's :class:`Feed`;
4. the runner times the step through its :class:`Feed`: every later call runs on inputs the harness made, no two
   alike, and the feed keeps :data:`JUDGED` of their outputs, chosen after the fact (an untimed step makes one call);
5. :func:`verdicts`: once the case's fresh reference exists (:class:`CaseReference`, made once per case, only when
   every step has returned), per device copy the verdict on each kept output beside the first call's
   (:class:`CopyVerdicts`);
6. :func:`parity_record` (the worst copy's numbers) and :func:`result`: the status from the findings and the
   :class:`~compare.results.document.Result` with what it keeps of its step (:class:`Kept`), timing, kernels, cost.

A *copy* is ``(device, tensors)``: one device's copy of a step's outputs, ``{"y": [batch, seq, out], "dx": [batch,
seq, dim], "d<param>": <param's shape>}`` as float64 arrays (the narrowest exact type, in a :class:`Feed`),
only the tensors the mode checks (``compare.run.cell.MODE_TENSORS``).
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare.backends.registry import BackendSpec, Prepared
from compare.formats.codec import from_json
from compare.gate import fresh
from compare.gate.fresh import FreshCheck, FreshReference
from compare.gate.parity import Parity, UnusableCase, worst_tier
from compare.gate.parity_record import CopyVerdict, ParityRecord
from compare.kernels.summary import Kernels
from compare.problem.cases import Case
from compare.problem.golden import golden_for
from compare.results.document import Result
from compare.results.memory import NO_HOOK, Memory
from compare.run.cell import MODE_TENSORS, judge, model_cost, status_of
from compare.timing import timer
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
    """The ``error`` result of a prepared step without ``bind`` (it cannot be run on the harness's inputs, so it is
    never checked to compute its answer from them, and never a pass), decided before its first call; None when it
    has one."""
    if prepared.bind is not None:
        return None
    why = (
        f"{who(spec, mode)}: its Prepared has no bind (the step on inputs the harness makes): it cannot be checked "
        "to compute its answer from its inputs"
    )
    return Result.for_case(spec.name, case, mode, "error", reason=why, note=prepared.note, device=prepared.device)


def named(prepared: Prepared) -> bool:
    """Whether each verdict names its device: the step's copies are read one per device (``TPParts.copies``)."""
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


def digest(copies: Copies) -> str:
    """The bits of every tensor of every copy, as one hash (the order of the copies and tensors is the step's)."""
    h = hashlib.sha256()
    for d, tensors in copies:
        h.update(d.encode())
        for k, v in tensors.items():
            h.update(k.encode() + np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


def first_calls(
    prepared: Prepared,
    sync: Callable[[Any], None],
    spec: BackendSpec,
    case: Case,
    mode: str,
    plain: dict[str, np.ndarray],
    draw: dict[str, np.ndarray],
    seed: int | None = None,
) -> tuple[float, float, Judged, bool, Feed]:
    """Stage 3 (module docstring): ``(first seconds, second call's seconds, verdicts, deterministic, feed)``.
    ``sync`` ends each call (a group's barrier too); the verdicts are on the tensors ``mode`` checks;
    ``deterministic``: the two calls gave the same bits (:func:`digest`), as far as two show; the :class:`Feed` of
    ``draw`` has its orders from ``seed``."""
    name, ref = who(spec, mode), checked(mode, golden_for(case).ref)
    first_s, out = timer.first_call(prepared.step, sync)
    copies = read_copies(prepared, out, name)
    del out
    judged, bits = judge_read(copies, ref, plain, case.dtype, name, named(prepared)), digest(copies)
    del copies
    repeat_s, out = timer.first_call(prepared.step, sync)
    again = digest(read_copies(prepared, out, name))
    return first_s, repeat_s, judged, again == bits, Feed(prepared, draw, name, seed=seed)


#: Outputs of the calls on the harness's inputs that a cell keeps and judges (:class:`Feed`), chosen uniformly among
#: all of its calls after each block returned: a step stale on a share ``f`` of its calls escapes them with
#: probability ``(1 - f) ** JUDGED``. One more is chosen among the calls on a slot bound before, which a cache keyed
#: on its input's identity (pointer, version, shape) answers from memory: the uniform ones alone let such a cache
#: escape (tests/test_fastest.py's bare cache cheat: 0.02% to 0.2% a cell, more under load; it failed a CI run).
JUDGED = 2


@dataclass(frozen=True)
class Call:
    """One kept output of a :class:`Feed`: the order of the fresh draw's tokens its inputs held (``x = draw_x[order]``
    over the flattened tokens) and its copies, read (and compacted) only after its inputs were overwritten."""

    order: np.ndarray
    copies: Copies


@dataclass
class _Pending:
    """A chosen output whose slot's inputs are still live: read only once they are gone (:meth:`Feed.take`)."""

    slot: int
    order: np.ndarray
    out: Any


#: Up to this many tokens a :class:`Feed` remembers every order it bound and draws again rather than repeat one.
REMEMBERED_TOKENS = 12


class Feed:
    """The harness's inputs of one cell's step (``compare.timing.timer.Feed``; ``Prepared.bind``): every call after
    the first runs on the case's fresh draw (``compare.gate.fresh.draw``: ``{"x", "dy"}``, drawn at run time) with
    its ``T = batch * seq`` tokens in an order of its own, drawn from ``seed`` (the operating system's entropy
    unless given: a group of processes passes one they share). One reference judges every call: a token's output
    and input gradient depend on that token alone and a weight's gradient is a sum over the tokens, so a call's
    outputs put back in the draw's order are the draw's (weight gradients up to the order of float64 sums). A
    block's slots, and those of the kept outputs, are bound again to new orders before the next block or the read:
    a lazy output then reads other values (torch, in place) or deleted arrays (JAX), and fails.

    Which outputs it keeps (:data:`JUDGED`, and one more among the calls on a slot bound before) is drawn after each
    block returned (reservoir sampling): the step cannot know which calls are judged. Cost: a gather of ``x`` and
    ``dy`` per call outside the timed window (``cpu-mlp``: 3 MiB each), for ``bwd`` the runner's forward per call,
    and :data:`JUDGED` outputs held (in the dtype's width, ``compare.gate.fresh.compact``) until the reference exists.

    What it cannot see: a case of few tokens has few orders (``T!``): the feed binds each order once while one is new
    (it remembers them up to :data:`REMEMBERED_TOKENS` tokens; above, two alike are rarer than a 64-bit collision),
    then repeats them (a 1-token case repeats its input on every call); a step that recognises each token it has seen
    (a cache keyed on a row's values) still serves rows from memory."""

    def __init__(
        self, prepared: Prepared, draw: dict[str, np.ndarray], name: str, keep: int = JUDGED, seed: int | None = None
    ) -> None:
        if prepared.bind is None:
            raise RuntimeError(f"{name}: its Prepared has no bind (refused before its first call)")
        self._prepared, self._bind, self._name, self._keep = prepared, prepared.bind, name, keep
        self._x, self._dy = draw["x"], draw["dy"]
        self._tokens = int(np.prod(self._x.shape[:-1]))
        self._rng = np.random.default_rng(secrets.randbits(64) if seed is None else seed)
        self._order: dict[int, np.ndarray] = {}  # slot -> the order its inputs hold
        self._block: list[np.ndarray] = []  # the orders of the block taken last, in call order
        self._chosen: list[Call | _Pending] = []  # uniform over every call
        self._again: list[Call | _Pending] = []  # one, uniform over the calls on a slot bound before
        self._used: set[int] = set()
        self._reuses = 0
        # the orders bound so far, on few tokens (8 tokens have 40320 orders: 18 random ones meet twice in 1 run of 260)
        self._seen: set[bytes] | None = set() if self._tokens <= REMEMBERED_TOKENS else None
        #: calls made on the feed's inputs
        self.calls = 0

    def _rebind(self, slot: int) -> Callable[[], Any]:
        order = self._rng.permutation(self._tokens)
        if self._seen is not None:
            while order.tobytes() in self._seen and len(self._seen) < math.factorial(self._tokens):
                order = self._rng.permutation(self._tokens)
            self._seen.add(order.tobytes())

        def rows(a: np.ndarray) -> np.ndarray:
            return a.reshape(self._tokens, -1)[order].reshape(a.shape)

        fn = self._bind({"x": rows(self._x), "dy": rows(self._dy)}, slot)
        self._order[slot] = order
        return fn

    def _read(self) -> None:
        for picks in (self._chosen, self._again):
            for i, c in enumerate(picks):
                if isinstance(c, _Pending):
                    copies = read_copies(self._prepared, c.out, f"{self._name} on the harness's inputs")
                    picks[i] = Call(c.order, [(d, fresh.compact(t)) for d, t in copies])

    def _release(self, calls: int) -> None:
        """Bind every slot that holds a chosen output's inputs, unless the next block binds it, then read them."""
        pending = {c.slot for c in (*self._chosen, *self._again) if isinstance(c, _Pending)}
        for slot in sorted(pending - set(range(calls))):
            self._rebind(slot)
        self._read()

    def take(self, calls: int) -> list[Callable[[], Any]]:
        fns = [self._rebind(slot) for slot in range(calls)]
        self._release(calls)
        self._block = [self._order[slot] for slot in range(calls)]
        return fns

    def done(self, outputs: list[Any]) -> None:
        for slot, (order, out) in enumerate(zip(self._block, outputs, strict=True)):
            self.calls += 1
            call = _Pending(slot, order, out)
            if len(self._chosen) < self._keep:
                self._chosen.append(call)
            elif (j := int(self._rng.integers(self.calls))) < self._keep:
                self._chosen[j] = call
            if slot in self._used:
                self._reuses += 1
                if int(self._rng.integers(self._reuses)) == 0:
                    self._again[:] = [call]
            self._used.add(slot)

    def judged(self, sync: Callable[[Any], None] | None = None) -> list[Call]:
        """The kept outputs, each read only after its slot was bound again (its inputs gone). With ``sync``, a feed
        that made no call yet makes one first, outside any timing: how an untimed step is judged on these inputs."""
        if sync is not None and not self.calls:
            outs = [self.take(1)[0]()]
            sync(outs)
            self.done(outs)
        self._release(0)
        return [c for c in (*self._chosen, *self._again) if isinstance(c, Call)]


def _in_draw_order(tensors: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """A call's outputs put back in the draw's token order (``y`` and ``dx`` per token; weight gradients as they
    are), in the types they are held in (``compare.gate.fresh.compact``: the gate reads one tensor at a time in
    float64)."""
    out = {}
    for k, v in tensors.items():
        if k in ("y", "dx"):
            back = np.empty_like(v.reshape(len(order), -1))
            back[order] = v.reshape(len(order), -1)
            v = back.reshape(v.shape)
        out[k] = v
    return out


def judge_calls(
    calls: Sequence[Call],
    made: int,
    reference: FreshReference,
    dtype: str,
    mode: str,
    seed: int,
    name: str,
    by_device: bool,
) -> list[FreshCheck]:
    """The gate's verdict on the kept outputs of a :class:`Feed` (``made``: the calls it made) against the fresh
    draw's ``reference`` (``compare.gate.fresh.reference``: of every token or of the tokens it drew): per device
    copy, the worst of its calls' verdicts, as one :class:`~compare.gate.fresh.FreshCheck` of ``seed``."""
    if not calls:
        raise RuntimeError(f"{name}: no call on the harness's inputs was kept to judge")
    want = checked(mode, reference.ref)
    per_copy: list[list[FreshCheck]] = []
    for call in calls:
        got = [(d, reference.take(_in_draw_order(t, call.order))) for d, t in call.copies]
        judged = judge_read(got, want, reference.plain, dtype, f"{name} on the harness's inputs", by_device)
        checks = [FreshCheck.of(seed, p, reference, judged=len(calls), made=made) for _, p in judged]
        per_copy = [[c] for c in checks] if not per_copy else [[*w, c] for w, c in zip(per_copy, checks, strict=True)]
    return [worst_fresh(w) for w in per_copy]


def worst_fresh(checks: Sequence[FreshCheck]) -> FreshCheck:
    """The first of the worst tier among ``checks`` (non-empty)."""
    tier = worst_tier(c.tier for c in checks)
    return next(c for c in checks if c.tier == tier)


@dataclass(frozen=True)
class CopyVerdicts:
    """The gate's two verdicts on one device's copy of a cell's outputs: the first call's (golden inputs) and the
    harness's inputs' (:func:`judge_calls`: the worst of the kept calls)."""

    device: str
    first: Parity
    fresh: FreshCheck

    @property
    def tier(self) -> str:
        """The worse of the two: a failure on the harness's inputs counts as ``fail``, a deviation there is recorded
        only (those inputs change with every run)."""
        return worst_tier([self.first.tier, *(["fail"] if self.fresh.reasons else [])])

    def failures(self, prefix: str = "") -> list[str]:
        """The fail-tier findings, each after ``prefix``: the first call's, then those on the harness's inputs."""
        return [prefix + f for f in [*self.first.failures(), *self.fresh.reasons]]

    def deviations(self, prefix: str = "") -> list[str]:
        """The deviates-tier findings of the first call, each after ``prefix``."""
        return [prefix + f for f in self.first.deviations()]

    def record(self) -> CopyVerdict:
        """This copy's line in a process's stored verdict."""
        tier = self.tier
        return CopyVerdict(self.device, tier == "pass", tier)


def verdicts(
    first: Judged,
    calls: Sequence[Call],
    made: int,
    reference: FreshReference,
    spec: BackendSpec,
    case: Case,
    mode: str,
    seed: int,
    by_device: bool,
) -> list[CopyVerdicts]:
    """Per device copy (the same order in each: one process reads its copies in one order), its verdicts: the first
    call's (``first``) and those of the kept ``calls`` (:func:`judge_calls`)."""
    checks = judge_calls(calls, made, reference, case.dtype, mode, seed, who(spec, mode), by_device)
    return [CopyVerdicts(d, p, c) for (d, p), c in zip(first, checks, strict=True)]


def findings(copies: Sequence[CopyVerdicts], by_device: bool) -> tuple[list[str], list[str]]:
    """``(failures, deviations)`` of every copy, in order, each after ``"device <device>: "`` when ``by_device``."""

    def prefix(v: CopyVerdicts) -> str:
        return f"device {v.device}: " if by_device else ""

    return [f for v in copies for f in v.failures(prefix(v))], [f for v in copies for f in v.deviations(prefix(v))]


def parity_record(copies: Sequence[CopyVerdicts], fresh_check: FreshCheck | None = None) -> ParityRecord:
    """The stored parity of a cell: the numbers of its worst copy (the first failing one, else the first deviating
    one, else the first) and ``fresh_check``, the worst fresh verdict of every copy judged (in a group: of every
    process; default: of ``copies``)."""
    tier = worst_tier(c.tier for c in copies)
    shown = next(c for c in copies if c.tier == tier)
    return ParityRecord.of(shown.first, None, fresh_check or worst_fresh([c.fresh for c in copies]))


class CaseReference:
    """The fresh inputs of one case (``compare.gate.fresh.draw`` of ``seed``, with ``dy`` when ``backward``) and
    their float64 reference, made once, the first time a cell asks (after its step has returned), then kept for the
    case's later cells. An input the dtype cannot represent is an ``UnusableCase``: raised by the draw, or by the
    reference every time it is asked for."""

    def __init__(self, case: Case, seed: int, backward: bool = True) -> None:
        self.case, self.seed, self.backward = case, seed, backward
        self.inputs = fresh.draw(case, seed, golden_for(case).params, backward)
        self.made = False
        self._value: FreshReference | UnusableCase | None = None

    def get(self) -> FreshReference:
        if not self.made:
            try:
                self._value = fresh.reference(self.case, golden_for(self.case).params, self.inputs, self.backward)
            except UnusableCase as exc:
                self._value = exc
            self.made = True
        if isinstance(self._value, UnusableCase):
            raise self._value
        assert self._value is not None
        return self._value


def profile(prepared: Prepared, trace: Path | None = None, relative_to: Path | None = None) -> Kernels | None:
    """The kernel summary of one more step under the framework's profiler (``Prepared.profile``; None without
    one), with its trace written to ``trace`` when given, the trace's path then relative to ``relative_to``."""
    if prepared.profile is None:
        return None
    doc = prepared.profile(trace)
    if not doc:
        return None
    kernels = from_json(Kernels, doc)
    if kernels.trace and relative_to is not None:  # relative to the output folder, for links
        kernels = replace(kernels, trace=os.path.relpath(kernels.trace, relative_to))
    return kernels


def memory(prepared: Prepared) -> Memory:
    """What one more step holds in memory (``Prepared.memory``, outside the timed samples): the tensors its forward
    saves for the backward and its peak (``compare.results.memory``); a step without the hook is "not measured" with
    the reason, never 0. A failure of the measurement is the caller's to record (the cell's parity stands)."""
    return Memory.not_measured(NO_HOOK) if prepared.memory is None else from_json(Memory, prepared.memory())


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
    """The cell's result: its status and reason from ``findings`` (``(failures, deviations)`` of every copy), what
    it kept of its step, its records, ``extras`` (over the step's own) and the cost model's entry for ``cost_case``
    (default ``case``; one rank's share of a tensor-parallel step)."""
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
