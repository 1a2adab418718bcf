"""What a long command shows on the terminal: which cell, how many done, elapsed and estimated time left.

One :class:`Display` serves ``run`` and ``sweep``. On a terminal it draws a live ``rich`` progress bar (stderr);
elsewhere (a pipe, CI, a log file) it prints one plain line per finished cell, with the same counts and times.
Levels: ``quiet`` (nothing but problems: a cell that is not ``ok``/``skipped``), ``normal`` (one line or bar
update per cell, plus the run's notable messages) and ``verbose`` (every message, and each cell's reason).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

LEVELS: tuple[str, ...] = ("quiet", "normal", "verbose")
#: Statuses that are worth a line even when quiet.
PROBLEMS: frozenset[str] = frozenset({"deviates", "parity-fail", "implausible", "error"})


def fmt_duration(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; under a minute ``12.3s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def eta(done: int, total: int, elapsed: float, until_deadline: float | None = None) -> float | None:
    """Seconds left at the mean pace so far; None before the first cell is done. With a time budget
    (``until_deadline``: seconds to its end, ``compare.run.budget``) the run is planned to end by then, and cells
    finish in groups (a case's cells of one mode settle together: the first group's pace over-states the rest by the
    cells still to come), so the estimate is the smaller of the two while the deadline is ahead."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    pace = elapsed / done * (total - done)
    if until_deadline is not None and until_deadline > 0:
        return min(pace, until_deadline)
    return pace


def group_eta(done: int, total: int, elapsed: float, tail_s: float) -> float | None:
    """Seconds left when cells finish in groups (a case's cells of one mode settle together): the mean seconds per
    group so far (from the first group's start) times the groups left, plus ``tail_s`` for what follows the groups
    (the compile-cost sweep's part of the budget); None before the first group is done. Each group of a run is one
    case and mode, with its own golden data, plain computation and compiles, so groups are alike where cells are
    not."""
    if done <= 0:
        return None
    return elapsed / done * max(0, total - done) + tail_s


class Display:
    """Progress of ``total`` cells. Use as a context manager; call :meth:`cell` as each one finishes."""

    def __init__(
        self,
        total: int,
        level: str = "normal",
        stream: TextIO | None = None,
        live: bool | None = None,
        title: str = "cells",
        deadline: float | None = None,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown progress level {level!r}; known: {', '.join(LEVELS)}")
        self.total, self.level, self.title = total, level, title
        self.stream = stream if stream is not None else sys.stderr
        self.live = (self.stream.isatty() and level != "quiet") if live is None else live
        self.done = 0
        #: the ``time.monotonic`` value at which the run's time budget ends (None: no budget)
        self.deadline = deadline
        self._base = 0  # cells already done before this session (a resumed sweep): not part of the pace
        #: groups of cells (``plan``): how many, done, when the first started, the seconds expected after the last
        self._groups: tuple[int, Callable[[], float]] | None = None
        self._groups_done = 0
        self._groups_start: float | None = None
        self.start = time.monotonic()
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> Display:
        self.start = time.monotonic()
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._rich = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task(self.title, total=self.total or None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)
            self._rich = None

    def resume(self, done: int, total: int) -> None:
        """``done`` of ``total`` cells were finished before (a resumed sweep); the pace counts only new ones."""
        self.total, self.done, self._base = total, done, done
        if self._rich is not None:
            self._rich.update(self._task, total=total, completed=done)

    def plan(self, groups: int, tail_s: Callable[[], float] | None = None) -> None:
        """The cells finish in ``groups`` groups (:func:`group_eta`), followed by about ``tail_s()`` seconds of other
        work (asked each time: a budget's part shrinks as the run falls behind); the ETA then reads the groups'
        pace. Call :meth:`groups_begin` when the first group starts and :meth:`group_done` before a group's cells
        are reported."""
        self._groups = (groups, tail_s or (lambda: 0.0))

    def groups_begin(self) -> None:
        if self._groups_start is None:
            self._groups_start = time.monotonic()

    def group_done(self) -> None:
        self._groups_done += 1

    def _left(self, elapsed: float) -> float | None:
        if self._groups is not None and self._groups_start is not None and self._groups_done > 0:
            total, tail = self._groups
            return group_eta(self._groups_done, total, time.monotonic() - self._groups_start, tail())
        until = None if self.deadline is None else self.deadline - time.monotonic()
        return eta(self.done - self._base, self.total - self._base, elapsed, until)

    def _print(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def message(self, text: str, important: bool = False) -> None:
        """A note about the run (a case refused, ceilings being measured): shown when verbose, or if important
        and not quiet."""
        if self.level == "verbose" or (important and self.level == "normal"):
            self._print(text)

    def starting(self, label: str) -> None:
        """A cell starts: the live bar names it; verbose plain output prints it."""
        if self._rich is not None:  # the bar keeps its width: a long label is cut in the middle
            text = label if len(label) <= 44 else label[:20] + "..." + label[-21:]
            self._rich.update(self._task, description=f"{self.title}: {text}")
        elif self.level == "verbose":
            self._print(f"... {label}")

    def cell(self, label: str, status: str, reason: str = "") -> None:
        """A cell finished with ``status``."""
        self.done += 1
        elapsed = time.monotonic() - self.start
        left = self._left(elapsed)
        line = f"[{self.done}/{self.total}] {label} -> {status}  (elapsed {fmt_duration(elapsed)}" + (
            f", about {fmt_duration(left)} left)" if left else ")"
        )
        show_reason = reason and (self.level == "verbose" or status in PROBLEMS)
        if self._rich is not None:
            self._rich.update(self._task, total=self.total, completed=self.done)
            if status in PROBLEMS or self.level == "verbose":
                self._print(line + (f": {reason}" if show_reason else ""))
        elif self.level != "quiet" or status in PROBLEMS:
            self._print(line + (f": {reason}" if show_reason else ""))
