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
import ipaddress
import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

from compare.formats.codec import from_json, to_json
from compare.problem.cases import Case, InputError
from compare.results import environment
from compare.results.document import SCHEMA_VERSION, Result
from compare.run.tp_launch import Job, job_doc

#: The highest TCP port (the lowest is 1: port 0 asks the OS for any free one, no port to tell another host).
MAX_PORT = 65535
#: One label of a host name (RFC 1123, section 2.1): 1 to 63 letters, digits and hyphens, neither first nor last a
#: hyphen.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
#: The longest host name (RFC 1123, section 2.1; RFC 1035's 255 octets of the wire form).
MAX_HOST_NAME = 253


def check_port(port: int, option: str = "--port") -> int:
    """Return ``port`` if it is a TCP port every host can listen on and reach: an integer 1 .. 65535."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= MAX_PORT:
        raise InputError(f"{option} must be a TCP port, an integer from 1 to {MAX_PORT}, got {port!r}")
    return port


def check_addr(addr: str, option: str = "--addr") -> str:
    """Return ``addr`` as the rendezvous host to write: an IPv4 literal or a host name (RFC 1123: dot-separated
    labels of letters, digits and hyphens, not all-numeric at the top) as given, an IPv6 literal (bare or in brackets)
    in brackets, as ``HOST:PORT`` needs it; anything else raises InputError naming the allowed forms."""
    bracketed = addr.startswith("[") and addr.endswith("]")
    try:
        ip = ipaddress.ip_address(addr[1:-1] if bracketed else addr)
    except ValueError:
        ip = None
    if ip is not None and (ip.version == 6 or not bracketed):
        return f"[{ip}]" if ip.version == 6 else str(ip)
    labels = addr.split(".")
    named = not bracketed and len(addr) <= MAX_HOST_NAME and all(_LABEL.fullmatch(x) for x in labels)
    if named and not labels[-1].isdigit():  # a dotted number that is no IPv4 address is no host name either
        return addr
    raise InputError(
        f"{option} must be an IPv4 address (e.g. 10.0.0.1), an IPv6 address (e.g. fd00::1 or [fd00::1]) or a host "
        f"name (RFC 1123: dot-separated labels of 1 to 63 letters, digits and hyphens, no hyphen first or last, at "
        f"most {MAX_HOST_NAME} characters), got {addr!r}"
    )


def write_job(job: Job, folder: Path, addr: str, port: int) -> list[str]:
    """Write ``folder/job.json`` for ``job`` (every process of it on its own host); return the command per host.

    ``addr`` and ``port`` (the rendezvous) are checked first (:func:`check_addr`, :func:`check_port`): nothing is
    written for a command that could not work."""
    addr, port = check_addr(addr), check_port(port)
    if job.nproc != job.world_size:
        raise InputError(f"a multi-host job runs one process per rank; launch {job.how!r} is one process")
    folder.mkdir(parents=True, exist_ok=True)
    stale = sorted(p.name for p in folder.glob("rank*.jsonl"))
    if stale:
        raise InputError(
            f"{folder} holds the event files of an earlier job ({', '.join(stale)}): a new job there would mix its "
            f"events with theirs; use another --out, or delete them first"
        )
    torch_rt = job.specs[0].framework == "torch"  # torchrun brings its own rendezvous
    doc = job_doc(job, job.cells, Path(""), addr=addr, port=0 if torch_rt else port)
    doc["out"] = ""  # each worker writes beside the job file, on its own host
    doc["job_id"] = uuid.uuid4().hex  # the workers repeat it in their events: tp-collect refuses another job's
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
    """The results document of a multi-host job from process 0's events in ``folder`` (``compare.results.document``).

    Refused (``InputError``): events of another job (their ``job_id`` is not the job file's), events with no
    finished cell (a group that never formed: a port in use, a host that never ran its command). A cell of the job
    process 0 did not finish is an ``error`` row naming why, never a missing one."""
    events = folder / "rank0.jsonl"
    if not events.is_file():
        raise InputError(f"{events} does not exist: run tp-collect on the host of process 0, after the workers end")
    rows: list[dict[str, Any]] = []
    ids: set[Any] = set()
    done: set[Any] = set()
    env: dict[str, Any] | None = None
    for i, line in enumerate(events.read_text(encoding="utf-8").splitlines()):
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{events} line {i + 1} is not JSON: {exc}") from exc
        if ev.get("event") == "ready":
            env = ev.get("environment")
            ids.add(ev.get("job_id"))
        elif ev.get("event") == "done" and ev.get("result") is not None:
            rows.append(ev["result"])
            done.add(ev.get("cell"))
        elif ev.get("event") == "error":
            raise InputError(f"{events}: process 0 failed on cell {ev.get('cell')}: {ev.get('reason')}")
    job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    if ids != {job.get("job_id")}:
        theirs = ", ".join(sorted(str(i) for i in ids)) or "none (no process 0 joined the group)"
        raise InputError(
            f"{events} is not this job's: the job file's id is {job.get('job_id')}, the events' {theirs}; rerun the "
            f"job's commands (or tp-job into a new folder)"
        )
    if not rows:
        raise InputError(
            f"{events}: process 0 finished no cell of this job (did every host run its command? their rank*.err "
            f"files say why a process stopped)"
        )
    for c in job["cells"]:  # a cell the group never finished is an error row, never silently absent
        if c["index"] not in done:
            why = "process 0 reported no result for this cell: the group stopped before it (see the rank*.err files)"
            row = to_json(Result.for_case(c["backend"], from_json(Case, c["case"]), c["mode"], "error", reason=why))
            rows.append({**row, "world_size": job["world_size"]})
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
