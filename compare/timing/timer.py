"""The shared timer: the only code in the project that times a backend.

Protocol for one measurement of a zero-argument callable ``fn`` (which calls a compiled/jitted function with its
inputs as arguments) and ``sync`` (which blocks until a pytree of outputs is complete on the device):

1. first call: ``fn()`` then ``sync`` of its output, timed alone (compile + run for compiled backends);
2. warm-up calls, each synced; the fastest one sizes the sample block;
3. samples: each runs ``calls_per_sample`` calls in a row, keeps every output, then syncs all of them (so the
   outputs are consumed and asynchronous work is inside the sample), and divides by the block size. A block is
   sized to last at least ``min_sample_s`` (far above the clock's resolution). The previous block's outputs are
   released before the next starts (holding them would double a one-call block's output memory, and with it the
   allocator's page faults, a cost of the harness and not of the step);
4. at least ``min_samples`` samples, more until ``budget_s`` of sampling has passed or ``max_samples``.

Reported: median, IQR, min and max per call, ``n`` samples, the block size, and the first call apart.

**Inputs** (:class:`Feed`): the harness, not the step, owns the inputs of every call after the first. A block's
calls are taken from the feed before its clock starts, each bound to inputs no call has seen, and the block's
outputs go back to the feed after its sync, when the clock has stopped: the feed decides then, after the fact, which
outputs it judges. Without a feed (the timer's own tests, a known-cost callable) ``fn`` is called as it is.

**Interleaved** (:func:`measure_interleaved`): the backends compared on one case, dtype and mode are timed together.
Each is called first on its own (step 1); the warm-up calls then run in rounds, and they size the blocks, which
backends of about the same speed share (:func:`shared_block_sizes`: two equally fast steps must run blocks of the
same length for a round's two samples to be exchangeable); then every round runs one block of each, in an order
drawn at random for that round, until every backend has ``min_samples`` samples and then until
``budget_s`` per backend has passed (or ``max_samples`` rounds). A burst of load then lands on all of them alike,
and because the order within a round is random, a round's pair of samples of two backends that are the same is as
likely to come out one way as the other whatever the load does: the paired test of ``compare.timing.significance`` is
exact under that design. Each sample records its round; the group has an identifier unique to the run
(``Timing.group``), so samples of two runs are never paired. An entrant times its own blocks (:class:`Timed`): here
(:class:`Entrant`), or in a worker process of its own by that process's clock (``compare.run.ab``: the steps of two
interpreters or checkouts in one group), the rounds and their order decided here either way.

Across the processes of a tensor-parallel group (``agree``: an element-wise maximum over the processes), every
decision is taken together and every figure is the slowest process's: the first call, the block size, whether to
take another sample (so every process runs the same number of blocks and no collective is left unmatched) and each
sample. The caller's ``sync`` ends with a barrier, so a block ends when the slowest process is done.
"""

from __future__ import annotations

import math
import random
import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from compare.formats.codec import LATER, later

#: What a step may raise that ends its entrant alone, recorded as its outcome: any exception, and a ``SystemExit`` or
#: ``KeyboardInterrupt`` it raised itself (``sys.exit()`` in a user's module file). The caller raises a stop among the
#: outcomes again (``compare.run.stop.reraise_stop``, whose ``CODE_ERRORS`` this is).
STEP_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)

#: A result whose IQR is more than this fraction of its median is marked noisy.
NOISY_IQR_FRACTION = 0.10
CLOCK = time.perf_counter
CLOCK_RESOLUTION_S = time.get_clock_info("perf_counter").resolution
#: How a timing's samples were taken: in its own window of time, in rounds with the other backends of its group
#: (warm caches), or in rounds of single calls each after a last-level cache flush (``cold``, :func:`measure_cold`).
CONTIGUOUS, INTERLEAVED, COLD = "contiguous", "interleaved", "cold"


class Feed(Protocol):
    """The inputs of a timed step, owned by the harness (``compare.run.pipeline.Feed``): ``take(calls)`` returns the
    zero-argument steps of one block's ``calls`` calls, each bound to inputs no call has seen (made before the clock
    starts); ``done(outputs)`` receives the block's outputs once they are synced and the clock has stopped."""

    def take(self, calls: int) -> list[Callable[[], Any]]: ...

    def done(self, outputs: list[Any]) -> None: ...


