"""One process of a tensor-parallel worker group: ``python -m compare.run.tp_worker JOB.json RANK``.

Started by :mod:`compare.run.tp_launch` (or, across machines, by ``torchrun``: then ``RANK`` comes from the environment
and the rendezvous from ``MASTER_ADDR``/``MASTER_PORT``). It joins the group through the backend's runtime module
(``compare.backends.tp``), runs every cell of the job in order on every process and writes events, one JSON object per
line,
to ``<out>/rank<R>.jsonl``:

- ``{"event": "ready", "t": <wall clock>, "init_s": ...}`` once the group is formed;
- ``{"event": "start", "cell": i}`` before a cell, ``{"event": "stage", "cell": i, "stage": ...}`` as a long stage
  of it begins (timing, the fresh-input check), ``{"event": "done", "cell": i, "result": {...}}`` after it (process 0
  writes the merged result: parity judged on every process, timing of the slowest);
- ``{"event": "error", "cell": i, "reason": ..., "traceback": ...}`` when a cell raises here; the process then exits
  with status 3 (its peers may be blocked in a collective: the launcher ends the group and restarts it for the cells
  left, so one failing cell never costs the others).

Only the shared timer times: each sample is the slowest process's (``timing.measure(agree=group.max_all)``, every
block ended by a barrier). After timing, every cell's step runs once more on fresh inputs (``compare.gate.fresh``), of
the
job's seed, which the parent drew at run time: a step that returns a stored answer fails there.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from compare.backends.registry import BackendSpec, Prepared, TPBackend, register
from compare.backends.tp import PROBE_BYTES, Group, Launch, ring_bytes
from compare.cost.comm import comm_cost, shard
from compare.gate import fresh
from compare.gate.fresh import FreshCheck
from compare.gate.parity import Parity, Plain, worst_tier
from compare.gate.parity_record import ParityRecord, ProcessVerdict
from compare.kernels.summary import Kernels
from compare.problem.cases import Case
from compare.problem.golden import golden_for
from compare.results import environment
from compare.results.document import Result
from compare.results.tp import TPInfo
from compare.run.cell import MODE_TENSORS, judge, model_cost, plain_reference, status_of
from compare.timing import timer as timing
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


def _pin_cpus(rank: int, nproc: int, threads: int) -> list[int]:
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
    shared
    timer (each sample the slowest rank's). ``bus_bytes_per_s`` is the ring traffic per rank over the time."""
    fn, sync0 = group.allreduce_probe(PROBE_BYTES)

    def sync(outputs: Any) -> None:
        sync0(outputs)
        group.barrier()

    t = timing.measure(
        fn, sync, warmup=2, min_samples=5, max_samples=20, budget_s=min(cfg.budget_s, 0.5), agree=group.max_all
    )
    ring = ring_bytes(PROBE_BYTES, group.world_size)
    return {
        "payload_bytes": PROBE_BYTES,
        "ring_bytes_per_rank": ring,
        "bus_bytes_per_s": ring / t.median_s,
        "timing": t.to_dict(),
    }


def read_copies(prepared: Prepared, output: Any, who: str) -> list[tuple[str, dict[str, np.ndarray]]]:
    """``(device, tensors)`` of every device's copy of ``output`` that this process holds (``TPParts.copies``; one
    copy, ``to_numpy``'s on ``Prepared.device``, when the backend has none). Every process makes the same calls
    (reading a copy may gather)."""
    tp = prepared.tp
    if tp is None or tp.copies is None:
        return [(prepared.device, prepared.to_numpy(output))]
    copies = tp.copies(output)
    if not copies:
        raise RuntimeError(f"{who}: the backend's TPParts.copies returned no device copy to judge")
    return [(c.device, c.tensors) for c in copies]


def judge_copies(
    prepared: Prepared, output: Any, ref: dict[str, np.ndarray], plain: dict[str, np.ndarray], dtype: str, who: str
) -> list[tuple[str, Parity]]:
    """``(device, verdict)`` of the gate (``compare.run.cell.judge``) on every device's copy of ``output`` that this
    process holds (:func:`read_copies`)."""
    return judge_read(prepared, read_copies(prepared, output, who), ref, plain, dtype, who)


