"""The tensor-parallel launcher with a framework-free backend: a cell that crashes, hangs or raises is an error
result with its reason, within a bounded time; the other cells' results survive; no process is left behind."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from compare.cases import PRESETS
from compare.harness import TimingConfig
from compare.tp_launch import Job, run_job
from compare.tp_worker import Cell
from tests.fake_tp_backend import NAME, SPEC

MODES = ("fwd", "bwd", "fwd+bwd")
QUICK = TimingConfig(warmup=1, budget_s=0.02, max_samples=5)


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


def test_every_cell_runs_in_one_group(tmp_path: Path) -> None:
    rows = run_job(_job(), root=tmp_path)
    assert [(r["mode"], r["status"]) for r in rows] == [(m, "ok") for m in MODES]
    assert all(r["world_size"] == 2 and r["tp"]["collectives"][0]["kind"] == "all-reduce" for r in rows)
    assert all(r["tp"]["setup_s"]["launch_to_ready"] > 0 for r in rows)
    assert all(r["timing"]["n"] >= 5 and r["tp"]["comm"] and r["tp"]["compute"] for r in rows)
    assert len(list(tmp_path.glob("group-*"))) == 1, "the group started once for all its cells"


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("crash", "process 0 of 1 exited with status 9"),
        ("raise", "process 0: RuntimeError: fake-tp was told to fail on bwd"),
        ("hang", "no progress for 3 s"),
    ],
)
def test_a_failing_cell_is_an_error_and_the_others_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, says: str
) -> None:
    monkeypatch.setenv("FAKE_TP_FAULT", f"{fault}@bwd")
    t0 = time.monotonic()
    rows = run_job(_job(cell_timeout_s=3.0), root=tmp_path)
    took = time.monotonic() - t0
    assert [(r["mode"], r["status"]) for r in rows] == [("fwd", "ok"), ("bwd", "error"), ("fwd+bwd", "ok")]
    assert says in rows[1]["reason"]
    assert took < 30, f"the launcher took {took:.1f} s to give up on a {fault}"
    assert len(list(tmp_path.glob("group-*"))) == 2, "the group restarted once, for the cell after the failure"
    pids = _pids(tmp_path)
    assert len(pids) == 2
    assert not [p for p in pids if _alive(p)], "a worker process was left behind"


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