class Watch(Protocol):
    """Told of every timed block of an interleaved or cold timing (``compare.timing.nvml``'s device telemetry): the
    entrant, its block's ``perf_counter`` start and end, and its calls; ``stop`` returns one JSON record per
    entrant (None for one without a block). Its own work must not run inside a block (a sampling thread does)."""

    def start(self, entrants: int) -> None: ...

    def block(self, entrant: int, start_s: float, end_s: float, calls: int) -> None: ...

    def stop(self) -> list[dict[str, Any] | None]: ...


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of one (backend, case, mode). ``samples_s`` are per-call times of each sample."""

    median_s: float
    iqr_s: float
    min_s: float
    max_s: float
    n: int
    calls_per_sample: int
    first_call_s: float
    warmup_calls: int
    samples_s: tuple[float, ...]
    #: ``contiguous`` (one window of time) or ``interleaved`` (rounds with the rest of ``group``)
    design: str = field(default=CONTIGUOUS, metadata=LATER)
    #: interleaved only: the run-unique identifier of the group timed together, and each sample's round (left out of
    #: a contiguous timing's JSON, whose layout is as it always was)
    group: str = field(default="", metadata=later("design"))
    rounds: tuple[int, ...] = field(default=(), metadata=later("design"))
    #: written after the fields (``compare.formats.codec``)
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("noisy",)

    def __post_init__(self) -> None:
        """A document's timing is refused where its lists disagree (every reader zips them: a hand-edited or torn
        ``ab.json`` was an internal error in ``export``, ``diff`` and ``report``)."""
        if self.rounds and len(self.rounds) != len(self.samples_s):
            raise ValueError(f"rounds has {len(self.rounds)} items but samples_s has {len(self.samples_s)}")

    @property
    def noisy(self) -> bool:
        return self.iqr_s > NOISY_IQR_FRACTION * self.median_s

    @staticmethod
    def json_fill(d: Mapping[str, Any]) -> dict[str, Any]:
        """What a record of ``median_s`` and ``iqr_s`` alone (a shape-sweep row, an older file) takes for the rest
        (``compare.formats.codec``): ``min_s = max_s = median_s``, ``n`` its samples, one call per sample, no
        warm-up and a NaN first call."""
        samples, median = d.get("samples_s"), d.get("median_s")
        n = len(samples) if isinstance(samples, list | tuple) else 0
        return dict(min_s=median, max_s=median, n=n, calls_per_sample=1, first_call_s=math.nan, warmup_calls=0)


@dataclass(frozen=True)
class TimingConfig:
    """The shared timer's settings for a run (see :func:`measure`); stored in ``config.timing``."""

    warmup: int = 3
    #: 10: the paired test of ``compare.timing.significance`` can reach p < 0.01 only from 8 rounds on (2^-7 < 0.01)
    min_samples: int = 10
    max_samples: int = 100
    budget_s: float = 1.0
    min_sample_s: float = 2e-3


#: A block makes at most this many calls. Every call on a feed gets inputs of its own, made before the block's clock
#: starts and held until it stops, so a block's inputs take its calls times one call's: a step of 0.1 us (one that
#: returns a stored answer) would make 20,000 calls a 2 ms block, with 1.7 GB of ``tiny``'s inputs. A real step
#: takes longer than a block of this many calls allows (2 us a call at 2 ms blocks: less than reading ``tiny``'s
#: inputs once), so only such a step gets shorter blocks, still 1e4 clock ticks and more.
MAX_BLOCK_CALLS = 1000


def _block_calls(min_sample_s: float, per_call_s: float) -> int:
    """Calls for a block of ``min_sample_s`` at ``per_call_s`` a call, between 1 and :data:`MAX_BLOCK_CALLS`."""
    return min(MAX_BLOCK_CALLS, max(1, math.ceil(min_sample_s / max(per_call_s, CLOCK_RESOLUTION_S))))


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) with linear interpolation (``statistics.quantiles`` 'inclusive')."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def _timed_block(
    fn: Callable[[], Any],
    sync: Callable[[Any], None],
    calls: int,
    feed: Feed | None = None,
    before: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """``calls`` calls in a row and one sync of all their outputs: the clock at its start and end. With a ``feed``
    the calls are the feed's (taken before the clock starts, and before ``before``: a last-level cache flush then
    evicts the inputs the feed wrote too) and the outputs go back to it after the clock stops; none is held once the
    block returns."""
    fns = feed.take(calls) if feed is not None else [fn] * calls
    if before is not None:
        before()
    t0 = CLOCK()
    outs = [f() for f in fns]
    sync(outs)
    t1 = CLOCK()
    if feed is not None:
        feed.done(outs)
    return t0, t1


