"""Tensor-parallel runs across machines: write a job once, start its worker on every host, collect the results.

``python -m compare tp-job ... --hosts N --addr HOST --port PORT --out DIR`` writes ``DIR/job.json`` (one worker
group: one runtime, one world size) and prints the command to run on each host; ``python -m compare tp-collect DIR``
turns process 0's events (``DIR/rank0.jsonl`` on the host of process 0: it gathers every process's parity verdict
and its collectives) into ``results.json`` and ``REPORT.md``. Each host needs the job folder at the same path (a
copy or a shared file system) and the same golden files.

- torch: ``torchrun --nnodes=N --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=ID
  -m compare.run.tp_worker DIR/job.json`` on every host (the same command; ranks follow arrival order; the job's port 0
  tells the runtime to take torchrun's ``MASTER_ADDR``/``MASTER_PORT``).
- JAX: ``python -m compare.run.tp_worker DIR/job.json R`` on host ``R`` (0 .. N-1); process 0's host runs the
  coordinator at ``HOST:PORT`` (``jax.distributed.initialize``).
"""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path
from typing import Any

from compare.problem.cases import InputError
from compare.results import environment
from compare.results.document import SCHEMA_VERSION
from compare.run.tp_launch import Job, job_doc


def write_job(job: Job, folder: Path, addr: str, port: int) -> list[str]:
    """Write ``folder/job.json`` for ``job`` (every process of it on its own host); return the command per host."""
    if job.nproc != job.world_size:
        raise InputError(f"a multi-host job runs one process per rank; launch {job.how!r} is one process")
    folder.mkdir(parents=True, exist_ok=True)
    torch_rt = job.specs[0].framework == "torch"  # torchrun brings its own rendezvous
    doc = job_doc(job, job.cells, Path(""), addr=addr, port=0 if torch_rt else port)
    doc["out"] = ""  # each worker writes beside the job file, on its own host
    path = folder / "job.json"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    quoted = shlex.quote(str(path))
    if torch_rt:
        cmd = (
            f"torchrun --nnodes={job.nproc} --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint={addr}:{port} "
            f"--rdzv-id=fusion-compare -m compare.run.tp_worker {quoted}"
        )
        return [f"host {r}: {cmd}" for r in range(job.nproc)]
    return [f"host {r}: python -m compare.run.tp_worker {quoted} {r}" for r in range(job.nproc)]


def collect(folder: Path) -> dict[str, Any]:
    """The results document of a multi-host job from process 0's events in ``folder`` (``compare.results.document``)."""
    events = folder / "rank0.jsonl"
    if not events.is_file():
        raise InputError(f"{events} does not exist: run tp-collect on the host of process 0, after the workers end")
    rows: list[dict[str, Any]] = []
    env: dict[str, Any] | None = None
    for i, line in enumerate(events.read_text(encoding="utf-8").splitlines()):
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{events} line {i + 1} is not JSON: {exc}") from exc
        if ev.get("event") == "ready":
            env = ev.get("environment")
        elif ev.get("event") == "done" and ev.get("result") is not None:
            rows.append(ev["result"])
        elif ev.get("event") == "error":
            raise InputError(f"{events}: process 0 failed on cell {ev.get('cell')}: {ev.get('reason')}")
    job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {
            "command": f"tp-collect of a {job['world_size']}-process {job['runtime']} job",
            "timing": job["timing"],
        },
        "environment": env or environment.collect({}, {}),
        "results": rows,
        "resolution": [],
    }
