"""The tensor-parallel launcher with a framework-free backend: a cell that crashes, hangs or raises is an error
result with its reason, within a bounded time; the other cells' results survive; no process is left behind. Every
cell's step is checked on fresh inputs of the job's seed: a backend without ``fresh`` is an error, and the cheat
control (``BACKEND`` below: the golden answer at every call) passes the golden checks and fails on fresh inputs.

This module is also that test-only backend: the worker imports ``BACKEND`` from here (``CHEAT_SPEC``'s target)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.backends.tp import Collective, Group, TPParts
from compare.problem.cases import PRESETS
from compare.problem.golden import Problem, golden_for
from compare.problem.reference import round_to_dtype
from compare.run.cell import MODE_TENSORS
from compare.run.tp_launch import Job, run_job
from compare.run.tp_worker import Cell
from compare.timing.timer import TimingConfig
from tests.fake_tp_backend import NAME, SPEC

pytestmark = pytest.mark.quick

MODES = ("fwd", "bwd", "fwd+bwd")
QUICK = TimingConfig(warmup=1, budget_s=0.02, max_samples=5)

# ---- the cheat control: a TP backend that returns the golden answer, whatever its inputs ------------------------

CHEAT = "fake-tp-cheat"
CHEAT_SPEC = BackendSpec(
    name=CHEAT,
    framework="numpy",
    target="tests.test_tp_launch",
    about=(
        "returns the golden answer, rounded to the dtype, at every call (a negative control: must fail on fresh inputs)"
    ),
    models=SPEC.models,
    runtime=SPEC.runtime,
    comm="megatron",
    launches=("devices",),
)


class Cheat:
    """Reads the answer in ``prepare`` (``golden_for(problem.case)``) and returns it at every call, ``bind``'s
    included: right on the first call, wrong on any other inputs."""

    name = CHEAT

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        case = problem.case
        want = MODE_TENSORS[mode]
        answer = {k: round_to_dtype(v, case.dtype).astype(np.float64) for k, v in golden_for(case).ref.items()}
        answer = {k: v for k, v in answer.items() if want(k)}

        def step() -> dict[str, np.ndarray]:
            return dict(answer)

        count = {"fwd": 1, "bwd": 1, "fwd+bwd": 2}[mode]
        payload = count * case.shape.tokens * case.shape.dim * 4
        tp = TPParts(
            collectives=lambda: [Collective("all-reduce", count, payload, "fake")],
            comm_only=lambda: np.zeros(1),
            compute_only=step,
            layout="the golden answer, stored",
        )
        return Prepared(step=step, sync=lambda outs: None, to_numpy=dict, tp=tp, bind=lambda inputs, slot: step)


BACKEND = Cheat()


def _job(cell_timeout_s: float = 30.0) -> Job:
    case = PRESETS["tiny"].case("float32")
    cells = tuple(Cell(i, NAME, case, m) for i, m in enumerate(MODES))
    return Job(SPEC.runtime, "devices", 2, cells, (SPEC,), QUICK, cell_timeout_s=cell_timeout_s)


def _pids(root: Path) -> list[int]:
    pids = []
    for events in root.glob("group-*/rank*.jsonl"):
        for line in events.read_text(encoding="utf-8").splitlines():
            ev = json.loads(line)
            if ev["event"] == "ready":
                pids.append(ev["pid"])
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.standard
def test_every_cell_runs_in_one_group(tmp_path: Path) -> None:
    rows = run_job(_job(), root=tmp_path)
    assert [(r["mode"], r["status"]) for r in rows] == [(m, "ok") for m in MODES]
    assert all(r["world_size"] == 2 and r["tp"]["collectives"][0]["kind"] == "all-reduce" for r in rows)
    assert all(r["tp"]["setup_s"]["launch_to_ready"] > 0 for r in rows)
    assert all(r["timing"]["n"] >= 5 and r["tp"]["comm"] and r["tp"]["compute"] for r in rows)
    assert len(list(tmp_path.glob("group-*"))) == 1, "the group started once for all its cells"


@pytest.mark.standard
def test_a_job_without_a_log_folder_leaves_none_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no ``root``, the processes' logs go to a temporary folder that the job removes as it ends (the control:
    the temporary folder, where the job put it, while the job ran)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[list[str]] = []
    rows = run_job(_job(), on_result=lambda doc: seen.append([p.name for p in tmp_path.iterdir()]))
    assert [r["status"] for r in rows] == ["ok"] * len(MODES)
    assert seen and all(len(names) == 1 and names[0].startswith("fusion-compare-tp-") for names in seen), seen
    assert list(tmp_path.iterdir()) == []


@pytest.mark.standard
@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("crash", "process 0 of 1 exited with status 9"),
        ("raise", "process 0: RuntimeError: fake-tp was told to fail on bwd"),
        ("hang", "no progress for 6 s"),
    ],
)
def test_a_failing_cell_is_an_error_and_the_others_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, says: str
) -> None:
    monkeypatch.setenv("FAKE_TP_FAULT", f"{fault}@bwd")
    t0 = time.monotonic()
    rows = run_job(_job(cell_timeout_s=6.0), root=tmp_path)
    took = time.monotonic() - t0
    assert [(r["mode"], r["status"]) for r in rows] == [("fwd", "ok"), ("bwd", "error"), ("fwd+bwd", "ok")]
    assert says in rows[1]["reason"]
    assert took < 40, f"the launcher took {took:.1f} s to give up on a {fault}"
    assert len(list(tmp_path.glob("group-*"))) == 2, "the group restarted once, for the cell after the failure"
    pids = _pids(tmp_path)
    assert len(pids) == 2
    assert not [p for p in pids if _alive(p)], "a worker process was left behind"


@pytest.mark.standard
def test_two_runs_at_once_do_not_collide(tmp_path: Path) -> None:
    out: dict[str, list[dict[str, object]]] = {}

    def go(name: str) -> None:
        out[name] = run_job(_job(), root=tmp_path / name)

    threads = [threading.Thread(target=go, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert {n: [r["status"] for r in rows] for n, rows in out.items()} == {n: ["ok"] * 3 for n in ("a", "b")}
    ports = {json.loads(p.read_text())["port"] for p in tmp_path.glob("*/group-*/job.json")}
    assert len(ports) == 2


@pytest.mark.standard
def test_every_cell_is_checked_on_fresh_inputs_and_the_cheat_fails_there(tmp_path: Path) -> None:
    """The honest fake passes on the job's fresh draw; the cheat (the golden answer stored) passes the first call and
    fails on the harness's inputs, every tensor, with the seed in its reason."""
    case = PRESETS["tiny"].case("float32")
    cells = tuple(Cell(i, b, case, m) for i, (b, m) in enumerate((b, m) for b in (NAME, CHEAT) for m in MODES))
    job = Job(SPEC.runtime, "devices", 2, cells, (SPEC, CHEAT_SPEC), QUICK, cell_timeout_s=30.0)
    rows = run_job(job, root=tmp_path)
    assert len(list(tmp_path.glob("group-*"))) == 1, "no cell failed its group"
    for cell, r in zip(cells, rows, strict=True):
        parity = r["parity"]
        assert parity["checked"] == ["first call", "fresh inputs"], parity["checked"]
        assert parity["fresh"]["seed"] == job.fresh_seed
        assert set(r["extras"]["fresh_check_s"]) == {"calls", "reference", "judge"}
        if cell.backend == NAME:
            assert r["status"] == "ok", r["reason"]
            assert parity["fresh"]["tier"] == "pass" and parity["fresh"]["failures"] == []
            continue
        # the golden check alone would pass it: the first call's record is right
        assert parity["tier"] == "pass" and parity["fresh"]["made"] >= 1, parity
        assert r["status"] == "parity-fail", r["reason"]
        assert parity["fresh"]["tier"] == "fail"
        tensors = {t["tensor"] for t in parity["tensors"]}
        assert {f.split(":")[0] for f in parity["fresh"]["failures"]} == tensors, parity["fresh"]["failures"]
        assert f"fresh inputs (seed {job.fresh_seed}): " in r["reason"], r["reason"]
        assert all(f"process 0, device cpu: fresh inputs (seed {job.fresh_seed}): {t}:" in r["reason"] for t in tensors)
        assert [(p["passed"], p["tier"]) for p in parity["processes"]] == [(False, "fail")]


@pytest.mark.standard
def test_a_backend_without_fresh_is_an_error_and_its_group_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TP_FAULT", "nofresh@bwd")
    rows = run_job(_job(), root=tmp_path)
    assert [(r["mode"], r["status"]) for r in rows] == [("fwd", "ok"), ("bwd", "error"), ("fwd+bwd", "ok")]
    assert "fake-tp in mode bwd: its Prepared has no bind" in rows[1]["reason"], rows[1]["reason"]
    assert rows[1]["world_size"] == 2 and rows[1].get("parity") is None
    assert len(list(tmp_path.glob("group-*"))) == 1, "refusing a cell costs no restart"


def test_each_job_draws_its_own_fresh_seed() -> None:
    seeds = {_job().fresh_seed for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**32 for s in seeds)