def _run_block(fn: Callable[[], Any], sync: Callable[[Any], None], calls: int, feed: Feed | None = None) -> float:
    """Seconds for ``calls`` calls in a row and one sync of all their outputs (:func:`_timed_block`)."""
    t0, t1 = _timed_block(fn, sync, calls, feed)
    return t1 - t0


def _checked(min_samples: int, warmup: int, min_sample_s: float) -> float:
    """Refuse settings a warm timing cannot work with; the block length, at least 1e4 clock ticks."""
    if min_samples < 5:
        raise ValueError(f"min_samples must be at least 5, got {min_samples}")
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 (it sizes the sample block), got {warmup}")
    return max(min_sample_s, 1e4 * CLOCK_RESOLUTION_S)


def first_call(fn: Callable[[], Any], sync: Callable[[Any], None]) -> tuple[float, Any]:
    """Time the first call alone (compile + run for compiled backends); return (seconds, its output)."""
    t0 = CLOCK()
    out = fn()
    sync([out])
    return CLOCK() - t0, out


def measure(
    fn: Callable[[], Any],
    sync: Callable[[Any], None],
    *,
    first_call_s: float | None = None,
    warmup: int = 3,
    min_samples: int = 5,
    max_samples: int = 100,
    budget_s: float = 1.0,
    min_sample_s: float = 2e-3,
    feed: Feed | None = None,
    agree: Callable[[Sequence[float]], list[float]] | None = None,
) -> Timing:
    """Time ``fn`` following the module protocol. ``sync(outputs)`` must block until all are complete.

    Pass ``first_call_s`` when the caller already made (and timed, with :func:`first_call`) the first call.
    ``feed`` (:class:`Feed`) supplies the inputs of every call after the first and is handed every block's outputs
    (the harness judges some of them, chosen after the fact). ``agree`` makes the
    measurement collective over a group of processes (module docstring); every process must pass the same arguments.
    """
    min_sample_s = _checked(min_samples, warmup, min_sample_s)
    together = agree if agree is not None else list
    first = first_call(fn, sync)[0] if first_call_s is None else first_call_s
    fastest = float("inf")
    for _ in range(warmup):
        fastest = min(fastest, _run_block(fn, sync, 1, feed))
    first, fastest = together([first, fastest])
    calls = _block_calls(min_sample_s, fastest)
    samples: list[float] = []
    start = CLOCK()
    more = True
    while more:
        samples.append(_run_block(fn, sync, calls, feed) / calls)
        wanted = len(samples) < min_samples or (CLOCK() - start < budget_s and len(samples) < max_samples)
        more = together([1.0 if wanted else 0.0])[0] > 0.0
    return _timing(together(samples), calls, first, warmup, CONTIGUOUS, "", [])


class Timed(Protocol):
    """An entrant of a group as the rounds see it (:func:`measure_interleaved`, :func:`measure_cold`): its first
    call's seconds and ``block(calls, before)``, one block of ``calls`` calls timed where the step runs, by that
    process's own clock (``before`` runs ahead of it, outside its time): the clock at the block's start and end.
    :class:`Entrant` runs its block here; ``compare.run.ab``'s entrants run theirs in a worker process, so the
    coordinator decides the rounds and their order and never times across a pipe."""

    @property
    def first_call_s(self) -> float: ...

    def block(self, calls: int, before: Callable[[], None] | None = None) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Entrant:
    """One backend of an interleaved group: its step, its sync, its first call's seconds (already made) and the
    :class:`Feed` of its inputs (None: ``fn`` as it is)."""

    fn: Callable[[], Any]
    sync: Callable[[Any], None]
    first_call_s: float
    feed: Feed | None = None

    def block(self, calls: int, before: Callable[[], None] | None = None) -> tuple[float, float]:
        """One timed block of ``calls`` calls here (:func:`_timed_block`): the clock at its start and end."""
        return _timed_block(self.fn, self.sync, calls, self.feed, before)


def new_group_id(label: str) -> str:
    """A group identifier unique to this run (``label`` plus a random token): samples of two runs never pair."""
    return f"{label}#{secrets.token_hex(4)}"


