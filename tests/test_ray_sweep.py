"""``sweep --engine ray`` on a real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and a
second node on this host, one CPU each, as Ray's own tests do), started once for the module and shut down at its end,
with a check that none of its processes is left.

- the same small sweep on the local engine and on the cluster gives the same cells and the same parity verdicts, and
  its rows name both nodes;
- a Ray worker killed (SIGKILL) in a cell, and a node removed in a cell, make that attempt an error row with the cause,
  the cell runs again and succeeds, nothing else is lost or doubled;
- a driver killed mid-sweep and run again resumes from the store without duplicates;
- a hanging cell is ended at ``--cell-timeout``; a worker whose golden hash differs from the driver's is an error
  naming both hashes (and its control, the same hash, is measured);
- bad input (an unknown engine, a malformed address, negative retries, ray missing) exits 2 naming what is allowed.

The cells run ``numpy-plain`` (``tests/numpy_backend.py``: no framework, starts in well under a second; its
``FUSION_COMPARE_TEST_MARK_DIR`` says which node and process run a cell), and ``torch-eager`` for the equality.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

import compare.cli.main
from compare.backends import registry
from compare.backends.registry import BackendSpec
from compare.cluster.ray_engine import cell_resources, describe_failure, slots
from compare.formats.codec import to_json
from compare.problem.cases import Case, preset
from compare.problem.golden import data_sha256
from compare.run.cell_worker import run_payload
from compare.run.grid import cells_from_config
from compare.run.store import JSONL, load_sweep, read_sweep
from compare.timing.timer import TimingConfig
from tests import numpy_backend
from tests.faults import PREAMBLE

pytestmark = [
    pytest.mark.standard,
    # Ray starts its processes (gcs, raylets, workers) with a fork that execs at once; in a pytest worker that
    # already ran JAX tests, JAX's at-fork hook warns of a deadlock that a fork+exec cannot reach (seen in make test)
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
]


def main(args: list[str]) -> int:
    """``python -m compare sweep ARGS``, in this process."""
    return compare.cli.main.main(["sweep", *args])


ROOT = Path(__file__).resolve().parent.parent
#: Each node's object store: small (results are small; CI machines differ in /dev/shm).
STORE = 80 * 2**20
#: Node failure noticed within about a second (Ray's default health check waits far longer).
HEALTH = {"health_check_period_ms": 200, "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}
#: Seconds any single wait of this module may take.
WAIT_S = 120.0
#: The committed ``tiny`` case (3 x 37 tokens) as a sweep cell: its golden file and manifest are checked.
TINY = ["--preset", "tiny", "--seq", "37", "--tokens", "111", "--no-ceilings", "--no-plots", "--budget", "0.02"]


def _processes_of(session_dir: str) -> list[str]:
    """The processes whose command line names a Ray session folder (its raylets, GCS, workers, agents)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended while we looked: not left over
            continue
        if session_dir in cmd:
            found.append(f"{proc.name}: {cmd[:160]}")
    return found


