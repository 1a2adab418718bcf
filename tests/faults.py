"""The fault-injection driver: start a real ``python -m compare`` command, send it SIGINT, SIGTERM or SIGKILL at a
seeded random moment, and check what it leaves behind (``tests/test_faults.py`` binds it).

A *shot* is one command and one signal at one delay after the start. What every shot must leave (:func:`check`):

- the exit status is the documented one: 130 for SIGINT and SIGTERM (0 if the command ended before the signal
  landed), -9 for SIGKILL (or 0, the same way);
- a ``results.json`` there is a valid results document holding every cell the folder's store holds (``run``:
  ``cells.jsonl``; ``sweep``: ``results.jsonl``), each once; where a SIGKILL left none, ``compare report DIR``
  rebuilds it from the store;
- an earlier complete run's ``results.json`` in the folder is never reduced by an interrupted one;
- no process of the run survives it (every process it started carries the shot's token in its environment; none
  may be left once the command has exited);
- a rerun of the same command without a signal completes the rest (exit 0, every cell once).

The delay counts from the tool's first line (its signal handlers installed), not from the process's start: before
that line the interpreter's own handler is in place, which no tool can replace (a signal there ends the process
with Python's traceback and status -2), and this suite does not test it.

The commands run the framework-free ``numpy-plain`` backend (``tests.numpy_backend``) on ``tiny`` with a short
sleep in each step (signals land inside cells), the framework-free tensor-parallel ``fake-tp`` backend in its worker
group, and, for imports, ``torch-eager`` with ``jax-xla``: their loading is where a raised ``KeyboardInterrupt`` used
to crash the process. ``run`` times cold only (a flush before each call) and ``tp`` warm and cold, so the signals land
in both timing loops: ``run`` with both took 2.7 CPU-seconds a shot against 1.2 cold only, most of the difference the
report's cold-against-warm rank test (importing ``scipy.stats``), which ``tp`` still reaches.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from compare.formats.jsonl import read_records
from compare.results.document import Results, read_json

ROOT = Path(__file__).resolve().parents[1]
TOKEN_ENV = "FUSION_COMPARE_FAULT_TOKEN"

#: ``python -m compare`` (its signal handlers first, as ``compare/__main__.py`` sets them, then a file named by
#: ``FUSION_COMPARE_TEST_READY`` to say so) with the test backends registered; ``FUSION_COMPARE_TEST_ENOSPC``
#: (``store:N`` or ``summary``) makes the N-th store line, or every summary file, fail as a full disk does (ENOSPC).
PREAMBLE = """
from compare.run import stop
stop.install()
import errno, os, sys
if os.environ.get("FUSION_COMPARE_TEST_READY"):
    open(os.environ["FUSION_COMPARE_TEST_READY"], "w").close()
from compare.backends import registry
from tests import fake_tp_backend, numpy_backend
registry.register(numpy_backend.SPEC)
registry.register(fake_tp_backend.SPEC)
full = os.environ.get("FUSION_COMPARE_TEST_ENOSPC", "")
if full:
    from compare.formats import atomic, jsonl
    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if full == "summary":
        atomic.write_bytes_atomic = no_space
    else:
        n, append = [int(full.split(":")[1])], jsonl.Appender.append
        def some(self, record):
            n[0] -= 1
            if n[0] <= 0:
                no_space()
            append(self, record)
        jsonl.Appender.append = some
from compare.cli.main import main
status = main(sys.argv[1:])
stop.ignore_from_now()
raise SystemExit(status)
"""

TINY = ["--preset", "tiny", "--budget", "0.02", "--no-ceilings", "--no-plots"]
_BOTH = ["--mode", "fwd", "bwd"]  # the modes of the run and tp commands
_SWEEP = ["sweep", "--preset", "tiny", "--tokens", "1", "2", "4", "--backend", "numpy-plain", "--dtype", "float32"]
#: The commands a shot can start, by name (``--out`` is added), and their cells.
COMMANDS: dict[str, tuple[list[str], int]] = {
    "run": (["run", *TINY, "--backend", "numpy-plain", "--dtype", "float32", "bfloat16", *_BOTH, "--cache", "cold"], 4),
    "sweep": ([*_SWEEP, "--mode", "fwd", "--budget", "0.02", "--no-ceilings", "--no-plots", "--isolate"], 3),
    "tp": (["run", *TINY, "--backend", "fake-tp", "numpy-plain", "--dtype", "float32", *_BOTH], 4),
    "real": (["run", *TINY, "--backend", "torch-eager", "jax-xla", "--dtype", "float32", "--mode", "fwd"], 2),
}
#: Seconds a command may take to end after its signal, and without one.
END_S, RUN_S = 60.0, 240.0
STEP_S = "0.02"


@dataclass(frozen=True)
class Shot:
    """One interruption: the command, the signal, its delay after the start, and whether the folder already holds an
    earlier complete run's results (``run`` only) that the interrupted one must not reduce."""

    command: str
    sig: signal.Signals
    delay_s: float
    earlier: bool = False

    def label(self) -> str:
        return f"{self.command}-{self.sig.name}-{self.delay_s:.2f}s" + ("-earlier" if self.earlier else "")