def shared_block_sizes(needed: Sequence[int]) -> list[int]:
    """Calls per block of each entrant of a group, from the calls each needs to fill ``min_sample_s``: entrants
    whose needs lie within a factor of 2 of the largest of them share that largest one, and so on down.

    Why: the paired test is exact only if a round's two samples of equally fast steps are exchangeable, and two
    blocks of different lengths are not (under bursty load a short block is more often wholly fast or wholly slow;
    the medians of the two then differ by the load's pattern, not the steps'). The needs are measured, so noisy (9
    and 10 calls for the same step under a busy core); with blocks sized each on its own the A/A control called the
    same backend different in 12 of 120 trials here, against a nominal 2%. Steps more than 2x apart in speed keep
    their own sizes: no block is more than twice as long as its entrant needs."""
    out = list(needed)
    todo = sorted(range(len(out)), key=lambda i: -needed[i])
    while todo:
        top = needed[todo[0]]
        share = [i for i in todo if 2 * needed[i] >= top]
        for i in share:
            out[i] = top
        todo = [i for i in todo if i not in share]
    return out


def _shuffled(items: list[int], rng: random.Random) -> list[int]:
    rng.shuffle(items)
    return items


def _sized_blocks(
    entrants: Sequence[Timed],
    outcome: list[BaseException | None],
    warm: list[float],
    min_sample_s: float,
    rng: random.Random,
) -> list[int]:
    """Each entrant's calls per block: blocks of 1, 2, 4, ... calls, in rounds, until one lasts ``min_sample_s`` and
    its per-call time is within 30% of the fastest before it; that per-call time (the fastest seen) sizes the block,
    and entrants of about the same speed then share a size (:func:`shared_block_sizes`). Single calls would not do:
    under a busy core each call of a fast step can pay a thread's wake-up of about a block's length (here: all 8
    single calls of a 0.2 ms step took over 2 ms, and its blocks were sized one call long against its twin's 13),
    which a longer block pays once. A step whose fastest warm-up call (``warm``) and first sizing call were both over
    10 blocks long is sized by them (a stall of that length was seen too, once in 48 trials). Costs about two blocks."""
    n = len(entrants)
    size, per_call, done = [1] * n, list(warm), [False] * n
    while True:
        todo = [i for i in range(n) if outcome[i] is None and not done[i]]
        if not todo:
            break
        for i in _shuffled(todo, rng):
            try:
                t0, t1 = entrants[i].block(size[i])
                seconds = t1 - t0
            except STEP_ERRORS as exc:  # this entrant's failure, recorded as its outcome
                outcome[i] = exc
                continue
            this = seconds / size[i]
            # long enough, and the per-call time no longer falls much as blocks grow (a stall is amortised); a step
            # far slower than a block is sized by one call
            settled = this >= 0.7 * per_call[i] or min(seconds, warm[i]) >= 10 * min_sample_s
            per_call[i] = min(per_call[i], this)
            if (seconds >= min_sample_s and settled) or size[i] >= MAX_BLOCK_CALLS:
                done[i] = True
            else:
                size[i] *= 2
    needed = [_block_calls(min_sample_s, t) if math.isfinite(t) else 1 for t in per_call]
    return shared_block_sizes(needed)


def _timing(
    samples: list[float], calls: int, first_s: float, warmup: int, design: str, group: str, rounds: list[int]
) -> Timing:
    """The :class:`Timing` of per-call ``samples``: contiguous, or of one entrant of a group timed in rounds."""
    q1, med, q3 = quartiles(samples)
    return Timing(
        median_s=med,
        iqr_s=q3 - q1,
        min_s=min(samples),
        max_s=max(samples),
        n=len(samples),
        calls_per_sample=calls,
        first_call_s=first_s,
        warmup_calls=warmup,
        samples_s=tuple(samples),
        design=design,
        group=group,
        rounds=tuple(rounds),
    )


def _rounds(
    entrants: Sequence[Timed],
    calls: list[int],
    outcome: list[BaseException | None],
    rng: random.Random,
    watch: Watch | None,
    min_samples: int,
    max_samples: int,
    budget_s: float,
    before: Callable[[], None] | None = None,
) -> tuple[list[list[float]], list[list[int]]]:
    """The sampling rounds of a group (interleaved or cold): per round, one block of ``calls[i]`` calls of every
    entrant still in, in an order drawn from ``rng`` (``before`` runs ahead of each block, outside its time), until
    each has ``min_samples`` samples, then while the rounds stay under ``budget_s`` per entrant and ``max_samples``.
    An entrant whose block raises (its step, or ``before``, named by its type) has the exception as its ``outcome``
    and leaves the rotation. Per entrant: its per-call samples and each one's round."""
    n = len(entrants)
    samples: list[list[float]] = [[] for _ in range(n)]
    rounds: list[list[int]] = [[] for _ in range(n)]
    start = CLOCK()
    r = 0
    if watch is not None:
        watch.start(n)
    while True:
        live = [i for i in range(n) if outcome[i] is None]
        if not live:
            break
        enough = all(len(samples[i]) >= min_samples for i in live)
        if enough and (CLOCK() - start >= budget_s * len(live) or r >= max_samples):
            break
        for i in _shuffled(live, rng):
            try:
                t0, t1 = entrants[i].block(calls[i], before)
            except STEP_ERRORS as exc:  # this entrant's failure, recorded as its outcome
                outcome[i] = exc
                continue
            samples[i].append((t1 - t0) / calls[i])
            rounds[i].append(r)
            if watch is not None:
                watch.block(i, t0, t1, calls[i])
        r += 1
    return samples, rounds


