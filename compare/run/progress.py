"""What a long command shows on the terminal: what is being done now, how many cells are done, elapsed and estimated
time left.

One :class:`Display` serves ``run`` and ``sweep``. On a terminal it draws a live ``rich`` progress bar (stderr);
elsewhere (a pipe, CI, a log file) it prints plain lines, one per finished cell, with the same counts and times.
Levels: ``quiet`` (nothing but problems: a cell that is not ``ok``/``skipped``), ``normal`` (one line or bar
update per cell, plus the run's notable messages) and ``verbose`` (every message, every stage as it starts, and each
cell's reason).

A run's in-process work is announced as stages (:class:`Stage`, planned up front by :func:`run_stages`): per case
its golden reference, its plain computation and its resolution rows; per case and mode each backend's first calls
(its compile), the timing of all of them together, each one finished (profile, memory), the reference of the fresh
inputs and each cell's judging. The bar names the stage and moves with it; a plain line names a stage that has
lasted :data:`STAGE_LINE_S` (at most one line a stage: a log is not flooded), and every stage when verbose. The time
left is the planned work still to do: each stage weighed by the time its like took (the same kind of stage of a
case of the same shape and dtype: later layers of a ``--layers`` run take what the first one took), else by a rough
prior scaled by the pace of its kind so far (:meth:`Display.estimate`, :meth:`Display.left`).
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from compare.problem.cases import Case

LEVELS: tuple[str, ...] = ("quiet", "normal", "verbose")
#: Statuses that are worth a line even when quiet.
PROBLEMS: frozenset[str] = frozenset({"deviates", "parity-fail", "implausible", "error"})
#: A stage that has lasted this long gets its plain line (normal level; verbose prints every stage as it starts).
STAGE_LINE_S = 2.0
#: How often the display looks at the clock between calls (the bar's position and time left, a long stage's line).
TICK_S = 0.5
#: The characters of a reason a cell's line shows at most (a failed compile's message runs to thousands).
REASON_CHARS = 200
#: The characters of a stage's name the bar shows at most (a longer one is cut in the middle).
BAR_TEXT = 60


def fmt_duration(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; under a minute ``12.3s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def short(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line (every run of whitespace one space) and at most ``limit`` characters, cut with "…"."""
    one = re.sub(r"\s+", " ", text).strip()
    return one if len(one) <= limit else one[: limit - 1].rstrip() + "…"


def eta(done: int, total: int, elapsed: float, until_deadline: float | None = None) -> float | None:
    """Seconds left at the mean pace per cell so far; None before the first cell is done (a sweep's estimate, and a
    run's where no stages were planned). With a time budget (``until_deadline``: seconds to its end,
    ``compare.run.budget``) the run is planned to end by then, so the estimate is the smaller of the two while the
    deadline is ahead."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return bounded(elapsed / done * (total - done), until_deadline)


def bounded(left: float, until_deadline: float | None) -> float:
    """``left``, or the seconds to the budget's end where that comes first while it is ahead."""
    if until_deadline is not None and until_deadline > 0:
        return min(left, until_deadline)
    return left


# --- stages --------------------------------------------------------------------------------------------------------

#: What each kind of stage is called (``{backend}``, ``{n}``: the backend, the number of backends timed together).
KINDS: dict[str, str] = {
    "golden": "golden reference",
    "plain": "plain computation",
    "resolution": "resolution rows",
    "first": "{backend}: prepare and first calls",
    "timing": "timing {n} backend{s}",
    "finish": "finishing {backend}",
    "reference": "reference of the fresh inputs",
    "judging": "judging {backend}",
}
#: The kinds of a case (the others are of a case and mode).
CASE_KINDS: frozenset[str] = frozenset({"golden", "plain", "resolution", "reference"})


@dataclass(frozen=True)
class Stage:
    """One stage of a run's work: its ``kind`` (:data:`KINDS`) for a case (``case``: its name), mode and backend;
    ``where`` names the case for a reader (``layer 3 of 24``, ``case 2 of 4``, empty for a run's only case). Stages
    of one ``key`` take alike times (the kind, backend and mode on a case of the same shape, model and dtype);
    ``prior_s`` is a rough guess of its seconds, read only until a stage of its key has been measured."""

    kind: str
    case: str
    mode: str = ""
    backend: str = ""
    where: str = ""
    n: int = 0
    key: tuple[Any, ...] = ()
    prior_s: float = 1.0

    @property
    def ident(self) -> tuple[str, str, str, str]:
        return (self.kind, self.case, self.mode, self.backend)

    @property
    def text(self) -> str:
        what = KINDS.get(self.kind, self.kind).format(backend=self.backend, n=self.n, s="" if self.n == 1 else "s")
        where = " ".join(w for w in (self.where, self.mode) if w)
        return f"{where}: {what}" if where else what


