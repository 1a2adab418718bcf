"""Start, watch and end the worker processes of tensor-parallel cells (framework-free: processes and files only).

One *job* is every TP cell of one runtime, launch and world size: its processes start once (start-up costs seconds:
importing a framework, forming the group) and run all of its cells in order (``compare.run.tp_worker``). The launcher

- picks a free port on the loopback address for each start (two runs on one machine never share one);
- gives each process ``threads`` CPUs (the total split evenly; the worker pins itself to them) and sends its
  stdout/stderr to files in the job folder (nothing reaches the terminal);
- reads the processes' event files while they run; a process that exits non-zero, or a group that makes no
  progress for ``cell_timeout_s`` (a hung collective), ends the group and its children: the cell in flight becomes
  an ``error`` result with the reason (the process's own words, else its exit status or the time it hung, and its
  stderr's tail), and the group starts again for the cells left. A group that cannot start makes every cell left
  an error: nothing is lost, nothing hangs, nothing is left behind.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec
from compare.formats.codec import to_json
from compare.gate.fresh import new_seed
from compare.results.document import Result
from compare.run import child, stop
from compare.run.tp_worker import Cell
from compare.timing.timer import TimingConfig

#: Seconds a group may take from launch to every process ready (imports, rendezvous).
STARTUP_TIMEOUT_S = 180.0
#: Seconds without any event (a cell started or finished) after which the group is taken to hang.
CELL_TIMEOUT_S = 300.0
#: Seconds a collective may block before it fails (a dead peer fails its partners within this).
COLLECTIVE_TIMEOUT_S = 60.0
#: Seconds between SIGTERM and SIGKILL when a group is ended.
KILL_GRACE_S = 3.0
#: Lines of a silent failed process's stderr kept in its cell's reason.
TAIL_LINES = 3


def free_port(addr: str = "127.0.0.1") -> int:
    """A port free on ``addr`` now (the OS picks it; concurrent runs get different ones)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def default_threads() -> int:
    """The CPUs this process may use (its affinity), the total a TP group's processes share."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Job:
    """Every TP cell of one runtime, launch (``compare.backends.tp.LAUNCHES``) and world size. ``fresh_seed`` is the
    seed of the fresh inputs every cell's step is checked on (``compare.gate.fresh``): drawn here, in the parent, when
    the job is made (at run time, from the operating system's entropy), and handed to every process in the job file,
    so that every rank steps on the same draw."""

    runtime: str
    how: str
    world_size: int
    cells: tuple[Cell, ...]
    specs: tuple[BackendSpec, ...]
    timing: TimingConfig
    threads_total: int = field(default_factory=default_threads)
    profile: bool = False
    timeout_s: float = COLLECTIVE_TIMEOUT_S
    cell_timeout_s: float = CELL_TIMEOUT_S
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    fresh_seed: int = field(default_factory=new_seed)

    @property
    def nproc(self) -> int:
        return self.world_size if self.how == "processes" else 1

    @property
    def threads(self) -> int:
        """Compute threads (pinned CPUs) per process: the total split evenly, at least one."""
        return max(1, self.threads_total // self.nproc)


@dataclass
class _Attempt:
    """One start of a job's processes over some of its cells."""

    procs: list[child.Child]
    folder: Path
    launched: float
    offsets: dict[int, int] = field(default_factory=dict)
    ready: dict[int, float] = field(default_factory=dict)
    current: dict[int, int] = field(default_factory=dict)  # rank -> cell index started
    done: dict[int, dict[str, Any]] = field(default_factory=dict)  # cell index -> result (process 0's)
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> error event
    last_event: float = 0.0


def _worker_env(job: Job, rank: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    here = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *here]))
    threads = str(job.threads)
    env.update(
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(job.nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    return env


def job_doc(job: Job, cells: Sequence[Cell], out: Path, addr: str = "127.0.0.1", port: int = 0) -> dict[str, Any]:
    """The job file a worker reads (``compare.run.tp_worker``): the cells, the backends' registry lines, the timing,
    the fresh inputs' seed, the rendezvous (``port`` 0: the framework's own, e.g. torchrun's
    ``MASTER_ADDR``/``MASTER_PORT``) and the folder the events go to."""
    return {
        "runtime": job.runtime,
        "how": job.how,
        "world_size": job.world_size,
        "nproc": job.nproc,
        "threads": job.threads,
        "timeout_s": job.timeout_s,
        "addr": addr,
        "port": port,
        "specs": [to_json(s) for s in job.specs],
        "cells": [{"index": c.index, "backend": c.backend, "case": to_json(c.case), "mode": c.mode} for c in cells],
        "timing": asdict(job.timing),
        "profile": job.profile,
        "fresh_seed": job.fresh_seed,
        "out": str(out),
    }


def _start(job: Job, cells: Sequence[Cell], root: Path) -> _Attempt:
    folder = Path(tempfile.mkdtemp(prefix="group-", dir=root))
    port = free_port()
    (folder / "job.json").write_text(json.dumps(job_doc(job, cells, folder, port=port)), encoding="utf-8")
    procs: list[child.Child] = []
    launched = time.time()
    try:
        for rank in range(job.nproc):  # each in its own process group (compare.run.child): its end ends its children
            procs.append(
                child.start(
                    [sys.executable, "-m", "compare.run.tp_worker", str(folder / "job.json"), str(rank)],
                    env=_worker_env(job, rank, port),
                    stdout=folder / f"rank{rank}.out",
                    stderr=folder / f"rank{rank}.err",
                )
            )
    except BaseException:  # a start failed: end the ranks already started
        _end(procs)
        raise
    return _Attempt(procs, folder, launched, last_event=time.time())


def _read_events(a: _Attempt) -> None:
    for rank in range(len(a.procs)):
        path = a.folder / f"rank{rank}.jsonl"
        if not path.exists():
            continue
        with path.open("r", encoding="utf-8") as f:
            f.seek(a.offsets.get(rank, 0))
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break  # a line still being written: read it next time
                a.offsets[rank] = f.tell()
                a.last_event = time.time()
                ev = json.loads(line)
                if ev["event"] == "ready":
                    a.ready[rank] = ev["t"]
                elif ev["event"] == "start":
                    a.current[rank] = ev["cell"]
                elif ev["event"] == "done" and ev.get("result") is not None:
                    a.done[ev["cell"]] = ev["result"]
                elif ev["event"] == "error":
                    a.errors[rank] = ev


def _end(procs: Sequence[child.Child]) -> None:
    """End every process and its process group (compile workers, gloo threads' children), politely then not
    (``compare.run.child.end_all``, :data:`KILL_GRACE_S`), and close their stderr files."""
    try:
        child.end_all(procs, KILL_GRACE_S)
    finally:
        for p in procs:
            p.close()


def _failure(job: Job, a: _Attempt) -> str | None:
    """Why the attempt has failed, or None while it is healthy (or finished). A process that died without a word
    (killed, crashed) comes first: its peers' errors ("connection closed") are what its death caused."""
    now = time.time()
    silent, spoken = [], []
    for rank, p in enumerate(a.procs):
        rc = p.poll()
        if rc is None or rc == 0:
            continue
        if rank in a.errors:
            spoken.append(f"process {rank}: {a.errors[rank]['reason']}")
            continue
        how = child.describe_exit(rc)
        tail = " | ".join(p.tail(TAIL_LINES).splitlines())
        silent.append(f"process {rank} of {len(a.procs)} {how}" + (f" (stderr: {tail})" if tail else ""))
    if silent or spoken:
        return "; ".join(silent + spoken)
    if len(a.ready) < len(a.procs):
        if now - a.launched > job.startup_timeout_s:
            return f"the group was not ready {job.startup_timeout_s:g} s after launch"
    elif now - a.last_event > job.cell_timeout_s:
        return f"no progress for {job.cell_timeout_s:g} s (a process hangs, e.g. in a collective)"
    return None


def _error_result(job: Job, cell: Cell, reason: str) -> dict[str, Any]:
    doc = to_json(Result.for_case(cell.backend, cell.case, cell.mode, "error", reason=reason))
    doc["world_size"] = job.world_size
    return doc


def run_job(
    job: Job, root: Path | None = None, on_result: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 0.05
) -> list[dict[str, Any]]:
    """Every cell of ``job``, in order, as result documents (``compare.results.document``; TP rows carry ``world_size``
    and ``tp``). A failing cell is an ``error`` result and the group restarts for the others; ``on_result`` is told as
    each cell ends. The processes' logs are kept under ``root``; with none given, they go to a temporary folder that
    is removed when the job ends (a failing cell's reason, taken from them, is in its result)."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="fusion-compare-tp-") as tmp:
            return run_job(job, Path(tmp), on_result, poll_s)
    root.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict[str, Any]] = {}

    def finish(index: int, doc: dict[str, Any]) -> None:
        results[index] = doc
        if on_result:
            on_result(doc)

    def collect(a: _Attempt) -> None:
        for index in [i for i in a.done if i not in results]:
            doc = a.done[index]
            if doc.get("tp"):  # a cell the worker refused (an error result) has no TP details
                doc["tp"]["setup_s"]["launch_to_ready"] = max(a.ready.values()) - a.launched
            finish(index, doc)

    while left := [c for c in job.cells if c.index not in results]:
        a = _start(job, left, root)
        reason = None
        try:
            while True:
                _read_events(a)
                collect(a)
                if all(p.poll() == 0 for p in a.procs):
                    _read_events(a)
                    break
                reason = _failure(job, a)
                if reason:
                    break
                stop.check()  # a stop asked for by a signal: the finally ends the group
                time.sleep(poll_s)
        finally:
            _end(a.procs)
        collect(a)
        left = [c for c in left if c.index not in results]
        if not left:
            break
        reason = reason or "the group exited without running this cell"
        if len(a.ready) < len(a.procs):  # it never formed: the cells left cannot run either
            for c in left:
                finish(c.index, _error_result(job, c, f"tensor-parallel group could not start: {reason}"))
            break
        started = [i for i in a.current.values() if i not in results]
        failed = min(started) if started else left[0].index
        cell = next(c for c in left if c.index == failed)
        finish(failed, _error_result(job, cell, reason))
    return [results[c.index] for c in job.cells]