def judge_read(
    prepared: Prepared,
    copies: list[tuple[str, dict[str, np.ndarray]]],
    ref: dict[str, np.ndarray],
    plain: dict[str, np.ndarray],
    dtype: str,
    who: str,
) -> list[tuple[str, Parity]]:
    """``(device, verdict)`` of the gate on copies already read (:func:`read_copies`)."""
    as_read = replace(prepared, to_numpy=dict)  # a copy's tensors are numpy already
    many = prepared.tp is not None and prepared.tp.copies is not None
    return [(d, judge(as_read, t, ref, plain, dtype, f"{who} on {d}" if many else who)) for d, t in copies]


#: This process's fresh reference (:func:`fresh_reference`): ``(case, seed) -> (reference, plain)``, one case kept.
_FRESH: dict[tuple[Case, int], tuple[dict[str, np.ndarray], Plain]] = {}


def fresh_reference(case: Case, seed: int, params: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Plain]:
    """The float64 reference and the plain computation of ``case`` on its fresh draw of ``seed`` (every tensor,
    ``compare.gate.fresh.reference``), computed in this process the first time a cell of the case asks, which
    :func:`run_cell` does only after that cell's fresh step returned, and cached for the later cells of the same
    case (a job's cells come case by case, so one case is kept: the next case's replaces it). Each process computes
    its own (every process judges the copies it holds); they are the same bits on every machine."""
    key = (case, seed)
    if key not in _FRESH:
        _FRESH.clear()
        _FRESH[key] = fresh.reference(case, params, fresh.draw(case, seed, params))
    return _FRESH[key]


def _worst(checks: list[FreshCheck]) -> FreshCheck:
    """The first of the worst tier among ``checks`` (non-empty)."""
    tier = worst_tier(c.tier for c in checks)
    return next(c for c in checks if c.tier == tier)


