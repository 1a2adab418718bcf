"""The stages of one cell (backend, case, mode), written once for every runner: the in-process path
(``compare.run.harness``, which the sweep's worker runs too) and the tensor-parallel worker (``compare.run.tp_worker``).
A runner adds only what is its own (how it prepares and times a step, how it syncs, when its fresh reference exists,
what a group gathers). In order:

1. :func:`skipped`: a backend that does not implement the case's model or the mode, or is not available here;
2. :func:`no_fresh`: a prepared step that cannot be bound to new inputs is an ``error``, judged on nothing;
3. :func:`first_calls`: the first call on the golden inputs, timed alone (compile + run), judged on every device
   copy of its output (:func:`judge_read`; a copy that fails or deviates is checked against its model's near
   variants, ``compare.gate.near_variants``), one call more whose bits say whether the step is ``deterministic``, and
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

import functools
import hashlib
import math
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from compare.backends.registry import BackendSpec, OutputReader, Prepared, output_reader
from compare.formats.codec import from_json
from compare.gate import fresh, near_variants, routing
from compare.gate.fresh import FreshCheck, FreshReference
from compare.gate.parity import DTYPE_MAX, Parity, UnusableCase, worst_tier
from compare.gate.parity_record import CopyVerdict, ParityRecord
from compare.kernels.summary import Kernels
from compare.problem import datacache, moe
from compare.problem.cases import Case, is_moe
from compare.problem.golden import case_input, golden_for
from compare.problem.reference import round_to_dtype
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


def _judge_as(got: dict[str, np.ndarray], ref: Any, plain: Any, *, dtype: str, who: str) -> Parity:
    return judge(got, ref, plain, dtype, who)


def judge_read(
    copies: Copies,
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
    name: str,
    by_device: bool,
    draw: routing.Draw | None = None,
) -> Judged:
    """The gate's verdict (``compare.run.cell.judge``) on copies already read; a copy holding other tensors than
    ``ref`` is an error naming ``name`` (and its device when ``by_device``). A mixture-of-experts case's ``draw``
    (``compare.gate.routing.Draw``): each copy's ``routing`` taken apart and judged by its rule (the tensors against
    the golden of the step's own routing where it is routable; a wrong router fails)."""
    out: Judged = []
    for d, t in copies:
        who_ = f"{name} on {d}" if by_device else name
        if draw is None:
            out.append((d, judge(t, ref, plain, dtype, who_)))
            continue
        got, experts = routing.split(t)
        check = functools.partial(_judge_as, dtype=dtype, who=who_)
        out.append((d, draw.judge(got, experts, ref, plain, check, who_)))
    return out


def digest(copies: Copies) -> str:
    """The bits of every tensor of every copy, as one hash (the order of the copies and tensors is the step's). Each
    tensor is hashed from its own memory (no ``tobytes`` copy, no concatenation with its name: 0.2 GB of copies per
    output of a Llama 3.2 1B layer's fwd+bwd in bfloat16); the same hash as of the concatenated bytes."""
    h = hashlib.sha256()
    for d, tensors in copies:
        h.update(d.encode())
        for k, v in tensors.items():
            h.update(k.encode())
            h.update(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)
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
    routed = routing.golden_draw(case, tuple(ref))
    first_s, out = timer.first_call(prepared.step, sync)
    copies = read_copies(prepared, out, name)
    del out
    judged, bits = judge_read(copies, ref, plain, case.dtype, name, named(prepared), routed), digest(copies)
    judged = near_variants.explained(judged, copies, case, ref, plain, routed)
    del copies
    repeat_s, out = timer.first_call(prepared.step, sync)
    again = digest(read_copies(prepared, out, name))
    reader = None if prepared.tp is not None else output_reader(spec.framework)
    return first_s, repeat_s, judged, again == bits, Feed(prepared, case, mode, draw, name, reader, seed=seed)


