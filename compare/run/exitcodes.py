"""Exit statuses of every command, defined once, and the one wrapper that maps outcomes to them.

A crash must never look like a verdict: a finding (1) is only ever returned by a command that finished its work;
bad input (2) is refused before anything is measured; anything unexpected is an internal error (3), never 0 or 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

from compare.problem.cases import InputError
from compare.problem.golden import GoldenError

OK = 0
FINDING = 1
BAD_INPUT = 2
INTERNAL_ERROR = 3
INTERRUPTED = 130

#: Set to a non-empty value to see the traceback of an internal error.
DEBUG_ENV = "FUSION_COMPARE_DEBUG"

EPILOG = f"""exit status:
  {OK}    clean: every cell ok, deviates or skipped (run, sweep; with --strict a deviation is a finding);
       no regression (diff)
  {FINDING}    a finding: a parity failure (golden or fresh inputs), an implausible time or a backend error
       (run, sweep); a regression (diff)
  {BAD_INPUT}    bad input: a bad option, a missing, unreadable or invalid file, an output folder that cannot be
       written, a case too large for this machine's memory; nothing was measured
  {INTERNAL_ERROR}    internal error: a bug or an unexpected failure ({DEBUG_ENV}=1 shows the traceback)
  {INTERRUPTED}  interrupted (Ctrl-C; SIGTERM for run and sweep): the cells finished so far are saved"""


def of_statuses(statuses: Iterable[str], strict: bool = False) -> int:
    """``run``'s and ``sweep``'s status from their cells': :data:`FINDING` for a ``parity-fail``, ``implausible`` or
    ``error`` (and, with ``strict``, a ``deviates``), else :data:`OK`."""
    clean = {"ok", "skipped"} if strict else {"ok", "deviates", "skipped"}
    return OK if all(s in clean for s in statuses) else FINDING


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program was, so that it unwinds exactly as after Ctrl-C (workers killed, partial
    results saved)."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated`; the previous handler is restored on the way out.

    Only the main thread can install signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(f"received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_status(fn: Callable[[], int]) -> int:
    """Run a command and return its exit status: its own (0 or 1, or 130 if it saved an interrupted run), 2 for
    bad input, 130 for an interrupt it did not handle, 3 for anything unexpected, with one line on stderr."""
    try:
        return int(fn())
    except (InputError, GoldenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:  # not swallowed: reported as an internal error, with the traceback on request
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
            print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            print(
                f"internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 to see the traceback)", file=sys.stderr
            )
        return INTERNAL_ERROR