def _flops(case: Case, mode: str) -> float:
    """The GEMM FLOPs of one step of ``case`` in ``mode``, roughly (2 x tokens x every matrix's elements; a backward
    twice a forward): what the priors scale with."""
    tokens = case.shape.batch * case.shape.seq
    weights = sum(math.prod(s) for s in case.weight_shapes().values() if len(s) >= 2)
    return 2.0 * tokens * weights * {"fwd": 1, "bwd": 2}.get(mode, 3)


#: Backends whose first calls compile (by a word in the name): their first calls' prior is longer.
COMPILING: tuple[str, ...] = ("compile", "xla", "jax", "triton", "jit", "flax")


def run_stages(
    cells: Iterable[tuple[Case, str, str]],
    *,
    timing_s: float = 1.0,
    profile: bool = False,
    memory: bool = False,
    cold: bool = False,
) -> list[Stage]:
    """The stages of a run's in-process cells, ``(case, mode, backend)`` in the order they run (a case's modes and a
    mode's backends together), in the order the harness (``compare.run.harness.Groups``) goes through them, with
    their priors: the float64 references at about 0.2 GFLOP/s, the plain computation at 0.5, a first call's compile
    1 s (10 s for a compiling backend), ``timing_s`` a timed backend (twice that with cold samples)."""
    order: dict[Case, dict[str, list[str]]] = {}
    for case, mode, backend in cells:
        backends = order.setdefault(case, {}).setdefault(mode, [])
        if backend not in backends:
            backends.append(backend)
    cases = list(order)
    layers = {c.layer for c in cases}
    dtypes = {c.dtype for c in cases}
    stages: list[Stage] = []
    for i, case in enumerate(cases, 1):
        if None not in layers:
            where = f"layer {case.layer} of {len(layers)}" + (f" {case.dtype}" if len(dtypes) > 1 else "")
        else:
            where = f"case {i} of {len(cases)}" if len(cases) > 1 else ""
        s = case.shape
        like = (case.model, s.batch, s.seq, s.dim, s.hidden, case.dtype, case.module.tag if case.module else "")
        modes = order[case]
        backward = any(m != "fwd" for m in modes)
        whole = _flops(case, "fwd+bwd" if backward else "fwd")

        def stage(kind: str, prior_s: float, mode: str = "", backend: str = "", n: int = 0) -> Stage:
            key = (kind, backend, mode, backward if kind in CASE_KINDS else n, *like)  # noqa: B023
            return Stage(kind, case.name, mode, backend, where, n, key, prior_s)  # noqa: B023

        stages += [stage("golden", 1.0 + whole / 2e8), stage("plain", 0.5 + whole / 5e8)]
        stages.append(stage("resolution", 0.5 + whole / 1e9))
        for j, (mode, backends) in enumerate(modes.items()):
            step = _flops(case, mode)
            for b in backends:
                compile_s = 10.0 if any(w in b for w in COMPILING) else 1.0
                stages.append(stage("first", compile_s + 3 * step / 1e10, mode, b))
            timing = 0.5 + len(backends) * timing_s * (3.0 if cold else 1.5)
            stages.append(stage("timing", timing, mode, n=len(backends)))
            extra = (5 if profile else 0) + (3 if memory else 0)
            stages += [stage("finish", 0.1 + extra * (0.5 + step / 1e10), mode, b) for b in backends]
            if j == 0:  # made once per case, when its first mode settles
                stages.append(stage("reference", 1.0 + whole / 2e8))
            stages += [stage("judging", 0.2 + step / 1e10, mode, b) for b in backends]
    return stages


# --- the display ---------------------------------------------------------------------------------------------------


