"""Exit statuses of every command, defined once, and the one wrapper that maps outcomes to them.

A crash must never look like a verdict: a finding (1) is only ever returned by a command that finished its work;
bad input (2) is refused before anything is measured; anything unexpected is an internal error (3), never 0 or 1.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterable

from compare.problem.cases import InputError
from compare.problem.golden import GoldenError
from compare.run import stop

OK = 0
FINDING = 1
BAD_INPUT = 2
INTERNAL_ERROR = 3
WRITE_FAILED = 4
INTERRUPTED = stop.INTERRUPTED

#: Set to a non-empty value to see the traceback of an internal error.
DEBUG_ENV = "FUSION_COMPARE_DEBUG"

EPILOG = f"""exit status:
  {OK}    clean: every cell ok, deviates or skipped (run, sweep; with --strict a deviation is a finding);
       no regression (diff)
  {FINDING}    a finding: a parity failure (golden or fresh inputs), an implausible time or a backend error
       (run, sweep); a regression (diff)
  {BAD_INPUT}    bad input: a bad option, a missing, unreadable or invalid file, an output folder that cannot be
       written, a case too large for this machine's memory; nothing was measured; two documents that share no
       cell (diff)
  {INTERNAL_ERROR}    internal error: a bug or an unexpected failure ({DEBUG_ENV}=1 shows the traceback)
  {WRITE_FAILED}    the results could not be written (a full disk): every finished cell is in the folder's store
       (cells.jsonl, results.jsonl); free space and `python -m compare report DIR` rebuilds the rest
  {INTERRUPTED}  interrupted (Ctrl-C or SIGTERM: the cell in flight is given up, every finished one is saved; a
       second signal stops at once, with the store intact)"""


def of_statuses(statuses: Iterable[str], strict: bool = False) -> int:
    """``run``'s and ``sweep``'s status from their cells': :data:`FINDING` for a ``parity-fail``, ``implausible`` or
    ``error`` (and, with ``strict``, a ``deviates``), else :data:`OK`."""
    clean = {"ok", "skipped"} if strict else {"ok", "deviates", "skipped"}
    return OK if all(s in clean for s in statuses) else FINDING


class WriteFailed(Exception):
    """The results could not be written (``OSError`` underneath, typically ENOSPC); the message says what is kept
    and how to rebuild the rest: exit status :data:`WRITE_FAILED`."""


def exit_status(fn: Callable[[], int]) -> int:
    """Run a command and return its exit status: its own (0 or 1, or 130 if it saved an interrupted run), 2 for
    bad input, 130 for an interrupt it did not handle, 3 for anything unexpected, with one line on stderr."""
    try:
        return int(fn())
    except (InputError, GoldenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except WriteFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return WRITE_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:  # not swallowed: reported as an internal error, with the traceback on request
        debug = bool(os.environ.get(DEBUG_ENV))
        if debug:
            traceback.print_exc()
        hint = "" if debug else f" (set {DEBUG_ENV}=1 to see the traceback)"
        print(f"internal error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return INTERNAL_ERROR
