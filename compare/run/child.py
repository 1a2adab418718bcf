"""Child process groups: start a worker in its own session, watch it, end it and everything it started, and keep
the tail of what it wrote to stderr. The one place the tool starts a worker process (sweep cells under
``--isolate``, tensor-parallel ranks, GPU-build compile workers).

A child's process group is its own (a new session): ending it ends its compile pools, ptxas runs and gloo helpers
too, and the tool's own Ctrl-C reaches it only through :meth:`Child.end`. On Linux a worker also dies with the tool
(:func:`die_with_parent`), even one killed with SIGKILL. ``compare.run.stop`` tracks every child and kills the
groups still running on a second signal. Its stderr goes to a file (a pipe would block a chatty child once its
64 KiB buffer fills); :meth:`Child.tail` reads its last lines back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from compare.run import stop

#: How long a child gets after SIGTERM before its group is killed (:meth:`Child.end`).
TERM_GRACE_S = 5.0
#: Lines of a child's stderr kept in an error record.
TAIL_LINES = 20
#: ``prctl(PR_SET_PDEATHSIG)``'s option number (linux/prctl.h).
_PR_SET_PDEATHSIG = 1

#: Set in every child's environment to the pid of the process that started it (:func:`die_with_parent`).
PARENT_ENV = "FUSION_COMPARE_PARENT_PID"


def die_with_parent() -> None:
    """In a worker started by :func:`start`: ask Linux to SIGKILL this process when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``), and exit at once if the parent is already gone (it died before the request was
    made). Elsewhere, or outside such a worker, nothing. Set in the child itself, not between fork and exec in the
    parent (a ``preexec_fn`` runs the parent's at-fork handlers, which break in a process with JAX's threads)."""
    parent = os.environ.pop(PARENT_ENV, None)  # not inherited by what this worker starts itself
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(parent):
        os._exit(1)


@dataclass
class Child:
    """One started worker: its process (the leader of its own process group) and the file its stderr goes to."""

    proc: subprocess.Popen[bytes]
    err: IO[bytes]
    started: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """Its exit status (negative: killed by that signal), None while it runs."""
        return self.proc.poll()

    def wait(
        self, timeout_s: float | None = None, check: Callable[[], None] | None = None, poll_s: float = 0.1
    ) -> int | None:
        """Wait at most ``timeout_s`` (None: for ever); its exit status, None if it still runs then. ``check`` is
        called every ``poll_s`` while waiting (``compare.run.stop.check``: it raises to give the wait up)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            step = poll_s if check is not None else None
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                step = left if step is None else min(step, left)
            try:
                return self.proc.wait(timeout=step)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
            if check is not None:
                check()

    def end(self, grace_s: float = TERM_GRACE_S) -> int:
        """End the child's whole process group: SIGTERM, ``grace_s`` to exit, then SIGKILL (the group may outlive
        its leader, so it is killed even when the leader has exited). Returns the leader's exit status."""
        end_all([self], grace_s)
        rc = self.proc.returncode
        assert rc is not None
        return rc

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` non-blank lines of its stderr so far, joined by newlines."""
        with contextlib.suppress(OSError, ValueError):
            self.err.flush()
            # pread, not seek + read: the child's stderr shares this file's offset, and moving it while the child
            # writes would put its next lines over the first ones
            fd = self.err.fileno()
            text = os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", errors="replace")
            kept = [line.rstrip() for line in text.splitlines() if line.strip()]
            return "\n".join(kept[-lines:])
        return ""

    def close(self) -> None:
        """Close its stderr file (ending the group first if it still runs)."""
        if self.proc.poll() is None:
            self.end()
        self.err.close()


def start(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout: Path | None = None,
    stderr: Path | None = None,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start ``cmd`` in its own session, stdin closed. ``stdout`` and ``stderr`` name files to write (stdout is
    discarded when None; stderr goes to an anonymous temporary file when None); :meth:`Child.tail` reads stderr.
    ``pass_fds``: descriptors the child inherits (an A/B worker's end of its socket pair); no other is."""
    err: IO[bytes] = stderr.open("w+b") if stderr is not None else tempfile.TemporaryFile()  # noqa: SIM115
    out_file = stdout.open("wb") if stdout is not None else None  # the child holds its own copy
    try:
        proc = subprocess.Popen(
            list(cmd),
            env={**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out_file if out_file is not None else subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        err.close()
        raise
    finally:
        if out_file is not None:
            out_file.close()
    stop.track(proc)
    return Child(proc, err, time.time())


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def end_all(children: Sequence[Child], grace_s: float = TERM_GRACE_S) -> None:
    """End every child's process group, politely then not: SIGTERM to each group still led by a live process, one
    shared ``grace_s`` for all of them to exit, then SIGKILL to every group and a wait for every leader."""
    for c in children:
        if c.proc.poll() is None:
            _signal_group(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for c in children:
        _signal_group(c.pid, signal.SIGKILL)
        c.proc.wait()


def signal_name(rc: int) -> str:
    """The signal that ended a process whose exit status ``rc`` is negative: ``SIGSEGV``, or ``signal 77``."""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def killed_by(rc: int) -> str:
    """How a process whose exit status ``rc`` is negative ended, in words: ``killed by signal SIGKILL (...)``, with
    the OOM killer's hint for SIGKILL."""
    hint = " (the OOM killer sends this when memory runs out)" if -rc == signal.SIGKILL else ""
    return f"killed by signal {signal_name(rc)}{hint}"


def describe_exit(rc: int) -> str:
    """How a process ended, in words: ``exited with status 3``, ``was killed by signal SIGKILL (...)``."""
    return f"exited with status {rc}" if rc >= 0 else f"was {killed_by(rc)}"
