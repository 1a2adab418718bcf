"""One side of an A/B comparison: ``python -m compare.run.ab_worker FD``, started by ``compare.run.ab`` with the
side's interpreter, in the side's checkout (its working folder and ``PYTHONPATH``), with the side's environment
variables. It speaks over the socket ``FD`` (its end of a socket pair the coordinator passed down), one JSON object per
line each way (:class:`Channel`):

- first, unasked, its handshake (:func:`handshake`): the protocol, the checkout it imported ``compare`` from, its
  commit, the interpreter and the package versions;
- ``{"op": "start", "case", "mode", "backends", "seed", "cpu"}``: the case's golden data hashed, then every backend
  staged as a run stages it (``compare.run.harness.Staged``: first calls judged, the feed of the fresh draw of
  ``seed``, which both sides share), then the main thread placed on ``cpu`` until ``settle`` (:meth:`Worker.place`);
  answers ``{"golden_sha256", "first_s", "cpu"}``, each timed backend's first-call seconds (None: not timed, its
  result says why) and the CPU the main thread is on (None: it is not placed);
- ``{"op": "block", "entrant", "calls"}``: one block of that backend timed here, by this process's clock
  (``compare.timing.timer.Entrant.block``): ``{"t0", "t1"}``; ``{"error"}`` when its step raised (its cell has
  failed);
- ``{"op": "settle", "profile", "memory"}``: every cell finished and judged: ``{"results"}``, untimed (the
  coordinator adds the timing it assembled from the blocks);
- ``{"op": "bye"}``, the socket closing or :data:`IDLE_S` without a message: exit 0.

A message that raises is answered ``{"error"}`` and the worker goes on. It dies with the coordinator (Linux's
parent-death signal, ``compare.run.child.die_with_parent``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compare.backends.registry import BACKENDS, BackendSpec
from compare.formats.codec import from_json, to_json
from compare.problem import golden
from compare.problem.cases import Case
from compare.results import environment, history
from compare.run import child
from compare.run.cell import plain_reference
from compare.run.harness import Staged
from compare.run.pipeline import CaseReference

#: The messages' layout; a coordinator refuses a worker of another (a checkout of an older or newer layout).
PROTOCOL = 2
#: Seconds a worker waits for its next message before it gives up on its coordinator and exits.
IDLE_S = 900.0
#: How often a bounded wait looks up (a ``check`` callback, the deadline).
POLL_S = 0.1
#: Seconds a message may take to be sent (they are small: a peer that takes this long is gone).
SEND_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


class Channel:
    """JSON objects, one a line, over a connected socket; every wait bounded."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self._buf = sock, b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.settimeout(SEND_S)
        self.sock.sendall((json.dumps(message, allow_nan=True) + "\n").encode())

    def receive(self, timeout_s: float, check: Callable[[], None] | None = None) -> dict[str, Any]:
        """The next message, within ``timeout_s`` (else ``TimeoutError``); ``EOFError`` when the peer has closed
        its end (it exited or died). ``check`` runs first and every :data:`POLL_S` (``compare.run.stop.check``)."""
        if check is not None:
            check()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message in {timeout_s:g} s")
            self.sock.settimeout(min(left, POLL_S))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                chunk = None
            if chunk == b"":
                raise EOFError("the other end closed the connection")
            self._buf += chunk or b""
            if check is not None:
                check()
        line, _, self._buf = self._buf.partition(b"\n")
        got = json.loads(line)
        if not isinstance(got, dict):
            raise ValueError(f"a message is a JSON object, got {line[:80]!r}")
        return got


def handshake() -> dict[str, Any]:
    """Who this worker is: the protocol, the checkout ``compare`` was imported from (its commit, ``+modified`` when
    tracked files differ from it; "" outside git: ``compare.results.history.source``), the interpreter and the
    package versions."""
    src = history.source(ROOT)
    commit = (src.commit or "") + ("+modified" if src.commit and src.dirty else "")
    return {
        "protocol": PROTOCOL,
        "checkout": str(ROOT),
        "commit": commit,
        "executable": sys.executable,
        "python": platform.python_version(),
        "versions": environment.versions(),
        "pid": os.getpid(),
    }


