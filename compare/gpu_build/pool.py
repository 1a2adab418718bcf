"""The GPU build's worker pool: the jobs spread over worker processes, each bounded, watched and ended.

Jobs are dealt round-robin, most expensive first (:meth:`compare.gpu_build.plan.Job.cost`), into one chunk per
worker; each chunk runs in one ``python -m triton_impl.gpu_build.worker`` (``compare.gpu_build.bridge.worker``:
``compare.run.child``, its own process group), which appends one JSON line per build to its rows file. Every
:data:`POLL_S` the pool reads the whole new lines and hands each record to ``on_record`` (which keeps it and prints
progress).

Bounds: a worker that writes no record for ``compile_timeout_s`` (plus :data:`STARTUP_S` before its first, to
import triton and the kernels) is ended with its whole group (ptxas included). The job it was on then fails with
that reason, and the rest of its chunk goes to a fresh worker; so does the rest after a worker that dies (a crash,
the OOM killer), with its exit and the tail of its stderr as the reason. A worker that dies before its first
record (triton missing, a kernel module that does not import) fails its whole chunk with that reason: it would die
the same way again. ``deadline`` (``time.monotonic()``) bounds the whole pool: past it every worker is ended and
:class:`TimeoutError` raised. An interrupt ends every worker too.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare.formats.atomic import write_text_atomic
from compare.gpu_build.bridge import worker
from compare.gpu_build.plan import Job
from compare.run import child, stop

__all__ = ["POLL_S", "STARTUP_S", "run"]

#: Seconds between two looks at the workers.
POLL_S = 0.5
#: Seconds a worker gets to start (import triton and the kernel modules) before its compile budget counts.
STARTUP_S = 60.0


@dataclass
class _Worker:
    """One running chunk: its process, its jobs in order, and how far its rows file has been read."""

    proc: child.Child
    jobs: list[Job]
    rows: Path
    done: set[str] = field(default_factory=set)
    offset: int = 0
    last_record: float = field(default_factory=time.monotonic)

    def remaining(self) -> list[Job]:
        return [j for j in self.jobs if j.key not in self.done]

    def read(self) -> list[dict[str, Any]]:
        """The records written since the last read (whole lines only: a line being written waits for the next)."""
        with self.rows.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        if records:
            self.done.update(r["key"] for r in records)
            self.last_record = time.monotonic()
        return records


def _chunks(jobs: Sequence[Job], n: int) -> list[list[Job]]:
    ordered = sorted(jobs, key=Job.cost, reverse=True)
    return [ordered[i::n] for i in range(min(n, len(ordered)))]


def run(
    jobs: Sequence[Job],
    modules: Sequence[str],
    on_record: Callable[[dict[str, Any]], None],
    *,
    n_workers: int,
    compile_timeout_s: float,
    triton_cache: Path,
    deadline: float | None = None,
) -> dict[str, str]:
    """Build ``jobs`` (kernels of ``modules``) in at most ``n_workers`` workers; ``on_record`` gets every record.

    Returns {job key: reason} for the jobs that got no record (see the module docstring).

    Raises:
        TimeoutError: the pool ran past ``deadline``; every worker has been ended.
    """
    failed: dict[str, str] = {}
    queue = _chunks(jobs, max(1, n_workers))
    running: list[_Worker] = []
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        n_started = 0

        def start(chunk: list[Job]) -> _Worker:
            nonlocal n_started
            n_started += 1
            job_file, rows = Path(tmp) / f"jobs{n_started}.json", Path(tmp) / f"rows{n_started}.jsonl"
            write_text_atomic(job_file, json.dumps({"modules": list(modules), "jobs": [j.for_worker() for j in chunk]}))
            rows.touch()
            args = ["--jobs", str(job_file), "--rows", str(rows), "--triton-cache", str(triton_cache)]
            return _Worker(worker(args, stderr=Path(tmp) / f"worker{n_started}.log"), chunk, rows)

        try:
            while queue or running:
                while queue and len(running) < max(1, n_workers):
                    running.append(start(queue.pop(0)))
                time.sleep(POLL_S)
                stop.check()  # a signal asked to stop: the workers are ended below
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the GPU build ran past its deadline with {len(running)} worker(s) running")
                for w in list(running):
                    verdict = _look(w, on_record, compile_timeout_s)
                    if verdict is None:
                        continue
                    reason, died = verdict
                    running.remove(w)
                    w.proc.close()
                    rest = w.remaining()
                    if died and not w.done:  # died before its first record: it would again, so the chunk fails
                        failed.update((j.key, reason) for j in rest)
                    elif rest:  # the job it was on fails; the rest of its chunk gets a fresh worker
                        failed[rest[0].key] = reason
                        if rest[1:]:
                            queue.append(rest[1:])
        finally:
            child.end_all([w.proc for w in running])
            for w in running:
                w.proc.close()
    return failed


def _look(w: _Worker, on_record: Callable[[dict[str, Any]], None], compile_timeout_s: float) -> tuple[str, bool] | None:
    """Hand on ``w``'s new records; None while it works, else (why its remaining jobs got no record, whether it died
    rather than being stopped); it has ended then."""
    for record in w.read():
        on_record(record)
    rc = w.proc.poll()
    if rc is None:
        limit = compile_timeout_s + (0.0 if w.done else STARTUP_S)
        if time.monotonic() - w.last_record <= limit:
            return None
        w.proc.end()
        for record in w.read():  # what it finished while being stopped
            on_record(record)
        return (
            f"no build within {limit:.0f} s, so the worker was stopped (compile timeout {compile_timeout_s:g} s)",
            False,
        )
    for record in w.read():  # the lines written between the last read and the exit
        on_record(record)
    if rc == 0:
        return "the worker exited with status 0 without building it", True
    tail = w.proc.tail()
    return f"the worker {child.describe_exit(rc)}" + (f": {tail}" if tail else ""), True