def plan(n: int, seed: int, real: int) -> list[Shot]:
    """``n`` shots drawn from ``seed``: ``real`` of them on the real frameworks (spread over the volley), the others
    ``run``, ``sweep`` and ``tp`` in turn; a signal at random; a delay uniform over the command's usual life (from
    0 s: the imports are in it). The spans are the commands' lives from the first line on an idle 2-core machine
    (run 1.8 s, sweep 2.3 s, tp 4.2 s, each step sleeping :data:`STEP_S`), so some shots land after the end; under
    load a life is longer and the shots fall in its first part."""
    rng = random.Random(seed)
    spans = {"run": 2.0, "sweep": 2.5, "tp": 4.5, "real": 10.0}
    every = max(1, n // max(1, real))
    cheap = ("run", "sweep", "tp")
    shots = []
    for i in range(n):
        cmd = "real" if real and i % every == every // 2 and sum(s.command == "real" for s in shots) < real else None
        cmd = cmd or cheap[i % len(cheap)]
        sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
        delay = round(rng.uniform(0.0, spans[cmd]), 2)
        shots.append(Shot(cmd, sig, delay, earlier=cmd == "run" and rng.random() < 0.3))
    return shots


def start(argv: list[str], out: Path, token: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, TOKEN_ENV: token, "FUSION_COMPARE_TEST_STEP_S": STEP_S, **(extra_env or {})}
    env.pop("PYTEST_XDIST_WORKER", None)
    with (out.parent / f"{out.name}.err").open("wb") as err:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-c", PREAMBLE, *argv, "--out", str(out)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def survivors(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``token`` (Linux's /proc; elsewhere none can be seen)."""
    found = []
    needle = f"{TOKEN_ENV}={token}".encode()
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended: only its exit is unread
                    found.append(int(d.name))
    return found


def wait_gone(token: str, timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := survivors(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def store_cells(out: Path, command: str) -> list[tuple[str, ...]]:
    """The cells the folder's store holds, as (backend, case, mode, world size) keys, in order."""
    path = out / ("results.jsonl" if command == "sweep" else "cells.jsonl")
    if not path.is_file():
        return []
    recs = [r for r in read_records(path) if r.get("type") == "cell"]
    return [(r["result"]["backend"], r["result"]["case"], r["result"]["mode"], str(r["result"].get("world_size", 1)))
            for r in recs]  # fmt: skip


def doc_cells(doc: Results) -> list[tuple[str, ...]]:
    return [(r.backend, r.case, r.mode, str(r.world_size)) for r in doc.results]


@dataclass
class Outcome:
    shot: Shot
    rc: int
    stored: int
    in_results: int
    rebuilt: bool
    finished_first: bool


def report(out: Path) -> int:
    """``python -m compare report DIR`` in this process's environment (no signal)."""
    return subprocess.run(
        [sys.executable, "-c", PREAMBLE, "report", str(out)], cwd=ROOT, capture_output=True, timeout=RUN_S
    ).returncode


def fire(shot: Shot, tmp: Path) -> Outcome:
    """Start the shot's command, send its signal after its delay, wait for the end; check everything
    (:func:`check`) and return what happened."""
    argv = COMMANDS[shot.command][0]
    out = tmp / shot.label()
    earlier: list[tuple[str, ...]] = []
    if shot.earlier:
        first = start(argv, out, uuid.uuid4().hex)
        assert first.wait(timeout=RUN_S) == 0, (out.parent / f"{out.name}.err").read_text()
        earlier = doc_cells(read_json(out / "results.json"))
    token = uuid.uuid4().hex
    ready = out.parent / f"{out.name}.ready"
    p = start(argv, out, token, {"FUSION_COMPARE_TEST_READY": str(ready)})
    deadline = time.monotonic() + END_S
    while not ready.exists():  # the moment is counted from the tool's first line (see the module docstring)
        assert p.poll() is None and time.monotonic() < deadline, (out.parent / f"{out.name}.err").read_text()
        time.sleep(0.005)
    time.sleep(shot.delay_s)
    finished_first = p.poll() is not None
    if not finished_first:
        p.send_signal(shot.sig)
    try:
        rc = p.wait(timeout=END_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = (out.parent / f"{out.name}.err").read_text(errors="replace")
    left = wait_gone(token)
    assert not left, f"{shot.label()}: processes of the run survive it: {left}\n{err[-2000:]}"
    allowed = {0} if finished_first else ({-9, 0} if shot.sig == signal.SIGKILL else {130, 0})
    assert rc in allowed, f"{shot.label()}: exit status {rc}, expected one of {sorted(allowed)}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{shot.label()}:\n{err[-3000:]}"
    rebuilt = False
    stored = store_cells(out, shot.command)
    assert len(stored) == len(set(stored)), f"{shot.label()}: a cell stored twice: {stored}"
    if stored and not (out / "results.json").is_file():
        assert report(out) == 0, shot.label()
        rebuilt = True
    in_results: list[tuple[str, ...]] = []
    if (out / "results.json").is_file():
        doc = read_json(out / "results.json")
        in_results = doc_cells(doc)
        assert len(in_results) == len(set(in_results)), f"{shot.label()}: a cell twice in results.json"
        assert set(earlier) <= set(in_results), f"{shot.label()}: the earlier run's results were reduced"
        if not earlier:
            assert set(stored) <= set(in_results), f"{shot.label()}: results.json lacks stored cells"
    return Outcome(shot, rc, len(stored), len(in_results), rebuilt, finished_first)


def rerun_completes(shot: Shot, tmp: Path) -> None:
    """The shot's command again, no signal: exit 0 and every cell once (a sweep resumes; a run starts over)."""
    argv, cells = COMMANDS[shot.command]
    out = tmp / shot.label()
    token = uuid.uuid4().hex
    p = start(argv, out, token)
    rc = p.wait(timeout=RUN_S)
    err = (out.parent / f"{out.name}.err").read_text(errors="replace")
    assert rc == 0, f"rerun of {shot.label()}: {rc}\n{err[-3000:]}"
    assert not wait_gone(token), f"rerun of {shot.label()}: processes survive it"
    got = doc_cells(read_json(out / "results.json"))
    assert len(got) == cells and len(set(got)) == cells, f"rerun of {shot.label()}: {got}"