def measure_interleaved(
    entrants: Sequence[Timed],
    *,
    group: str,
    warmup: int = 3,
    min_samples: int = 10,
    max_samples: int = 100,
    budget_s: float = 1.0,
    min_sample_s: float = 2e-3,
    seed: int = 0,
    watch: Watch | None = None,
) -> list[Timing | BaseException]:
    """Time ``entrants`` together, in rounds (module docstring): per entrant, its :class:`Timing` (design
    ``interleaved``, ``group``, each sample's round), or the exception its
    step raised (it leaves the rotation; the others go on). ``seed`` draws the orders (any fixed value keeps the
    test exact: what matters is that the order does not depend on the load). ``budget_s`` is per entrant.
    ``watch`` (:class:`Watch`) is told of every timed block; the caller reads its records with ``watch.stop()``."""
    min_sample_s = _checked(min_samples, warmup, min_sample_s)
    n = len(entrants)
    outcome: list[BaseException | None] = [None] * n
    rng = random.Random(seed)
    warm = [math.inf] * n  # each entrant's fastest warm-up call
    for _ in range(warmup):  # warm-up in rounds, so that what follows starts from a steady state for all
        for i in _shuffled([i for i in range(n) if outcome[i] is None], rng):
            try:
                t0, t1 = entrants[i].block(1)
                warm[i] = min(warm[i], t1 - t0)
            except STEP_ERRORS as exc:  # this entrant's failure, recorded as its outcome
                outcome[i] = exc
    calls = _sized_blocks(entrants, outcome, warm, min_sample_s, rng)
    samples, rounds = _rounds(entrants, calls, outcome, rng, watch, min_samples, max_samples, budget_s)
    return [
        err
        if (err := outcome[i]) is not None
        else _timing(samples[i], calls[i], e.first_call_s, warmup, INTERLEAVED, group, rounds[i])
        for i, e in enumerate(entrants)
    ]


def measure_cold(
    entrants: Sequence[Timed],
    flush: Callable[[], None],
    *,
    group: str,
    min_samples: int = 5,
    max_samples: int = 50,
    budget_s: float = 1.0,
    seed: int = 0,
    watch: Watch | None = None,
) -> list[Timing | BaseException]:
    """Cold-cache timings of ``entrants`` (already warmed up: call this after :func:`measure_interleaved`), in rounds
    as there: each round runs every entrant once, in an order drawn for the round, and each sample is **one** call
    right after ``flush()`` (``compare.timing.llc``: it evicts the last-level cache and syncs; its time is outside
    the sample), synced on its own. A block of several calls would time the second call warm, so a cold sample is one
    call, and a step much shorter than a sync is dominated by it (the warm timing amortises it over its block).

    At least ``min_samples`` rounds, then more while the rounds' time (flushes included) stays under ``budget_s`` per
    entrant and under ``max_samples``. Per entrant its :class:`Timing` (design ``cold``, ``group``, each sample's
    round; ``first_call_s`` its entrant's, ``warmup_calls`` 0: the warm timing before it warmed it up), or the
    exception its step raised."""
    if min_samples < 1:
        raise ValueError(f"min_samples must be at least 1, got {min_samples}")
    outcome: list[BaseException | None] = [None] * len(entrants)
    calls = [1] * len(entrants)
    rng = random.Random(seed)
    samples, rounds = _rounds(entrants, calls, outcome, rng, watch, min_samples, max_samples, budget_s, flush)
    return [
        err if (err := outcome[i]) is not None else _timing(samples[i], 1, e.first_call_s, 0, COLD, group, rounds[i])
        for i, e in enumerate(entrants)
    ]