def _spec(sent: dict[str, Any]) -> BackendSpec:
    """The backend's registry line in this checkout; one it lacks is taken as the coordinator sent it (a backend the
    coordinator registered itself: a test's)."""
    return BACKENDS.get(sent["name"]) or from_json(BackendSpec, sent["spec"])


class Worker:
    """The worker's state: the cells of the current case and mode, and the plain computations made so far."""

    def __init__(self) -> None:
        self.staged: Staged | None = None
        self.plain: dict[tuple[str, bool], Any] = {}
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else set()

    def place(self, cpu: int | None) -> int | None:
        """Keep the main thread (the one that calls the steps; all of a one-thread side's work) on ``cpu`` from now,
        or let it run anywhere it may again (None); returns the CPU it is kept on. The coordinator sends both sides
        the same CPU, drawn per case and mode. Two workers left to the scheduler move and wake on different cores,
        and a side can stay the slower one for a whole trial: A/A trials of numpy-plain on ``tiny`` on a 2-core VM,
        one thread a side, had a trial-to-trial spread of B/A of 5 to 9% and 3 and 8 of 60 called different (up to
        1.33x); with both main threads kept on one CPU while timed, 1.6% and 0 of 60 (3.9% and 0 of 40 with a busy
        loop on one core). Placed only after staging, so the thread pools a backend starts on its first calls keep
        every CPU (a thread started later inherits the main thread's one); a CPU this process may not use leaves it
        where it is."""
        if not self.cpus or (cpu is not None and cpu not in self.cpus):
            return None
        os.sched_setaffinity(0, self.cpus if cpu is None else {cpu})  # 0: this thread alone (Linux)
        return cpu

    def start(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.staged = None  # the previous group's steps released first
        self.place(None)
        case, mode = from_json(Case, msg["case"]), msg["mode"]
        sha = golden.data_sha256(case)
        key = (case.name, mode != "fwd")
        if key not in self.plain:
            self.plain = {key: plain_reference(case, backward=key[1])}  # one case at a time
        reference = CaseReference(case, int(msg["seed"]), key[1])
        self.staged = Staged([_spec(b) for b in msg["backends"]], case, mode, self.plain[key], reference)
        entrants = [self.staged.entrant(i) for i in range(len(self.staged.cells))]
        first_s = [e.first_call_s if e is not None else None for e in entrants]
        return {"golden_sha256": sha, "first_s": first_s, "cpu": self.place(msg.get("cpu"))}

    def block(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.staged is not None, "block before start"
        i = int(msg["entrant"])
        e = self.staged.entrant(i)
        if e is None:
            return {"error": "this backend has no step to time (its cell has finished)"}
        try:
            t0, t1 = e.block(int(msg["calls"]))
        except Exception as exc:  # the step's failure: its cell's result, the worker goes on
            self.staged.fail(i, exc)
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"t0": t0, "t1": t1}

    def settle(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.staged is not None, "settle before start"
        self.place(None)
        results = self.staged.settle(bool(msg.get("profile")), bool(msg.get("memory")))
        self.staged = None
        return {"results": [to_json(r) for r in results]}


def main(fd: int) -> int:
    """Serve the coordinator on the socket ``fd`` until it says bye, closes or stays silent :data:`IDLE_S`."""
    child.die_with_parent()
    channel = Channel(socket.socket(fileno=fd))
    channel.send(handshake())
    worker = Worker()
    ops = {"start": worker.start, "block": worker.block, "settle": worker.settle}
    while True:
        try:
            msg = channel.receive(IDLE_S)
        except (EOFError, TimeoutError, OSError):
            return 0
        if msg.get("op") == "bye":
            return 0
        try:
            answer = ops[msg["op"]](msg)
        except Exception as exc:  # told to the coordinator, which records it for this side's cells
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        channel.send(answer)


if __name__ == "__main__":  # python -m compare.run.ab_worker FD
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: python -m compare.run.ab_worker FD (started by python -m compare ab)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(int(sys.argv[1])))