def _wait_gone(session_dir: str, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_of(session_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _wait_schedulable(c: Cluster, timeout_s: float = WAIT_S) -> None:
    """Until two one-CPU tasks submitted together run on the two nodes: the GCS listing both nodes alive
    (``wait_for_nodes``) is the cluster's membership, not yet proof that the scheduler places work on both."""
    import ray

    def where(hold_s: float) -> str:
        time.sleep(hold_s)  # both tasks hold their CPU at once
        return ray.get_runtime_context().get_node_id()

    probe = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(where)
    want = {n.node_id for n in c.list_all_nodes()}
    ray.init(address=c.address, logging_level="ERROR")
    try:
        _wait_for(
            "both nodes taking tasks",
            lambda: set(ray.get([probe.remote(0.3), probe.remote(0.3)])) == want,
            timeout_s=timeout_s,
        )
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head and a second node, one CPU each; shut down at the end, leaving no process of its session."""
    t0 = time.perf_counter()
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": STORE, "_system_config": HEALTH},
    )
    session = c.head_node.get_session_dir_path()
    try:
        c.add_node(num_cpus=1, object_store_memory=STORE)
        c.wait_for_nodes()
        _wait_schedulable(c)
        assert _processes_of(session), "the control: the running cluster's processes are found by their session"
        print(f"two-node cluster up in {time.perf_counter() - t0:.1f} s")
        yield c
    finally:
        c.shutdown()
    left = _wait_gone(session)
    assert not left, f"processes of the test cluster's session left running: {left}"


@pytest.fixture
def numpy_plain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """numpy-plain registered here (the driver sends its line to the workers), its marks in a folder (returned)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(numpy_backend.MARK_ENV, str(marks))
    registry.register(numpy_backend.SPEC)
    yield marks
    registry.unregister(numpy_backend.NAME)


def _lines(out: Path) -> list[dict[str, Any]]:
    path = out / JSONL
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().split("\n")[:-1] if x.startswith('{"type": "cell"')]


def _worker_node(c: Cluster) -> Any:
    return next(n for n in c.list_all_nodes() if n is not c.head_node)


def _start_driver(out: Path, extra_env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """``python -m compare sweep`` with the test backends registered (``tests.faults.PREAMBLE``), in a process."""
    env = {**os.environ, **extra_env}
    cmd = [sys.executable, "-c", PREAMBLE, "sweep", *args, "--out", str(out)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(p: subprocess.Popen[bytes], timeout_s: float = WAIT_S) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=timeout_s)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, err.decode(errors="replace")


def _wait_for(what: str, cond: Any, p: subprocess.Popen[bytes] | None = None, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert p is None or p.poll() is None, f"the driver ended before {what}: {_finish(p)[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.05)
    return got


def _verdicts(out: Path) -> dict[str, tuple[str, tuple[tuple[str, str], ...]]]:
    """Per cell key: its status and each tensor's tier."""
    doc = load_sweep(out)
    return {
        f"{r.backend}|{r.case}|{r.mode}": (
            r.status,
            tuple((t.tensor, t.tier) for t in (r.parity.tensors if r.parity is not None else ())),
        )
        for r in doc.results
    }


# --- on the cluster -----------------------------------------------------------------------------------------------


@pytest.mark.slow  # 18 s with the cluster; make test keeps the killed worker's retry on it
def test_a_two_node_sweep_equals_the_local_engine(cluster: Cluster, numpy_plain: Path, tmp_path: Path) -> None:
    """tiny, numpy-plain and torch-eager, float32 and bfloat16: the same cells and verdicts on both engines; the
    cluster's rows come from both nodes (one CPU each and two cells in flight), each with its node record."""
    args = [*TINY, "--backend", "numpy-plain", "torch-eager", "--dtype", "float32", "bfloat16"]
    t0 = time.perf_counter()
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    t1 = time.perf_counter()
    assert main([*args, "--engine", "ray", "--address", cluster.address, "--out", str(tmp_path / "ray")]) == 0
    t2 = time.perf_counter()
    print(f"local engine {t1 - t0:.1f} s, ray on two nodes {t2 - t1:.1f} s")
    local, remote = _verdicts(tmp_path / "local"), _verdicts(tmp_path / "ray")
    assert len(local) == 4 and all(status == "ok" for status, _ in local.values()), local
    assert remote == local
    doc = load_sweep(tmp_path / "ray")
    nodes = {r.node.node_id for r in doc.results if r.node is not None}
    assert nodes == {n.node_id for n in cluster.list_all_nodes()}, nodes
    tiny = preset("tiny")
    committed = Case(tiny.model, tiny.shape, "float32", tiny.dist)
    assert {r.extras["golden_sha256"] for r in doc.results if r.dtype == "float32"} == {data_sha256(committed)}
    header = json.loads((tmp_path / "ray" / JSONL).read_text().splitlines()[0])
    assert header["engine"]["name"] == "ray" and len(header["engine"]["nodes"]) == 2
    assert all(r.node is not None and r.node.node_id == "" for r in load_sweep(tmp_path / "local").results)
    report = (tmp_path / "ray" / "REPORT.md").read_text()
    assert "Machines: 1 machine type" in report, report[:3000]


def test_a_killed_worker_is_an_error_row_and_the_cell_runs_again(
    cluster: Cluster, numpy_plain: Path, tmp_path: Path
) -> None:
    """SIGKILL of the Ray worker in a cell: that attempt is stored as an error naming the cause (marked retrying),
    the cell runs again in another worker and is ok, every other cell once."""
    out = tmp_path / "sweep"
    env = {numpy_backend.STEP_ENV: "0.1", numpy_backend.MARK_ENV: str(numpy_plain)}
    args = [*TINY[:-2], "--budget", "0.3", "--tokens", "37", "74", "111", "148", "--backend", "numpy-plain"]
    p = _start_driver(out, env, *args, "--dtype", "float32", "--engine", "ray", "--address", cluster.address)
    mark = _wait_for("cell in flight", lambda: sorted(numpy_plain.iterdir()), p)[0]
    os.kill(int(mark.name.rsplit(".", 1)[1]), signal.SIGKILL)
    rc, err = _finish(p)
    assert rc == 0, err[-3000:]
    lines = _lines(out)
    retried = [x for x in lines if x.get("retrying")]
    assert len(retried) == 1, lines
    assert "the Ray worker process running the cell died" in retried[0]["result"]["reason"], retried[0]
    assert "attempt 1 of 2; it runs again" in retried[0]["result"]["reason"]
    final = [x for x in lines if not x.get("retrying")]
    assert collections.Counter(x["key"] for x in final) == collections.Counter(
        c.key for c in cells_from_config(read_sweep(out)["config"])
    )
    by = {x["key"]: x["result"] for x in final}
    again = by[retried[0]["key"]]
    assert again["status"] == "ok" and again["extras"]["attempt"] == 2, again
    assert again["extras"]["earlier_attempts"] == [retried[0]["result"]["reason"].split(" (attempt")[0]]
    assert all(r["status"] == "ok" for r in by.values())
    problems = (out / "DETAILS.md").read_text().split("## Skipped, failed and implausible", 1)[1]
    assert "attempt 2, after: the Ray worker process running the cell died" in problems, problems


@pytest.mark.slow  # 10 s each; make test keeps the killed worker's retry
def test_a_lost_node_loses_only_its_cell_in_flight_which_runs_again(
    cluster: Cluster, numpy_plain: Path, tmp_path: Path
) -> None:
    """The second node removed while it runs a cell: that attempt is an error with the cause, the cell runs again
    on the head and is ok; no other cell is lost or doubled. The node is added back for the tests after."""
    out = tmp_path / "sweep"
    node = _worker_node(cluster)
    env = {numpy_backend.STEP_ENV: "0.1", numpy_backend.MARK_ENV: str(numpy_plain)}
    args = [*TINY[:-2], "--budget", "0.3", "--tokens", "37", "74", "111", "148", "--backend", "numpy-plain"]
    p = _start_driver(out, env, *args, "--dtype", "float32", "--engine", "ray", "--address", cluster.address)
    try:
        _wait_for(
            "cell on the second node", lambda: [m for m in numpy_plain.iterdir() if m.name.startswith(node.node_id)], p
        )
        cluster.remove_node(node, allow_graceful=False)
        rc, err = _finish(p)
    finally:
        if len(cluster.list_all_nodes()) < 2:
            cluster.add_node(num_cpus=1, object_store_memory=STORE)
            cluster.wait_for_nodes()
    assert rc == 0, err[-3000:]
    lines = _lines(out)
    retried = [x for x in lines if x.get("retrying")]
    assert len(retried) == 1, [x["result"]["reason"] for x in lines]
    reason = retried[0]["result"]["reason"]
    assert "died" in reason and "it runs again" in reason, reason
    final = [x for x in lines if not x.get("retrying")]
    grid = [c.key for c in cells_from_config(read_sweep(out)["config"])]
    assert collections.Counter(x["key"] for x in final) == collections.Counter(grid)
    assert all(x["result"]["status"] == "ok" for x in final), [x["result"]["reason"] for x in final]
    again = next(x["result"] for x in final if x["key"] == retried[0]["key"])
    assert again["extras"]["attempt"] == 2 and again["node"]["node_id"] != node.node_id


@pytest.mark.slow  # 10 s each; make test keeps the killed worker's retry
def test_a_killed_driver_resumes_from_the_store_without_duplicates(
    cluster: Cluster, numpy_plain: Path, tmp_path: Path
) -> None:
    """SIGKILL of the driver after two cells: the cluster stays; the same command again runs only the rest, every
    cell exactly once in the store."""
    out = tmp_path / "sweep"
    env = {numpy_backend.STEP_ENV: "0.05"}
    tokens = ["37", "74", "111", "148", "185", "222"]
    args = [*TINY[:-2], "--budget", "0.2", "--tokens", *tokens, "--backend", "numpy-plain", "--dtype", "float32"]
    args += ["--engine", "ray", "--address", cluster.address]
    p = _start_driver(out, env, *args)
    _wait_for("two stored cells", lambda: len(_lines(out)) >= 2, p)
    p.send_signal(signal.SIGKILL)
    rc, _ = _finish(p)
    assert rc == -signal.SIGKILL
    first = len(_lines(out))
    assert 2 <= first < len(tokens), "the sweep finished before it was killed"
    rc, err = _finish(_start_driver(out, env, *args))
    assert rc == 0, err[-3000:]
    assert f"{first}/{len(tokens)} cells already done" in err
    grid = [c.key for c in cells_from_config(read_sweep(out)["config"])]
    lines = _lines(out)
    final = [x for x in lines if not x.get("retrying")]
    assert collections.Counter(x["key"] for x in final) == collections.Counter(grid), "a cell was lost or run twice"
    # a worker the dead driver's job lost while the new one started is an attempt stored with its cause, never a row
    assert all(x["result"]["reason"] for x in lines if x.get("retrying"))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_stops_the_sweep_and_ends_the_cells_in_flight(
    cluster: Cluster, numpy_plain: Path, tmp_path: Path
) -> None:
    """SIGINT to the driver (Ray's own SIGTERM handler replaced by the tool's again): exit 130, what finished is in
    results.json, the cells in flight are not stored, and no Ray worker that ran a cell outlives the driver (the one
    in flight force-cancelled, the others ended with the driver's job)."""
    out = tmp_path / "sweep"
    env = {numpy_backend.STEP_ENV: "0.2", numpy_backend.MARK_ENV: str(numpy_plain)}
    args = [*TINY[:-2], "--budget", "0.5", "--tokens", "37", "74", "111", "--backend", "numpy-plain"]
    p = _start_driver(out, env, *args, "--dtype", "float32", "--engine", "ray", "--address", cluster.address)
    _wait_for("cell in flight", lambda: sorted(numpy_plain.iterdir()), p)
    p.send_signal(signal.SIGINT)
    rc, err = _finish(p)
    assert rc == 130, err[-3000:]
    assert "stopped by SIGINT" in err
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["results"]) == len(_lines(out)) < 3 and not [x for x in _lines(out) if x.get("retrying")]
    pids = {int(m.name.rsplit(".", 1)[1]) for m in numpy_plain.iterdir()}
    assert pids and _alive(os.getpid())  # the control: a running process reads alive
    deadline = time.monotonic() + 30
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], f"Ray workers of the stopped sweep still running: {pids}"


def test_a_hanging_cell_is_ended_at_the_cell_timeout(cluster: Cluster, tmp_path: Path) -> None:
    """tests/test_sweep.py's misbehaving backend hangs in bwd: the Ray worker is killed at --cell-timeout, the row is
    an error saying so, not retried."""
    s = BackendSpec(name="misbehaving", framework="none", target="tests.test_sweep", about="hangs in bwd")
    registry.register(s)
    try:
        t0 = time.monotonic()
        args = [*TINY, "--backend", "misbehaving", "--mode", "bwd", "--engine", "ray", "--address", cluster.address]
        assert main([*args, "--cell-timeout", "3", "--out", str(tmp_path)]) == 1
        assert time.monotonic() - t0 < 60
    finally:
        registry.unregister(s.name)
    (r,) = load_sweep(tmp_path).results
    assert r.status == "error" and "timed out after 3 s and its Ray worker was killed" in r.reason, r.reason
    assert not [x for x in _lines(tmp_path) if x.get("retrying")]


@pytest.mark.slow  # 65 s alone on a busy 2-core machine (the job's first Ray workers start); less after the others
def test_the_layers_of_a_sharded_checkpoint_fan_out_over_the_cluster(
    cluster: Cluster, numpy_plain: Path, tmp_path: Path
) -> None:
    """``sweep --layers`` on the cluster: each layer's cells are Ray tasks whose workers rebuild the layer's case from
    the job's JSON and read it from its shards (a cluster's nodes share the checkpoint's path; here, one machine);
    every row ok, each layer its own case, the report's Layers section."""
    from tests.test_checkpoint_layers import DIM, HIDDEN, INDEX, TEMPLATE, make_checkpoint

    make_checkpoint(tmp_path / "ck")
    args = ["--model", "swiglu", "--dim", str(DIM), "--hidden", str(HIDDEN), "--tokens", "16", "--seq", "16"]
    args += ["--weights", str(tmp_path / "ck" / INDEX), "--prefix", TEMPLATE, "--layers", "0,1,3"]
    args += ["--backend", "numpy-plain", "--budget", "0.02", "--no-ceilings", "--no-plots", "--quiet"]
    assert main([*args, "--engine", "ray", "--address", cluster.address, "--out", str(tmp_path / "ray")]) == 0
    doc = load_sweep(tmp_path / "ray")
    rows = sorted(doc.results, key=lambda r: r.weights.layer if r.weights and r.weights.layer is not None else -1)
    assert [(r.weights.layer if r.weights else None, r.status) for r in rows] == [(0, "ok"), (1, "ok"), (3, "ok")]
    assert len({r.case for r in rows}) == 3 and all(r.node is not None for r in rows)
    assert "## Layers" in (tmp_path / "ray" / "REPORT.md").read_text()


# --- without a cluster --------------------------------------------------------------------------------------------


def test_a_worker_with_other_golden_data_is_an_error_naming_both_hashes(numpy_plain: Path) -> None:
    """The worker's side of the golden check, as a Ray task runs it: the driver's hash is the worker's (measured,
    ok), then a tampered one (an error naming both, nothing measured)."""
    case = Case(preset("tiny").model, preset("tiny").shape, "float32")
    payload = {
        "spec": to_json(numpy_backend.SPEC),
        "case": to_json(case),
        "mode": "fwd",
        "timing": {**TimingConfig().__dict__, "budget_s": 0.02},
        "golden_sha256": data_sha256(case),
    }
    ok = run_payload(payload, "node-a")["result"]
    assert ok["status"] == "ok" and ok["node"]["node_id"] == "node-a" and ok["timing"] is not None
    tampered = "0" * 64
    bad = run_payload({**payload, "golden_sha256": tampered}, "node-a")["result"]
    assert bad["status"] == "error" and bad.get("timing") is None
    assert f"the driver's sha256 {tampered}, this worker's {data_sha256(case)}" in bad["reason"], bad["reason"]


@pytest.mark.quick
def test_cells_ask_for_what_they_need_or_are_refused_with_the_reason() -> None:
    torch_spec, numpy_spec = registry.spec("torch-eager"), numpy_backend.SPEC
    cpu_only = [{"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0}]
    gpus = [{"CPU": 16.0, "GPU": 1.0}, {"CPU": 16.0, "GPU": 1.0}]
    assert cell_resources(torch_spec, cpu_only, 1.0) == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert cell_resources(torch_spec, gpus, 1.0) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert cell_resources(numpy_spec, gpus, 2.0) == {"num_cpus": 2.0, "num_gpus": 0.0}  # no framework: a CPU cell
    assert cell_resources(torch_spec, gpus, 1.0, world_size=2) == (
        "needs 2 GPUs on one node (world size 2); the largest node of this cluster has 1"
    )
    assert cell_resources(torch_spec, [{"CPU": 8.0, "GPU": 2.0}], 1.0, world_size=2) == {
        "num_cpus": 1.0,
        "num_gpus": 2.0,
    }
    assert (
        cell_resources(numpy_spec, cpu_only, 2.0) == "needs 2 CPUs on one node; the largest node of this cluster has 1"
    )
    assert slots(cpu_only, {"num_cpus": 1.0, "num_gpus": 0.0}) == 2
    assert slots(gpus, {"num_cpus": 1.0, "num_gpus": 1.0}) == 2  # one GPU each: not 16 CPU cells each
    assert slots([], {"num_cpus": 1.0, "num_gpus": 0.0}) == 1


@pytest.mark.quick
def test_lost_workers_and_nodes_run_again_a_task_s_own_failure_does_not() -> None:
    from ray import exceptions as rx

    assert describe_failure(rx.WorkerCrashedError())[1] is True
    assert describe_failure(rx.TaskCancelledError())[1] is False
    assert describe_failure(ValueError("x")) == ("ValueError: x", False)


@pytest.mark.quick
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "nope"], "unknown engine 'nope'"),
        (["--engine", "ray", "--address", "head-node"], "--address must be auto or HOST:PORT"),
        (["--engine", "ray", "--address", "head-node:99999"], "--address's port must be a TCP port"),
        (["--engine", "ray", "--address", "bad_host!:6379"], "--address must be an IPv4 address"),
        (["--engine", "ray", "--retries", "-1"], "--retries must be 0 or more"),
        (["--engine", "ray", "--isolate"], "--isolate is the local engine's"),
        (["--retries", "2"], "--retries: only with --engine ray"),
        (["--address", "auto"], "--address: only with --engine ray"),
        (["--engine", "ray", "--cpus-per-cell", "0"], "--cpus-per-cell must be a finite number > 0"),
    ],
)
def test_bad_engine_input_exits_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*TINY, "--backend", "torch-eager", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "o" / JSONL).exists()


