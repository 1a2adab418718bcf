"""``compare sweep``: resumable after a real SIGKILL with every cell exactly once, failures contained per cell,
hard crashes of a worker recorded under ``--isolate``.

This module is also a test-only backend (``BACKEND`` below) for the isolated runs: in a worker process it
segfaults in ``fwd`` and hangs in ``bwd``.
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

import pytest

from compare import registry
from compare.registry import Availability, BackendSpec, Prepared
from compare.results import SCHEMA_VERSION
from compare.sweep import JSONL, cells_from_config, load_sweep, main, read_sweep

ROOT = Path(__file__).resolve().parent.parent


class MisbehavingBackend:
    """Available, then dies hard while preparing: a segfault in ``fwd``, a hang in ``bwd``."""

    name = "misbehaving"

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, golden: object, mode: str) -> Prepared:
        if mode == "fwd":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(120)
        raise AssertionError("the worker should have been killed")


BACKEND = MisbehavingBackend()


@pytest.fixture
def test_backends() -> Iterator[None]:
    """Register the test-only backends for the duration of a test."""
    added = [
        BackendSpec("raising", "none", "tests.raising_backend", "raises MemoryError in prepare"),
        BackendSpec("misbehaving", "none", "tests.test_sweep", "segfaults (fwd) or hangs (bwd)"),
    ]
    for s in added:
        registry.register(s)
    yield
    for s in added:
        registry.BACKENDS.pop(s.name, None)


def _cell_lines(out: Path) -> list[dict[str, object]]:
    path = out / JSONL
    if not path.is_file():
        return []
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    return [json.loads(x) for x in lines if x.startswith('{"type": "cell"')]


def _keys(results: list[dict[str, object]]) -> list[str]:
    return [f"{r['backend']}|{r['case']}|{r['mode']}" for r in results]


def test_killed_sweep_resumes_with_every_cell_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = [
        "--preset",
        "tiny",
        "--tokens",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "--backend",
        "torch-eager",
        "--budget",
        "0.3",
        "--no-plots",
        "--out",
        str(out),
    ]
    cmd = [sys.executable, "-m", "compare.sweep", *args]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(_cell_lines(out)) < 2:
            assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
            assert time.monotonic() < deadline, "the sweep wrote no cells in time"
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
        if p.stderr:
            p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    partial = read_sweep(out)  # readable mid-way
    assert 2 <= partial["config"]["progress"]["done"] < 8, "the sweep finished before it was killed"
    assert not (out / "results.json").exists()

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "already done" in done.stderr and "[8/8] torch-eager tokens=8 fp32 fwd" in done.stderr

    grid = [c.key for c in cells_from_config(partial["config"])]
    assert len(grid) == 8
    file_keys = [str(x["key"]) for x in _cell_lines(out)]
    assert collections.Counter(file_keys) == collections.Counter(grid), "a cell was lost or run twice"
    doc = json.loads((out / "results.json").read_text())
    assert _keys(doc["results"]) == grid
    assert all(r["status"] == "ok" and r["timing"]["n"] >= 5 for r in doc["results"])
    assert doc["config"]["progress"] == {"cells": 8, "done": 8, "sessions": 2}
    assert [r["shape"]["batch"] for r in doc["results"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert "## Timing" in (out / "REPORT.md").read_text()


def test_raising_backend_is_an_error_and_the_sweep_goes_on(
    tmp_path: Path, test_backends: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    args = [
        "--preset",
        "tiny",
        "--tokens",
        "1",
        "2",
        "--backend",
        "raising",
        "torch-eager",
        "--budget",
        "0.02",
        "--out",
        str(out),
    ]
    assert main(args) == 1  # an error cell: status 1, like `compare run`
    err = capsys.readouterr().err
    assert "[2/4] torch-eager tokens=1 fp32 fwd" in err and "-> error" in err
    doc = json.loads((out / "results.json").read_text())
    by = collections.defaultdict(list)
    for r in doc["results"]:
        by[r["backend"]].append(r)
    assert [r["status"] for r in by["raising"]] == ["error", "error"]
    assert all("MemoryError: simulated out of memory" in r["reason"] for r in by["raising"])
    assert [r["status"] for r in by["torch-eager"]] == ["ok", "ok"]
    assert "simulated out of memory" in (out / "REPORT.md").read_text()
    assert doc["plots"] == ["plots/time-geglu-d96-h328.png"]  # no speedup plot: nothing else was timed
    assert (out / doc["plots"][0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # rerun: nothing left to do, nothing duplicated; a torn last line (killed inside a write) is dropped
    with (out / JSONL).open("a") as f:
        f.write('{"type": "cell", "key": "torn')
    assert read_sweep(out)["config"]["progress"]["done"] == 4
    assert main(args) == 1
    assert (out / JSONL).read_text().endswith("\n") and "torn" not in (out / JSONL).read_text()
    assert len(_cell_lines(out)) == 4
    assert "4/4 cells already done" in capsys.readouterr().err


def test_isolated_worker_crash_is_recorded_with_its_signal(tmp_path: Path, test_backends: None) -> None:
    out = tmp_path / "sweep"
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--tokens",
                "1",
                "--backend",
                "misbehaving",
                "raising",
                "torch-eager",
                "--budget",
                "0.02",
                "--isolate",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    by = {r.backend: r for r in load_sweep(out).results}
    crash = by["misbehaving"]
    assert crash.status == "error" and crash.reason == "worker process killed by signal SIGSEGV", crash
    assert crash.extras["exit_code"] == -signal.SIGSEGV and crash.extras["signal"] == "SIGSEGV"
    assert by["raising"].status == "error" and "MemoryError: simulated out of memory" in by["raising"].reason
    eager = by["torch-eager"].timing
    assert by["torch-eager"].status == "ok" and eager is not None and eager.n >= 5
    env = json.loads((out / "results.json").read_text())["environment"]
    assert env["precision"]["torch_float32_matmul_precision"] == "highest"  # reported back by the worker
    assert not (out / ".cells").exists()  # scratch files cleaned up


def test_isolated_hang_is_killed_after_the_cell_timeout(tmp_path: Path, test_backends: None) -> None:
    out = tmp_path / "sweep"
    t0 = time.monotonic()
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--tokens",
                "1",
                "--backend",
                "misbehaving",
                "--mode",
                "bwd",
                "--isolate",
                "--cell-timeout",
                "3",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    assert time.monotonic() - t0 < 60
    (r,) = load_sweep(out).results
    assert r.status == "error" and r.reason == "worker process timed out after 3 s and was killed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "1", "2"], "give --preset or --model"),
        (["--preset", "tiny", "--tokens", "3", "--seq", "2"], "token count 3 is not a multiple of --seq 2"),
        (["--preset", "tiny", "--tokens", "0"], "token counts must be positive integers, got 0"),
        (["--preset", "tiny", "--backend", "torch-nope"], "unknown backend 'torch-nope'"),
        (["--preset", "tiny", "--dtype", "float8"], "unknown dtype 'float8'"),
        (["--model", "geglu", "--dim", "8"], "missing: --hidden"),
        (["--preset", "tiny", "--cell-timeout", "5"], "--cell-timeout needs --isolate"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_a_different_grid_in_the_same_folder_is_refused(
    tmp_path: Path, test_backends: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--preset", "tiny", "--backend", "raising", "--no-plots", "--out", str(tmp_path)]
    assert main([*base, "--tokens", "1"]) == 1
    assert main([*base, "--tokens", "1", "2"]) == 2
    assert "holds a different sweep (it differs in: grid)" in capsys.readouterr().err
    assert len(_cell_lines(tmp_path)) == 1


def test_load_sweep_merges_what_cells_saw_and_refuses_non_sweeps(tmp_path: Path) -> None:
    """The GPU name and precision settings appear only once a backend has loaded its framework: cells carry them."""
    from compare.cases import InputError

    config = {
        "grid": {"model": "geglu", "dim": 96, "hidden": 328, "seq": 1, "tokens": [1], "dist": "normal", "seed": 0},
        "backends": ["b"],
        "dtypes": ["float32"],
        "modes": ["fwd"],
        "timing": {},
    }
    header = {
        "type": "header",
        "schema_version": SCHEMA_VERSION,
        "created": "t",
        "config": config,
        "environment": {"gpu": None, "precision": {}, "threads": {}},
    }
    result = {
        "backend": "b",
        "case": "geglu-1x1x96-328-float32-normal-s0",
        "mode": "fwd",
        "status": "ok",
        "threads": {"torch_threads": 2},
    }
    cell = {"type": "cell", "key": "k", "result": result, "precision": {"p": "highest"}, "gpu": "NVIDIA H200"}
    (tmp_path / JSONL).write_text(json.dumps(header) + "\n" + json.dumps(cell) + "\n")
    doc = read_sweep(tmp_path)
    assert doc["environment"] == {"gpu": "NVIDIA H200", "precision": {"p": "highest"}, "threads": {"torch_threads": 2}}
    assert doc["results"] == [result] and doc["config"]["progress"] == {"cells": 1, "done": 1, "sessions": 1}
    with pytest.raises(InputError, match=r"result #0 \(b\) lacks dtype, model, shape"):  # typed: validated
        load_sweep(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        read_sweep(tmp_path / "nowhere.jsonl")
    (tmp_path / "x.jsonl").write_text(json.dumps(cell) + "\n")
    with pytest.raises(InputError, match="does not start with a header line"):
        read_sweep(tmp_path / "x.jsonl")
    (tmp_path / "y.jsonl").write_text(json.dumps(header) + "\n{oops\n" + json.dumps(cell) + "\n")
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        read_sweep(tmp_path / "y.jsonl")
