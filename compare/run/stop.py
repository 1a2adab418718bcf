"""Stopping on a signal without raising into whatever happens to run: SIGINT and SIGTERM set a flag, and the
commands' loops look at it between cells (:func:`check`).

Python's own SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is: inside an import (JAX's
loading, where it crashed the process with SIGSEGV or SIGABRT), inside a foreign callback (where XLA swallowed it:
"Exception ignored in _xla_gc_callback" and a run that exited 0). Under :func:`on_signals` neither signal raises:

- the first one records its name and says on stderr what happens next; the commands' loops call :func:`check`,
  which raises :class:`Stopped` (a ``KeyboardInterrupt``: worker groups ended, finished cells kept) where nothing
  foreign is on the stack; the cell in flight is given up, never half-stored;
- a second one ends the process at once (status 130) after killing every child process group still running
  (:func:`track`): the store of finished cells is intact, only the summary files are not rewritten (``python -m
  compare report DIR`` rebuilds them).

This module imports nothing of the tool and only the standard library's lightest modules: ``python -m compare``
installs its handlers (:func:`install`) before anything else loads. What no handler covers: a signal before the
interpreter has run the tool's first line (Python's own handler is in place then).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

#: The exit status of an interrupted command (``compare.run.exitcodes`` reads it from here: this module stays free
#: of the imports behind exit codes, so ``python -m compare`` can set the handlers before they load).
INTERRUPTED = 130

_requested: str | None = None
#: The child processes started (``subprocess.Popen``), by pid, each the leader of its own process group.
_children: dict[int, Any] = {}


def track(proc: Any) -> None:
    """Remember a started child (a ``subprocess.Popen`` leading its own process group) for the second signal."""
    _children[proc.pid] = proc


def live() -> list[int]:
    """The process groups of the tracked children not yet seen to exit."""
    for pid, proc in list(_children.items()):
        if proc.returncode is not None:
            _children.pop(pid, None)
    return list(_children)


class Stopped(KeyboardInterrupt):
    """Raised by :func:`check` once a signal has asked the command to stop."""


#: What the tool catches around code that is not its own (a backend's, a user's module file): any exception, and a
#: ``SystemExit`` or ``KeyboardInterrupt`` that code raised itself (``sys.exit()`` in a module file), which is that
#: code's failure and never the tool's exit status. Each such ``except`` calls :func:`reraise_stop` first.
CODE_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)


def reraise_stop(exc: BaseException) -> None:
    """Raise ``exc`` again where it is a stop rather than the failure of the code it came out of (:data:`CODE_ERRORS`):
    a :class:`Stopped`, or a ``KeyboardInterrupt`` while SIGINT is Python's own (a Ctrl-C in the Python API, not the
    code's). Under :func:`on_signals` and after :func:`install` a signal only sets the flag, so any other
    ``KeyboardInterrupt`` was raised by the code itself."""
    if isinstance(exc, Stopped) or (
        isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is not _handler
    ):
        raise exc


def requested() -> str | None:
    """The name of the signal that asked to stop (``SIGINT``, ``SIGTERM``), None when none has."""
    return _requested


def check() -> None:
    """Raise :class:`Stopped` if a signal has asked to stop; else return. Called between cells."""
    if _requested is not None:
        raise Stopped(f"received {_requested}")


def _say(text: str) -> None:
    with contextlib.suppress(OSError):  # stderr closed: nothing to tell
        os.write(2, text.encode())


def _handler(signum: int, frame: FrameType | None) -> None:
    global _requested
    name = signal.Signals(signum).name
    if _requested is None:
        _requested = name
        _say(f"\n{name}: stopping after the cell in flight (send it again to stop at once)\n")
        return
    _say(f"\n{name} again: stopping now; the finished cells are in the folder's store\n")
    for pid in live():  # a reaped child is left out: its pid may be another process's now
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(INTERRUPTED)


def install() -> None:
    """Make SIGINT and SIGTERM set the flag from now on, for the whole process (``python -m compare`` does this
    before it imports anything heavy: a signal while JAX or torch loads is then only remembered, and the first
    :func:`check` acts on it). Main thread only; elsewhere nothing."""
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _handler)


def ignore_from_now() -> None:
    """Ignore SIGINT and SIGTERM from now on: ``python -m compare`` calls this once its command has returned, so a
    signal during the interpreter's shutdown (JAX's and torch's teardown takes seconds) cannot kill the process
    with the signal's status after every file was written (Python resets a handler of its own to the default
    when it finalizes, but leaves an ignored signal ignored). Main thread only."""
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set the flag (see the module docstring); the previous handlers are restored
    on the way out and the flag cleared (a signal that came before, while the tool loaded, is kept: the first
    :func:`check` inside acts on it). Only the main thread can install handlers: elsewhere this does nothing."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _requested = None