@pytest.mark.quick
def test_engine_ray_without_ray_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    assert main([*TINY, "--backend", "torch-eager", "--engine", "ray", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--engine ray needs the ray package" in err and "pip install -e '.[cluster]'" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["ends", "driver-killed"])
def test_a_local_instance_outlives_neither_the_sweep_nor_a_killed_driver(
    numpy_plain: Path, tmp_path: Path, kill: bool
) -> None:
    """Without --address the driver starts a local Ray instance: after the sweep ends, and after a SIGKILL of the
    driver mid-sweep, no process of that instance's session is left (within 60 s; Ray's processes notice the killed
    driver themselves, which took about 20 s here)."""
    out = tmp_path / "sweep"
    env = {numpy_backend.STEP_ENV: "0.05" if kill else "0", numpy_backend.MARK_ENV: str(numpy_plain)}
    args = [*TINY, "--backend", "numpy-plain", "--dtype", "float32", "bfloat16", "--engine", "ray"]
    p = _start_driver(out, env, *args)
    if kill:
        _wait_for("cell in flight", lambda: list(numpy_plain.iterdir()), p)
        p.send_signal(signal.SIGKILL)
    rc, err = _finish(p)
    assert rc == (-signal.SIGKILL if kill else 0), err[-3000:]
    session = json.loads((out / JSONL).read_text().splitlines()[0])["engine"]["session_dir"]
    assert session and Path(session).name.startswith("session_"), session
    assert not _wait_gone(session), (
        f"processes of the sweep's local Ray instance left running: {_processes_of(session)}"
    )