def run_cell(
    spec: BackendSpec,
    cell: Cell,
    group: Group,
    launch: Launch,
    cfg: TimingConfig,
    profile: bool,
    init_s: float = 0.0,
    bandwidth: dict[str, Any] | None = None,
    *,
    fresh_seed: int,
    stage: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """Parity of every device's copy on every process (:func:`judge_copies`), then timing (full step, its
    collectives alone, its compute alone) of one cell, then the step once on fresh inputs (``Prepared.fresh``, the
    draw of ``fresh_seed``: ``compare.gate.fresh``), every copy of it judged against the fresh reference, computed only
    after that step returned (:func:`fresh_reference`). A fail-tier finding on fresh inputs makes the result
    ``parity-fail`` (a deviation there is recorded only); the record keeps the worst copy's verdict (``fresh``).

    ``stage(name)`` is told as a long stage begins (``"timing"``, ``"fresh inputs"``, ``"fresh reference"``): the
    launcher takes it as progress. Returns the merged result's dict on process 0, None elsewhere. Raises on a backend
    failure (see module doc); a backend whose ``Prepared`` has no ``fresh`` is an ``error`` result naming it, judged
    on nothing."""
    case, mode = cell.case, cell.mode
    golden = golden_for(case)
    plain = plain_reference(case)
    want = MODE_TENSORS[mode]
    ref = {k: v for k, v in golden.ref.items() if want(k)}
    backend = cast(TPBackend, spec.load())  # a registry line with a runtime names a TP backend
    prepared = backend.prepare(golden.problem, mode, group)
    tp = prepared.tp
    if tp is None:
        raise RuntimeError(f"{spec.name} is registered with a runtime but its Prepared has no tp parts")
    if prepared.fresh is None:  # every process holds the same backend: all of them return here, no collective left
        if group.rank != 0:
            return None
        why = (
            f"{spec.name} in mode {mode}: its Prepared has no fresh (a step on inputs it has never seen): it cannot "
            "be checked to compute its answer from its inputs"
        )
        res = Result.for_case(spec.name, case, mode, "error", reason=why, note=prepared.note, device=prepared.device)
        return replace(res, world_size=launch.world_size).to_dict()

    def sync(outputs: Any) -> None:
        prepared.sync(outputs)
        group.barrier()

    who = f"{spec.name} in mode {mode}"
    first_s, out = timing.first_call(prepared.step, sync)
    verdicts = judge_copies(prepared, out, ref, plain, case.dtype, who)
    del out

    def measure(fn: Any, first: float | None = None, last_output: Any = None) -> timing.Timing:
        return timing.measure(
            fn,
            sync,
            first_call_s=first,
            last_output=last_output,
            agree=group.max_all,
            **cfg.to_dict(),
        )

    told = stage or (lambda _: None)
    tim = comm = compute = None
    last: list[Any] = []
    if prepared.timed:
        told("timing")
        tim = measure(prepared.step, first_s, last.append)
        comm = measure(tp.comm_only)
        compute = measure(tp.compute_only)
    agains = judge_copies(prepared, last.pop(), ref, plain, case.dtype, who) if last else None
    # fresh inputs: every process steps together (the step may issue collectives), reads its copies, and only then
    # does the reference of that draw exist in this process
    told("fresh inputs")
    t0 = time.perf_counter()
    out = prepared.fresh(fresh.draw(case, fresh_seed, golden.params))
    sync([out])
    t1 = time.perf_counter()
    fresh_read = [(d, fresh.compact(t)) for d, t in read_copies(prepared, out, f"{who} on fresh inputs")]
    del out
    told("fresh reference")
    t2 = time.perf_counter()
    fresh_ref, fresh_plain = fresh_reference(case, fresh_seed, golden.params)
    t3 = time.perf_counter()
    fresh_ref = {k: v for k, v in fresh_ref.items() if want(k)}
    fresh_checks = [
        FreshCheck.of(fresh_seed, p)
        for _, p in judge_read(prepared, fresh_read, fresh_ref, fresh_plain, case.dtype, f"{who} on fresh inputs")
    ]
    del fresh_read
    fresh_s = {"step": t1 - t0, "read": t2 - t1, "reference": t3 - t2, "judge": time.perf_counter() - t3}
    collectives = [c.to_dict() for c in tp.collectives()]
    kernels = prepared.profile(None) if profile and prepared.profile is not None else None
    # one verdict per device copy: the first call's and, when timed, the last timed call's and a failure on fresh
    # inputs, of the same device
    copies: list[dict[str, Any]] = []
    mine_failures: list[str] = []
    mine_deviations: list[str] = []
    for i, (device, first) in enumerate(verdicts):
        later = agains[i][1] if agains is not None else None
        new = fresh_checks[i]
        tiers = [first.tier, *([later.tier] if later else []), *(["fail"] if new.reasons else [])]
        tier = worst_tier(tiers)
        copies.append({"device": device, "passed": tier == "pass", "tier": tier})
        mine_failures += [f"device {device}: {f}" for f in first.failures()]
        mine_failures += [f"device {device}: last timed call: {f}" for f in (later.failures() if later else [])]
        mine_failures += [f"device {device}: {f}" for f in new.reasons]
        mine_deviations += [f"device {device}: {f}" for f in first.deviations()]
        mine_deviations += [f"device {device}: last timed call: {f}" for f in (later.deviations() if later else [])]
    mine = {
        "rank": group.rank,
        "passed": all(c["passed"] for c in copies),
        "tier": worst_tier(c["tier"] for c in copies),
        "failures": mine_failures,
        "deviations": mine_deviations,
        "copies": copies,
        "collectives": collectives,
        "fresh": _worst(fresh_checks).to_dict(),
        "host": socket.gethostname(),
    }
    everyone = group.gather(mine)
    if everyone is None:
        return None
    failures = [f"process {r['rank']}, {f}" for r in everyone for f in r["failures"]]
    deviations = [f"process {r['rank']}, {f}" for r in everyone for f in r["deviations"]]
    # the stored numbers are this process's worst copy's (a failing one, else a deviating one, else its first); the
    # fresh verdict is the worst copy's of every process
    worst = worst_tier(c["tier"] for c in copies)
    shown = next((i for i, c in enumerate(copies) if c["tier"] == worst), 0)
    parity, again = verdicts[shown][1], (agains[shown][1] if agains is not None else None)
    record = ParityRecord.of(parity, again, _worst([FreshCheck.from_dict(r["fresh"]) for r in everyone]))
    processes = [
        ProcessVerdict.from_dict({"rank": r["rank"], "passed": r["passed"], "tier": r["tier"], "copies": r["copies"]})
        for r in everyone
    ]
    tp_doc = {
        "world_size": launch.world_size,
        "nproc": launch.nproc,
        "launch": launch.how,
        "threads_per_process": launch.threads,
        "transport": group.backend,
        "layout": tp.layout,
        "collectives": collectives,
        "comm": comm.to_dict() if comm else None,
        "compute": compute.to_dict() if compute else None,
        "setup_s": {"init": init_s, **tp.setup_s},  # init: import the runtime and form the group
        "hosts": sorted({r["host"] for r in everyone}),
        "ranks_checked": sum(len(r["copies"]) for r in everyone),  # the device copies judged, every process's
        "bandwidth": bandwidth,
        "comm_model": comm_cost(case, spec.comm, mode, launch.world_size, prepared.device).to_dict()
        if spec.comm
        else None,
    }
    disagree = [r["rank"] for r in everyone if r["collectives"] != collectives]
    if disagree:
        failures.append(f"processes {disagree} counted other collectives than process 0")
    status, reason = status_of(failures, deviations)
    result = Result.for_case(
        spec.name,
        case,
        mode,
        status,
        reason=reason,
        note=prepared.note,
        device=prepared.device,
        parity=replace(record, processes=tuple(processes)),
        timing=tim,
        threads=prepared.threads,
        kernels=Kernels.from_dict(kernels) if kernels else None,
        # process 0's seconds of the fresh-input check: the step, reading its copies, the reference (0 when cached
        # from an earlier cell of the case) and the gate
        extras={**prepared.extras, "fresh_check_s": fresh_s},
        cost=model_cost(spec, shard(case, launch.world_size), mode),  # one rank's share
    )
    return replace(result, world_size=launch.world_size, tp=TPInfo.from_dict(tp_doc)).to_dict()


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    rank = int(argv[1]) if len(argv) > 1 else int(os.environ["RANK"])
    out = Path(job["out"]) if job.get("out") else Path(argv[0]).parent  # a multi-host job: beside its file
    events = Events(out / f"rank{rank}.jsonl")
    for d in job["specs"]:
        register(BackendSpec.from_dict(d))
    launch = Launch(
        world_size=job["world_size"],
        nproc=job["nproc"],
        rank=rank,
        how=job["how"],
        addr=job["addr"],
        port=job["port"],
        threads=job["threads"],
        timeout_s=job["timeout_s"],
    )
    cpus = _pin_cpus(rank, launch.nproc, launch.threads) if job.get("pin", True) else []
    t0 = time.time()
    runtime = importlib.import_module(job["runtime"])
    group: Group = runtime.init(launch)
    init_s = time.time() - t0
    events.write(
        event="ready", t=time.time(), init_s=init_s, cpus=cpus, pid=os.getpid(), environment=environment.collect({}, {})
    )
    cfg = TimingConfig(**job["timing"])
    bandwidth = None
    if group.world_size > 1 and hasattr(group, "allreduce_probe"):
        try:
            bandwidth = probe_bandwidth(group, cfg)
        except Exception as exc:  # recorded in every result of the group, and the report says it failed
            bandwidth = {"error": f"{type(exc).__name__}: {exc}"}
    for c in job["cells"]:
        cell = Cell(c["index"], c["backend"], Case.from_dict(c["case"]), c["mode"])
        events.write(event="start", cell=cell.index, t=time.time())

        def stage(name: str, i: int = cell.index) -> None:
            events.write(event="stage", cell=i, stage=name, t=time.time())

        try:
            doc = run_cell(
                BackendSpec.from_dict(next(d for d in job["specs"] if d["name"] == cell.backend)),
                cell,
                group,
                launch,
                cfg,
                bool(job.get("profile")),
                init_s,
                bandwidth,
                fresh_seed=int(job["fresh_seed"]),
                stage=stage,
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