#: Tokens of every call on the harness's inputs whose ``y`` and ``dx`` :class:`Feed` reads at its return and
#: :func:`judge_spots` checks against a float64 reference of those rows (drawn after the call returned).
SPOT_TOKENS = 2
#: Outputs a :class:`Feed` keeps whole to judge: the fresh draw's call.
KEPT_CALLS = 1
#: The fresh draw's call (:class:`Feed`) is one of the first this many calls on the harness's inputs, at a place
#: drawn in secret: the fewest a timed step makes (1 warm-up call and 5 samples, ``compare.timing.timer._checked``).
DRAW_CALL_WITHIN = 6


@dataclass(frozen=True)
class Call:
    """The fully judged output of a :class:`Feed`: the order of the fresh draw's tokens its inputs held (``x =
    draw_x[order]`` over the flattened tokens) and its copies, read (and compacted) when the call had returned."""

    order: np.ndarray
    copies: Copies


@dataclass(frozen=True)
class Spot:
    """What :class:`Feed` read of one call when it returned: the call's index, the tokens drawn then (``rows``, ``K``
    of them), their inputs (``x [K, dim]``, ``dy [K, out]``), and per checked tensor (``y``, ``dx``) those rows of
    every returned array of that tensor's shape ``[T, n]``, in float64 (by shape alone the harness cannot tell ``y``
    from ``dx`` where ``dim == out``: either may hold the answer). ``error``: why nothing could be read (an output
    that is not a materialised array of its framework)."""

    call: int
    rows: np.ndarray
    x: np.ndarray
    dy: np.ndarray
    got: dict[str, list[np.ndarray]]
    error: str = ""
    #: a mixture-of-experts step's experts of those tokens (``[K, k]``: the rows of the returned array of the
    #: routing's shape ``[T, k]``; None where none was returned, or the case is not a MoE block)
    routing: np.ndarray | None = None


