"""One process of a tensor-parallel worker group: ``python -m compare.run.tp_worker JOB.json RANK``.

Started by :mod:`compare.run.tp_launch` (or, across machines, by ``torchrun``: then ``RANK`` comes from the environment
and the rendezvous from ``MASTER_ADDR``/``MASTER_PORT``). It joins the group through the backend's runtime module
(``compare.backends.tp``), runs every cell of the job in order on every process and writes events, one JSON object per
line, to ``<out>/rank<R>.jsonl``:

- ``{"event": "ready", "t": <wall clock>, "init_s": ..., "job_id": ...}`` once the group is formed (``job_id``: the
  job file's, for a multi-host job: ``tp-collect`` refuses events of another job);
- ``{"event": "start", "cell": i}`` before a cell, ``{"event": "stage", "cell": i, "stage": ...}`` as a long stage
  of it begins (timing, the fresh-input check), ``{"event": "done", "cell": i, "result": {...}}`` after it (process 0
  writes the merged result: parity judged on every process, timing of the slowest);
- ``{"event": "error", "cell": i, "reason": ..., "traceback": ...}`` when a cell raises here; the process then exits
  with status 3 (its peers may be blocked in a collective: the launcher ends the group and restarts it for the cells
  left, so one failing cell never costs the others).

Every stage of a cell that is not the group's own (the verdicts, the fresh step, the status and the result) is
``compare.run.pipeline``'s, the code the in-process harness runs. Each timing sample is the slowest process's
(``timer.measure(agree=group.max_all)``, every block ended by a barrier); the fresh inputs are of the job's seed,
which the parent drew at run time.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any, cast

from compare.backends.registry import BackendSpec, TPBackend, register
from compare.backends.tp import PROBE_BYTES, Group, Launch, ring_bytes
from compare.cost.comm import comm_cost, shard
from compare.formats.codec import from_json, to_json
from compare.gate.fresh import FreshCheck
from compare.gate.parity import worst_tier
from compare.gate.parity_record import CopyVerdict, ProcessVerdict
from compare.problem.cases import Case
from compare.problem.golden import golden_for
from compare.results import environment
from compare.results.tp import TPInfo
from compare.run import child, pipeline
from compare.run.cell import plain_reference
from compare.timing import timer
from compare.timing.timer import TimingConfig

#: The exit status of a worker whose cell raised (its error event says why).
CELL_ERROR_EXIT = 3


@dataclass(frozen=True)
class Cell:
    """One (backend, case, mode) of a job, by its index in the job."""

    index: int
    backend: str
    case: Case
    mode: str


class Events:
    """This process's event file (line-buffered, flushed at every event: the launcher reads it while we run)."""

    def __init__(self, path: Path) -> None:
        self._f: IO[str] = path.open("a", encoding="utf-8")

    def write(self, **event: Any) -> None:
        self._f.write(json.dumps(event, allow_nan=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())


def _pin_cpus(rank: int, threads: int) -> list[int]:
    """Pin this process to its share of the CPUs (``threads`` of them, disjoint between local ranks); returns them.

    Without it two ranks of one thread each still float over every core, and so does each framework's pool."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    local = int(os.environ.get("LOCAL_RANK", rank))
    mine = cpus[(local * threads) % len(cpus) :][:threads] or cpus[:threads]
    os.sched_setaffinity(0, mine)
    return mine


def probe_bandwidth(group: Group, cfg: TimingConfig) -> dict[str, Any]:
    """The group's all-reduce bandwidth: :data:`~compare.backends.tp.PROBE_BYTES` summed over the ranks, through the
    shared timer (each sample the slowest rank's). ``bus_bytes_per_s`` is the ring traffic per rank over the time."""
    fn, sync0 = group.allreduce_probe(PROBE_BYTES)

    def sync(outputs: Any) -> None:
        sync0(outputs)
        group.barrier()

    t = timer.measure(
        fn, sync, warmup=2, min_samples=5, max_samples=20, budget_s=min(cfg.budget_s, 0.5), agree=group.max_all
    )
    ring = ring_bytes(PROBE_BYTES, group.world_size)
    return {
        "payload_bytes": PROBE_BYTES,
        "ring_bytes_per_rank": ring,
        "bus_bytes_per_s": ring / t.median_s,
        "timing": to_json(t),
    }


def run_cell(
    spec: BackendSpec,
    cell: Cell,
    group: Group,
    launch: Launch,
    cfg: TimingConfig,
    profile: bool,
    init_s: float,
    bandwidth: dict[str, Any] | None,
    reference: pipeline.CaseReference,
    stage: Callable[[str], None],
) -> dict[str, Any] | None:
    """One cell through the stages of ``compare.run.pipeline``, in step with every process of the group: the first
    calls judged on every device's copy, timing (full step, its collectives alone, its compute alone), the calls on
    the harness's inputs (a ``pipeline.Feed`` over ``reference``'s draw, its orders and kept calls drawn from a seed
    every process shares, so all of them bind and read alike) judged against the fresh reference, which this process
    computes only after the step returned. Each process's verdicts are gathered on process 0, which merges them into
    the result: a fail-tier finding of any copy, on any call, makes it ``parity-fail``; the record keeps this
    process's worst copy's numbers and the worst fresh verdict.

    ``stage(name)`` is told as a long stage begins (``"timing"``, ``"fresh inputs"``, ``"fresh reference"``): the
    launcher takes it as progress. Returns the merged result's dict on process 0, None elsewhere. Raises on a backend
    failure (see module doc); a ``Prepared`` without ``bind`` is an ``error`` result (``pipeline.no_fresh``)."""
    case, mode, ws = cell.case, cell.mode, launch.world_size
    golden = golden_for(case)
    plain = plain_reference(case)
    backend = cast(TPBackend, spec.load())  # a registry line with a runtime names a TP backend
    prepared = backend.prepare(golden.problem, mode, group)
    tp = prepared.tp
    if tp is None:
        raise RuntimeError(f"{spec.name} is registered with a runtime but its Prepared has no tp parts")
    refused = pipeline.no_fresh(spec, case, mode, prepared)
    if refused is not None:  # every process holds the same backend: all of them return here, no collective left
        return to_json(replace(refused, world_size=ws)) if group.rank == 0 else None

    def sync(outputs: Any) -> None:
        prepared.sync(outputs)
        group.barrier()

    seed = reference.seed
    # every process draws the same orders and keeps the same calls: a bind or a read may be collective
    first_s, _, verdicts, deterministic, feed = pipeline.first_calls(
        prepared, sync, spec, case, mode, plain, reference.inputs, seed=seed + cell.index
    )

    def measure(fn: Any, first: float | None = None, inputs: pipeline.Feed | None = None) -> timer.Timing:
        return timer.measure(fn, sync, first_call_s=first, feed=inputs, agree=group.max_all, **asdict(cfg))

    tim = comm = compute = None
    if prepared.timed:
        stage("timing")
        tim = measure(prepared.step, first_s, feed)
        comm = measure(tp.comm_only)
        compute = measure(tp.compute_only)
    # every process reads its copies of the kept calls, and only then does the draw's reference exist in this process
    stage("fresh inputs")
    t0 = time.perf_counter()
    calls = feed.judged(sync)
    stage("fresh reference")
    t1 = time.perf_counter()
    fresh_ref = reference.get()
    t2 = time.perf_counter()
    copies = pipeline.verdicts(verdicts, calls, feed.calls, fresh_ref, spec, case, mode, seed, pipeline.named(prepared))
    fresh_s = {"calls": t1 - t0, "reference": t2 - t1, "judge": time.perf_counter() - t2}
    del calls, feed
    collectives = [to_json(c) for c in tp.collectives()]
    kernels = pipeline.profile(prepared) if profile else None
    mine_failures, mine_deviations = pipeline.findings(copies, by_device=True)
    mine = {
        "rank": group.rank,
        "tier": worst_tier(c.tier for c in copies),
        "failures": mine_failures,
        "deviations": mine_deviations,
        "copies": [to_json(c.record()) for c in copies],
        "collectives": collectives,
        "fresh": to_json(pipeline.worst_fresh([c.fresh for c in copies])),
        "host": socket.gethostname(),
    }
    everyone = group.gather(mine)
    if everyone is None:
        return None
    failures = [f"process {r['rank']}, {f}" for r in everyone for f in r["failures"]]
    deviations = [f"process {r['rank']}, {f}" for r in everyone for f in r["deviations"]]
    # the stored numbers are this process's worst copy's; the fresh verdict is the worst copy's of every process
    record = pipeline.parity_record(copies, pipeline.worst_fresh([from_json(FreshCheck, r["fresh"]) for r in everyone]))
    processes = [
        ProcessVerdict(r["rank"], r["tier"] == "pass", r["tier"], tuple(from_json(CopyVerdict, c) for c in r["copies"]))
        for r in everyone
    ]
    tp_doc = {
        "world_size": ws,
        "nproc": launch.nproc,
        "launch": launch.how,
        "threads_per_process": launch.threads,
        "transport": group.backend,
        "layout": tp.layout,
        "collectives": collectives,
        "comm": to_json(comm) if comm else None,
        "compute": to_json(compute) if compute else None,
        "setup_s": {"init": init_s, **tp.setup_s},  # init: import the runtime and form the group
        "hosts": sorted({r["host"] for r in everyone}),
        "ranks_checked": sum(len(r["copies"]) for r in everyone),  # the device copies judged, every process's
        "bandwidth": bandwidth,
        "comm_model": to_json(comm_cost(case, spec.comm, mode, ws, prepared.device)) if spec.comm else None,
    }
    disagree = [r["rank"] for r in everyone if r["collectives"] != collectives]
    if disagree:
        failures.append(f"processes {disagree} counted other collectives than process 0")
    result = pipeline.result(
        spec,
        case,
        mode,
        (failures, deviations),
        pipeline.Kept.of(prepared),
        replace(record, processes=tuple(processes)),
        tim,
        kernels,
        # process 0's seconds of the fresh-input check: its calls (an untimed step's one) and reading the kept
        # copies, the reference (0 when kept from an earlier cell of the case) and the gate
        extras={"fresh_check_s": fresh_s, "deterministic": deterministic},
        cost_case=shard(case, ws),  # one rank's share
    )
    return to_json(replace(result, world_size=ws, tp=from_json(TPInfo, tp_doc)))


def main(argv: list[str]) -> int:
    child.die_with_parent()
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    rank = int(argv[1]) if len(argv) > 1 else int(os.environ["RANK"])
    out = Path(job["out"]) if job.get("out") else Path(argv[0]).parent  # a multi-host job: beside its file
    events = Events(out / f"rank{rank}.jsonl")
    for d in job["specs"]:
        register(from_json(BackendSpec, d, strict=True))
    launch = Launch(rank=rank, **{f.name: job[f.name] for f in fields(Launch) if f.name != "rank"})
    cpus = _pin_cpus(rank, launch.threads) if job.get("pin", True) else []
    t0 = time.time()
    runtime = importlib.import_module(job["runtime"])
    group: Group = runtime.init(launch)
    init_s = time.time() - t0
    events.write(
        event="ready",
        t=time.time(),
        init_s=init_s,
        cpus=cpus,
        pid=os.getpid(),
        job_id=job.get("job_id"),
        environment=environment.collect({}, {}),
    )
    cfg = TimingConfig(**job["timing"])
    bandwidth = None
    if group.world_size > 1 and hasattr(group, "allreduce_probe"):
        try:
            bandwidth = probe_bandwidth(group, cfg)
        except Exception as exc:  # recorded in every result of the group, and the report says it failed
            bandwidth = {"error": f"{type(exc).__name__}: {exc}"}
    reference: pipeline.CaseReference | None = None  # the case's fresh draw: a job's cells come case by case
    for c in job["cells"]:
        cell = Cell(c["index"], c["backend"], from_json(Case, c["case"]), c["mode"])
        events.write(event="start", cell=cell.index, t=time.time())

        def stage(name: str, i: int = cell.index) -> None:
            events.write(event="stage", cell=i, stage=name, t=time.time())

        try:
            if reference is None or reference.case != cell.case:
                reference = pipeline.CaseReference(cell.case, int(job["fresh_seed"]))
            doc = run_cell(
                from_json(BackendSpec, next(d for d in job["specs"] if d["name"] == cell.backend), strict=True),
                cell,
                group,
                launch,
                cfg,
                bool(job.get("profile")),
                init_s,
                bandwidth,
                reference,
                stage,
            )
        except Exception as exc:  # this process cannot go on in step with its peers: say why and leave
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
            events.write(event="error", cell=cell.index, reason=f"{type(exc).__name__}: {exc}".strip(), traceback=tb)
            sys.stdout.flush()
            os._exit(CELL_ERROR_EXIT)
        events.write(event="done", cell=cell.index, t=time.time(), result=doc)
    group.close()
    events.write(event="exit", t=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