class Display:
    """Progress of ``total`` cells. Use as a context manager; call :meth:`stage` as each planned stage begins
    (:meth:`expect`) and :meth:`cell` as each cell finishes. ``clock`` is the time it reads (a test's fake one);
    ``tick_s`` how often a thread of its own looks at it between calls, on a live bar and in a plain log of planned
    stages (None: no thread, :meth:`tick` is called by hand)."""

    def __init__(
        self,
        total: int,
        level: str = "normal",
        stream: TextIO | None = None,
        live: bool | None = None,
        title: str = "cells",
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float | None = TICK_S,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown progress level {level!r}; known: {', '.join(LEVELS)}")
        self.total, self.level, self.title = total, level, title
        self.stream = stream if stream is not None else sys.stderr
        self.live = (self.stream.isatty() and level != "quiet") if live is None else live
        self.done = 0
        #: the ``clock`` value at which the run's time budget ends (None: no budget)
        self.deadline = deadline
        self.clock, self.tick_s = clock, tick_s
        self._base = 0  # cells already done before this session (a resumed sweep): not part of the pace
        #: the seconds expected after the planned work (the compile-cost sweep's part of a budget), asked each time
        self._tail: Callable[[], float] = lambda: 0.0
        # the planned stages, the one under way (-1: none yet), when it began, whether its line was printed
        self._stages: list[Stage] = []
        self._index: dict[tuple[str, str, str, str], int] = {}
        self._cells = 0  # the cells the planned stages are of
        self._at, self._since, self._said = -1, 0.0, True
        self._open = False  # the planned stage at ``_at`` is under way (not ended, nor followed by an unplanned one)
        self._now_text = ""  # what is being done now (a stage, or an unplanned step: :meth:`starting`)
        #: the seconds the latest stage of each key took; the prior and the actual seconds of the stages measured, by
        #: kind and backend and by kind
        self._took: dict[tuple[Any, ...], float] = {}
        self._sums: dict[tuple[str, ...], list[float]] = {}
        self.start = clock()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> Display:
        self.start = self.clock()
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[cells]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[left]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task(self.title, total=None, cells=self._count(), left="")
            self._ticker()
        return self

    def _ticker(self) -> None:
        """Start the thread that calls :meth:`tick` every ``tick_s`` (once; none without ``tick_s``)."""
        if self.tick_s is not None and self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._ticking, name="progress", daemon=True)
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._rich is not None:
                self._refresh()
                self._rich.__exit__(*exc)
                self._rich = None

    def _ticking(self) -> None:
        assert self.tick_s is not None
        while not self._stop.wait(self.tick_s):
            self.tick()

    # --- what the work is ----------------------------------------------------------------------------------------

    def resume(self, done: int, total: int) -> None:
        """``done`` of ``total`` cells were finished before (a resumed sweep); the pace counts only new ones."""
        with self._lock:
            self.total, self.done, self._base = total, done, done
            self._refresh()

    def expect(self, stages: Sequence[Stage], cells: int) -> None:
        """The run's in-process work: ``stages`` (:func:`run_stages`) of ``cells`` cells, in the order they will
        begin (:meth:`stage`); the time left is read from them."""
        with self._lock:
            self._stages = list(stages)
            self._index = {s.ident: i for i, s in enumerate(self._stages)}
            self._cells, self._at, self._open = cells, -1, False
        if self.level == "normal":  # a plain log's line for a long stage (a bar's thread runs from the start)
            self._ticker()

    def after(self, tail_s: Callable[[], float]) -> None:
        """About ``tail_s()`` seconds of other work follow the stages (asked each time: a budget's part shrinks as
        the run falls behind), counted in the time left."""
        self._tail = tail_s

    # --- what is being done --------------------------------------------------------------------------------------

    def stage(self, kind: str, case: str, mode: str = "", backend: str = "") -> None:
        """A stage (:data:`KINDS`) of ``case`` (its name) begins: the one before it has ended. A planned one moves
        the plan there (a stage passed over, as a case the gate refused, is not weighed); another is only shown."""
        with self._lock:
            now = self.clock()
            self._close(now)
            i = self._index.get((kind, case, mode, backend), -1)
            if i > self._at:
                self._at, self._open, s = i, True, self._stages[i]
            else:
                s = Stage(kind, case, mode, backend, where=case)
            self._since, self._said, self._now_text = now, False, s.text
            if self._rich is not None:
                self._describe(s.text)
                self._refresh(now)
            elif self.level == "verbose":
                self._say_stage(now)

    def starting(self, label: str) -> None:
        """An unplanned step starts (a sweep's cell): the live bar names it; verbose plain output prints it."""
        with self._lock:
            self._now_text = label
            if self._rich is not None:
                self._describe(label)
            elif self.level == "verbose":
                self._print(f"... {label}")

    def _close(self, now: float) -> None:
        """The stage under way ends at ``now``: its seconds are its key's, and count in the pace."""
        if self._open:
            s, took = self._stages[self._at], max(0.0, now - self._since)
            self._took[s.key] = took
            for like in ((s.kind, s.backend), (s.kind,)):
                sums = self._sums.setdefault(like, [0.0, 0.0])
                sums[0] += s.prior_s
                sums[1] += took
            self._open = False

    def _describe(self, text: str) -> None:  # the bar keeps its width: a long name is cut in the middle
        if len(text) > BAR_TEXT:
            half = (BAR_TEXT - 3) // 2
            text = text[:half] + "..." + text[-(BAR_TEXT - 3 - half) :]
        self._rich.update(self._task, description=f"{self.title}: {text}")

    # --- the time left -------------------------------------------------------------------------------------------

    def estimate(self, s: Stage) -> float:
        """The seconds ``s`` should take: what the latest stage of its key took; else its prior at the pace of its
        kind so far (the seconds measured over the priors, of the same backend where one was measured; a reference
        read from the disk cache takes nothing, a compile of another shape its own time); else the prior."""
        took = self._took.get(s.key)
        if took is not None:
            return took
        sums = self._sums.get((s.kind, s.backend)) or self._sums.get((s.kind,))
        pace = sums[1] / sums[0] if sums and sums[0] > 0 else 1.0
        return s.prior_s * min(50.0, max(0.02, pace))

    def left(self, now: float | None = None) -> float | None:
        """Seconds left: the planned stages still to do (:meth:`estimate`), what the stage under way has left of
        its estimate, cells outside the plan (a tensor-parallel group's) at the plan's seconds per cell, and the
        work after it (:meth:`after`); None before a stage has ended. Without planned stages: the pace per cell
        (:func:`eta`). With a time budget, no later than its end while that is ahead."""
        with self._lock:
            now = self.clock() if now is None else now
            until = None if self.deadline is None else self.deadline - now
            if not self._stages or not self._sums:
                cells = eta(self.done - self._base, self.total - self._base, now - self.start)
                return None if cells is None else bounded(cells + self._tail(), until)
            ahead = self._stages[self._at + 1 :]
            left = sum(self.estimate(s) for s in ahead)
            if self._open:
                left += max(0.0, self.estimate(self._stages[self._at]) - (now - self._since))
            # the cells outside the plan: those not done less those the plan's judging stages (this one too) settle
            planned = sum(1 for s in self._stages[max(0, self._at) :] if s.kind == "judging")
            others = max(0, self.total - self.done - planned)
            if others and self._cells:
                left += others * sum(self.estimate(s) for s in self._stages) / self._cells
            return bounded(left + self._tail(), until)

    def fraction(self, now: float | None = None) -> float | None:
        """The share of the run's time that is behind it (elapsed over elapsed and left); None while unknown."""
        now = self.clock() if now is None else now
        left, elapsed = self.left(now), now - self.start
        if left is None:
            return None
        return 1.0 if elapsed + left <= 0 else elapsed / (elapsed + left)

    def _times(self, now: float) -> str:
        left = self.left(now)
        return f"(elapsed {fmt_duration(now - self.start)}" + (f", about {fmt_duration(left)} left)" if left else ")")

    def _count(self) -> str:
        return f"{self.done}/{self.total}" if self.total else str(self.done)

    def _refresh(self, now: float | None = None) -> None:
        """The bar's position, counts and time left as they stand."""
        if self._rich is None:
            return
        now = self.clock() if now is None else now
        done, left = self.fraction(now), self.left(now)
        where = {"total": 1000, "completed": round(1000 * done)} if done is not None else {}
        text = f"about {fmt_duration(left)} left" if left else ""
        self._rich.update(self._task, cells=self._count(), left=text, **where)

    def tick(self) -> None:
        """Look at the clock: the bar moves; in plain output a stage under way for :data:`STAGE_LINE_S` gets its
        line (once)."""
        with self._lock:
            now = self.clock()
            if self._rich is not None:
                self._refresh(now)
            elif self.level == "normal" and not self._said and now - self._since >= STAGE_LINE_S:
                self._say_stage(now)

    def _say_stage(self, now: float) -> None:
        self._said = True
        self._print(f"... {self._now_text}  {self._times(now)}")

    # --- lines ---------------------------------------------------------------------------------------------------

    def _print(self, text: str) -> None:
        with self._lock:
            if self._rich is not None:
                self._rich.console.print(text, markup=False, highlight=False)
            else:
                print(text, file=self.stream, flush=True)

    def message(self, text: str, important: bool = False) -> None:
        """A note about the run (a case refused, ceilings being measured): shown when verbose, or if important
        and not quiet."""
        if self.level == "verbose" or (important and self.level == "normal"):
            self._print(text)

    def cell(self, label: str, status: str, reason: str = "") -> None:
        """A cell finished with ``status``; a reason shown is cut to :data:`REASON_CHARS` (:func:`short`)."""
        with self._lock:
            self.done += 1
            now = self.clock()
            line = f"[{self._count()}] {label} -> {status}  {self._times(now)}"
            show_reason = reason and (self.level == "verbose" or status in PROBLEMS)
            line += f": {short(reason)}" if show_reason else ""
            if self._rich is not None:
                self._refresh(now)
                if status in PROBLEMS or self.level == "verbose":
                    self._print(line)
            elif self.level != "quiet" or status in PROBLEMS:
                self._print(line)
