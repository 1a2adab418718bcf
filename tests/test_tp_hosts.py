"""Tensor parallelism across "machines", on the loopback address: two torchrun nodes joined by c10d rendezvous, two
JAX processes joined by a coordinator, each started as its own command, as on two hosts; and a torch worker killed
mid-run. Parity on every rank and the collective counts are checked on what process 0 collected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from compare.backends.registry import spec
from compare.problem.cases import PRESETS
from compare.run import tp_hosts
from compare.run.tp_launch import Job, free_port, run_job
from compare.run.tp_worker import Cell
from compare.timing.timer import TimingConfig

pytestmark = pytest.mark.standard

QUICK = TimingConfig(warmup=1, budget_s=0.05, max_samples=5)
MODES = ("fwd", "fwd+bwd")
#: Seconds a two-node run may take in all (start-up is most of it).
NODE_TIMEOUT_S = 240


def _job(backend: str, modes: tuple[str, ...] = MODES) -> Job:
    case = PRESETS["tiny"].case("float32")
    s = spec(backend)
    cells = tuple(Cell(i, backend, case, m) for i, m in enumerate(modes))
    return Job(s.runtime, "processes", 2, cells, (s,), QUICK, threads_total=2)


def _run_nodes(commands: list[list[str]], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    procs = [
        subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        for c in commands
    ]
    try:
        outs = [p.communicate(timeout=NODE_TIMEOUT_S)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]


def _check(doc: dict[str, object], per_mode: dict[str, int]) -> None:
    rows = doc["results"]
    assert isinstance(rows, list) and len(rows) == len(per_mode)
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        assert r["world_size"] == 2 and r["tp"]["ranks_checked"] == 2
        reduces = [c for c in r["tp"]["collectives"] if c["kind"] == "all-reduce"]
        assert sum(c["count"] for c in reduces) == per_mode[r["mode"]], r["tp"]["collectives"]
        assert sum(c["bytes"] for c in reduces) == r["tp"]["comm_model"]["payload_bytes"]


@pytest.mark.slow
def test_two_torchrun_nodes_over_c10d_rendezvous(tmp_path: Path) -> None:
    port = free_port()
    lines = tp_hosts.write_job(_job("torch-tp-manual"), tmp_path, "127.0.0.1", port)
    assert all("--rdzv-backend=c10d" in line for line in lines)
    node = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two-nodes",
        "-m",
        "compare.run.tp_worker",
        str(tmp_path / "job.json"),
    ]
    _run_nodes([node, node], tmp_path)
    _check(tp_hosts.collect(tmp_path), {"fwd": 1, "fwd+bwd": 2})


@pytest.mark.slow
def test_two_jax_processes_with_a_coordinator(tmp_path: Path) -> None:
    port = free_port()
    tp_hosts.write_job(_job("jax-tp-shardmap"), tmp_path, "127.0.0.1", port)
    job = str(tmp_path / "job.json")
    _run_nodes([[sys.executable, "-m", "compare.run.tp_worker", job, str(r)] for r in (0, 1)], tmp_path)
    doc = tp_hosts.collect(tmp_path)
    per_mode = {
        r["mode"]: sum(c["count"] for c in r["tp"]["collectives"] if c["kind"] == "all-reduce") for r in doc["results"]
    }
    assert per_mode["fwd"] == 1
    _check(doc, per_mode)


@pytest.mark.slow
def test_a_killed_torch_worker_is_an_error_and_the_other_cells_survive(tmp_path: Path) -> None:
    job = _job("torch-tp-manual", ("fwd", "bwd", "fwd+bwd"))
    killed: list[int] = []

    def kill_rank1_in_cell1() -> None:
        deadline = time.monotonic() + NODE_TIMEOUT_S
        while time.monotonic() < deadline and not killed:
            for events in tmp_path.glob("group-*/rank1.jsonl"):
                evs = [json.loads(x) for x in events.read_text(encoding="utf-8").splitlines()]
                if any(e["event"] == "start" and e["cell"] == 1 for e in evs):
                    pid = next(e["pid"] for e in evs if e["event"] == "ready")
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank1_in_cell1)
    killer.start()
    t0 = time.monotonic()
    rows = run_job(job, root=tmp_path)
    took = time.monotonic() - t0
    killer.join(timeout=5)
    assert killed, "the test never saw cell 1 start on process 1"
    assert [r["status"] for r in rows] == ["ok", "error", "ok"], [r["reason"] for r in rows]
    assert "process 1 of 2 was killed by signal SIGKILL" in rows[1]["reason"], rows[1]["reason"]
    assert took < NODE_TIMEOUT_S
    pids = [
        json.loads(x)["pid"]
        for f in tmp_path.glob("group-*/rank*.jsonl")
        for x in f.read_text(encoding="utf-8").splitlines()
        if json.loads(x)["event"] == "ready"
    ]
    assert len(pids) == 4
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