class Feed:
    """The harness's inputs of one cell's step (``compare.timing.timer.Feed``; ``Prepared.bind``), and what it reads
    of every call at its return.

    **Values never seen before.** Every call on the feed gets inputs no earlier call of the step saw: new values of
    ``x`` and ``dy`` drawn from the case's distribution (``compare.problem.golden.case_input``, rounded to the dtype)
    for each call, from ``seed`` (the operating system's entropy unless given: a group of processes passes one it
    shares), except one call, placed in secret among the first :data:`DRAW_CALL_WITHIN`, which gets the case's fresh
    draw (``compare.gate.fresh.draw``, screened to stay in range) with its tokens in an order of its own: that call's
    output (:class:`Call`) is judged in full by the gate against the draw's float64 reference, made once per case.
    A row-value cache never hits, and an identity cache returns another call's answer.

    **Read at return.** ``done`` runs when the block's outputs were synced (the harness's sync: the framework's
    device-wide wait after the step's own, :func:`harness_sync`) and before anything else: for every call it checks
    that the output is made of materialised arrays of the step's framework (``reader``,
    ``compare.backends.registry.OutputReader``) and reads :data:`SPOT_TOKENS` of its tokens, drawn now from the
    operating system's entropy, from every array of ``y``'s and ``dx``'s shape (:class:`Spot`); the draw's call is
    read in full (``to_numpy``) then too. A step that computes later (on another thread or stream, or when its output
    is read), or from a copy of its inputs, is judged on what it had returned.

    **Every call checked.** :func:`judge_spots` compares every call's spots with a float64 reference of those rows:
    a step stale on a share ``f`` of ``n`` calls fails unless each stale call's spots match, and a stale output is
    another input's answer (about its own size off). Cost per call, outside the timed window: one draw of ``x`` and
    ``dy`` (``cpu-mlp``: 2 x 786k values, about 20 ms) and a read of ``K`` rows.

    What it cannot see: weight gradients are judged on the draw's call alone (a step right on ``y`` and ``dx`` but
    with stale weight gradients after the first calls escapes); a tensor-parallel step (``reader`` None: its outputs
    are sharded) is judged on the draw's call alone; the new values are not screened for range (a heavy-tailed
    16-bit case may overflow on some rows: those rows are passed over by the spot check)."""

    def __init__(
        self,
        prepared: Prepared,
        case: Case,
        mode: str,
        draw: dict[str, np.ndarray],
        name: str,
        reader: OutputReader | None,
        seed: int | None = None,
    ) -> None:
        if prepared.bind is None:
            raise RuntimeError(f"{name}: its Prepared has no bind (refused before its first call)")
        self._prepared, self._bind, self._name, self._reader = prepared, prepared.bind, name, reader
        self._case, self._mode = case, mode
        self._top_k = moe.MOE_SPECS[case.model].top_k if is_moe(case.model) else 0
        self._x, self._dy = draw["x"], draw["dy"]
        self._tokens = int(np.prod(self._x.shape[:-1]))
        self._rng = np.random.default_rng(secrets.randbits(64) if seed is None else seed)
        self._picks = np.random.default_rng(secrets.randbits(64))  # which tokens are read: known to no one
        self._draw_at = int(self._rng.integers(DRAW_CALL_WITHIN))
        self._taken = 0
        self._block: list[tuple[dict[str, np.ndarray], np.ndarray | None]] = []
        self._call: Call | None = None
        #: the calls' :class:`Spot` not judged yet (a batch at most), in call order (none without a ``reader``)
        self.spots: list[Spot] = []
        #: the every-call check of the calls judged so far
        self.tally = SpotTally()
        #: calls made on the feed's inputs
        self.calls = 0

    def _inputs(self) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The next call's inputs and, for the draw's call, its token order."""
        c, self._taken = self._case, self._taken + 1
        if self._taken - 1 == self._draw_at:
            order = self._rng.permutation(self._tokens)
            return {
                k: a.reshape(self._tokens, -1)[order].reshape(a.shape) for k, a in (("x", self._x), ("dy", self._dy))
            }, order
        x = round_to_dtype(case_input(self._rng, c), c.dtype)
        return {"x": x, "dy": round_to_dtype(self._rng.standard_normal(c.output_shape()), c.dtype)}, None

    def take(self, calls: int) -> list[Callable[[], Any]]:
        self._block = [self._inputs() for _ in range(calls)]
        return [self._bind(inputs, slot) for slot, (inputs, _) in enumerate(self._block)]

    def _spot(self, inputs: dict[str, np.ndarray], out: Any) -> Spot:
        assert self._reader is not None
        rows = np.sort(self._picks.choice(self._tokens, size=min(SPOT_TOKENS, self._tokens), replace=False))
        x, dy = (inputs[k].reshape(self._tokens, -1)[rows] for k in ("x", "dy"))
        try:
            arrays = self._reader.arrays(out)
        except TypeError as exc:
            return Spot(self.calls, rows, x, dy, {}, str(exc))
        widths = {"y": dy.shape[-1], "dx": x.shape[-1]}
        got = {
            k: [
                self._reader.rows(a, rows)
                for a in arrays
                if len(a.shape) and a.shape[-1] == n and math.prod(a.shape) == self._tokens * n
            ]
            for k, n in widths.items()
        }
        experts = None
        if self._top_k:  # a MoE step's routing: its [T, k] array
            shape = (self._tokens, self._top_k)
            experts = next((self._reader.rows(a, rows) for a in arrays if tuple(a.shape) == shape), None)
        return Spot(self.calls, rows, x, dy, got, routing=experts)

    def done(self, outputs: list[Any]) -> None:
        for (inputs, order), out in zip(self._block, outputs, strict=True):
            if self._reader is not None:
                self.spots.append(self._spot(inputs, out))
                if len(self.spots) >= SPOT_BATCH:
                    self.flush()
            if order is not None:
                copies = read_copies(self._prepared, out, f"{self._name} on the harness's inputs")
                # held until the case's reference exists: a large tensor on disk (a Llama 3 8B layer's weight
                # gradients: 0.35 GB a backend in bfloat16), read back a block at a time by the gate
                self._call = Call(order, [(d, datacache.spill(fresh.compact(t))) for d, t in copies])
            self.calls += 1
        self._block = []

    def flush(self) -> None:
        """Judge the spots gathered so far into :attr:`tally` (outside the timed window: between two blocks, or at
        the end)."""
        self.tally.add(self.spots, self._case, self._mode)
        self.spots = []

    def judged(self, sync: Callable[[Any], None] | None = None) -> list[Call]:
        """The draw's call, read at its return. With ``sync``, a feed that has not made it yet (an untimed step, a
        timing cut short) makes it now, outside any timing: how an untimed step is judged on these inputs."""
        if self._call is None and sync is not None:
            self._draw_at = self._taken
            outs = [self.take(1)[0]()]
            sync(outs)
            self.done(outs)
        self.flush()
        return [] if self._call is None else [self._call]


def harness_sync(spec: BackendSpec, prepared: Prepared) -> Callable[[Any], None]:
    """The sync the harness ends every call with: the step's own, then its framework's device-wide one
    (``compare.backends.registry.output_reader``: every CUDA stream; every array of a JAX pytree), so a step whose
    own sync returns early is still waited for. A tensor-parallel step keeps its own (it ends with a barrier)."""
    if prepared.tp is not None:
        return prepared.sync
    device_wide = output_reader(spec.framework).sync
    own = prepared.sync  # not ``prepared``: the harness releases the step while its sync may stay referenced

    def sync(outputs: Any) -> None:
        own(outputs)
        device_wide(outputs)

    return sync


#: A spot's error above this share of its rows' largest ``|reference|`` fails the call (:func:`judge_spots`). An honest
#: step's worst row error is a few units of the dtype's rounding (bfloat16: 2^-8 of a row's scale, a few times that
#: through its intermediates); another input's answer (a stale output) is about the row's own size off, zeros 1.
SPOT_RTOL = 0.125
#: Failing calls named in a cell's reasons; the rest are counted.
SPOT_NAMED = 3


#: Spots judged together as a feed gathers them (:class:`SpotTally`): its memory stays that of a batch, whatever the
#: number of calls (a step that returns a stored answer makes a million calls in a second).
SPOT_BATCH = 512


def _spot_routing(
    spots: Sequence[Spot], case: Case, params: dict[str, np.ndarray]
) -> tuple[np.ndarray | None, list[str]]:
    """A MoE case's spots' experts, all rows in one ``[K, k]`` (``compare.gate.routing``'s rule: the rows of a spot
    whose routing is missing or a wrong router's take the golden's, and that spot fails with the reason), and per
    spot the reason or ``""``. ``(None, ["", ...])`` for any other case."""
    if not is_moe(case.model):
        return None, [""] * len(spots)
    spec = moe.MOE_SPECS[case.model]
    rows, why = [], []
    for s in spots:
        gold, bad = routing.check_rows(case, params, s.x, s.routing)
        if s.routing is None:
            bad = [f"no array of the routing's shape [T, {spec.top_k}] among its outputs"]
        rows.append(gold if bad or s.routing is None else np.rint(s.routing).astype(np.int64))
        why.append(f"tokens {s.rows.tolist()}: {bad[0]}" if bad else "")
    return np.concatenate(rows), why


def spot_failures(spots: Sequence[Spot], case: Case, mode: str) -> list[str]:
    """Per failing call of ``spots``, why: each spot against the float64 reference of its rows
    (``compare.gate.fresh.token_reference``, all spots in one computation; a MoE step's of the experts it chose
    where they are routable, ``compare.gate.routing``, else the call fails as a wrong router's). A tensor the mode
    checks (``y``, ``dx``) fails a call when no returned array of its shape is within :data:`SPOT_RTOL` of the
    reference on every spot row whose reference the dtype can hold; an output that could not be read fails it too."""
    if not spots:
        return []
    want = [k for k in ("y", "dx") if MODE_TENSORS[mode](k)]
    x = np.concatenate([s.x for s in spots])[None]
    dy = np.concatenate([s.dy for s in spots])[None] if "dx" in want else None
    params = golden_for(case).params
    chosen, wrong = _spot_routing(spots, case, params)
    ref = fresh.token_reference(case, params, x, dy, chosen)
    failed: list[str] = []
    start = 0
    for s, bad in zip(spots, wrong, strict=True):
        k = len(s.rows)
        why = s.error or bad
        for name in want if not why else ():
            r = ref[name].reshape(-1, ref[name].shape[-1])[start : start + k]
            scale = np.max(np.abs(r), axis=1)
            usable = np.isfinite(scale) & (scale > 0) & (scale <= DTYPE_MAX[case.dtype])
            if not usable.any():
                continue
            if not s.got.get(name):
                why = f"no array of {name}'s shape [T, {r.shape[-1]}] among its outputs"
                break
            with np.errstate(invalid="ignore"):
                errs = [np.max(np.max(np.abs(c - r), axis=1)[usable] / scale[usable]) for c in s.got[name]]
            err = min((e if np.isfinite(e) else np.inf) for e in errs)
            if err > SPOT_RTOL:
                why = (
                    f"{name} of tokens {s.rows.tolist()} as returned is {err:.3g} x its largest |value| from the "
                    f"float64 reference (line {SPOT_RTOL:g})"
                )
                break
        start += k
        if why:
            failed.append(f"call {s.call + 1}: {why}")
    return failed


@dataclass
class SpotTally:
    """The every-call check of one cell so far: calls checked, calls failed, and the first :data:`SPOT_NAMED`
    failures' reasons."""

    checked: int = 0
    failed: int = 0
    named: list[str] = field(default_factory=list)

    def add(self, spots: Sequence[Spot], case: Case, mode: str) -> None:
        found = spot_failures(spots, case, mode)
        self.checked, self.failed = self.checked + len(spots), self.failed + len(found)
        self.named += found[: SPOT_NAMED - len(self.named)]

    def result(self) -> tuple[int, list[str]]:
        """``(calls checked, failures)``: one failure line naming the first failing calls and counting the rest."""
        if not self.failed:
            return self.checked, []
        more = [f"and {self.failed - len(self.named)} more calls"] if self.failed > len(self.named) else []
        named = "; ".join(self.named + more)
        return self.checked, [f"{self.failed} of {self.checked} calls checked at return fail: {named}"]


def judge_spots(spots: Sequence[Spot], case: Case, mode: str) -> tuple[int, list[str]]:
    """:class:`SpotTally`'s result on ``spots`` judged at once."""
    tally = SpotTally()
    tally.add(spots, case, mode)
    return tally.result()


def _in_draw_order(tensors: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """A call's outputs put back in the draw's token order (``y`` and ``dx`` per token; weight gradients as they
    are), in the types they are held in (``compare.gate.fresh.compact``: the gate reads one tensor at a time in
    float64)."""
    out = {}
    for k, v in tensors.items():
        if k in ("y", "dx", routing.ROUTING):
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
    spot: tuple[int, list[str]] = (0, []),
) -> list[FreshCheck]:
    """The gate's verdict on the kept outputs of a :class:`Feed` (``made``: the calls it made) against the fresh
    draw's ``reference`` (``compare.gate.fresh.reference``: of every token or of the tokens it drew): per device
    copy, the worst of its calls' verdicts, as one :class:`~compare.gate.fresh.FreshCheck` of ``seed``, with the
    every-call check's ``(calls checked, failures)`` (:func:`judge_spots`)."""
    if not calls:
        raise RuntimeError(f"{name}: no call on the harness's inputs was kept to judge")
    want = checked(mode, reference.ref)
    per_copy: list[list[FreshCheck]] = []
    for call in calls:
        got = [(d, reference.take(_in_draw_order(t, call.order))) for d, t in call.copies]
        judged = judge_read(
            got, want, reference.plain, dtype, f"{name} on the harness's inputs", by_device, reference.draw
        )
        checks = [FreshCheck.of(seed, p, reference, judged=len(calls), made=made, spot=spot) for _, p in judged]
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
    spot: tuple[int, list[str]] = (0, []),
) -> list[CopyVerdicts]:
    """Per device copy (the same order in each: one process reads its copies in one order), its verdicts: the first
    call's (``first``) and those of the kept ``calls`` with the every-call check's ``spot`` (:func:`judge_calls`,
    :meth:`SpotTally.result`)."""
    checks = judge_calls(calls, made, reference, case.dtype, mode, seed, who(spec, mode), by_device, spot)
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
