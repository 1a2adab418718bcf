"""``compare sweep``: resumable after a real SIGKILL with every cell exactly once, failures contained per cell,
hard crashes of a worker recorded under ``--isolate``, every single-device row held to the ceilings measured once per
sweep (``implausible`` beyond them; the CLI tests skip the measurement with ``--no-ceilings``).

This module is also a test-only backend (``BACKEND`` below) for the isolated runs: in a worker process it
segfaults in ``fwd`` and hangs in ``bwd``.
"""

from __future__ import annotations

import argparse
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

import compare.cli.main
from compare.backends import registry
from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.cli.sweep import add_parser, config_from_args
from compare.cost.records import Ceiling, Ceilings
from compare.formats.codec import to_json
from compare.results.document import SCHEMA_VERSION
from compare.run import conductor
from compare.run.grid import cells_from_config
from compare.run.options import RunOptions
from compare.run.store import JSONL, load_sweep, read_sweep
from compare.run.sweep import run_sweep

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent


def main(args: list[str]) -> int:
    """``python -m compare sweep ARGS``, in this process."""
    return compare.cli.main.main(["sweep", *args])


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
        BackendSpec(
            name="raising", framework="none", target="tests.raising_backend", about="raises MemoryError in prepare"
        ),
        BackendSpec(
            name="misbehaving", framework="none", target="tests.test_sweep", about="segfaults (fwd) or hangs (bwd)"
        ),
    ]
    for s in added:
        registry.register(s)
    yield
    for s in added:
        registry.BACKENDS.pop(s.name, None)


def parser_for_sweep() -> argparse.ArgumentParser:
    """The ``sweep`` subcommand's parser, as ``python -m compare`` builds it."""
    top = argparse.ArgumentParser()
    add_parser(top.add_subparsers(dest="command", required=True))
    return top


def _cell_lines(out: Path) -> list[dict[str, object]]:
    """The cell lines of a sweep's store, complete ones only: read while the sweep runs, its last line may be half
    written (what follows the last newline is left out)."""
    path = out / JSONL
    if not path.is_file():
        return []
    lines = [x for x in path.read_text().split("\n")[:-1] if x.strip()]
    return [json.loads(x) for x in lines if x.startswith('{"type": "cell"')]


def _keys(results: list[dict[str, object]]) -> list[str]:
    return [f"{r['backend']}|{r['case']}|{r['mode']}" for r in results]


@pytest.mark.standard
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
        "--no-ceilings",
        "--out",
        str(out),
    ]
    cmd = [sys.executable, "-m", "compare", "sweep", *args]
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
    assert "## Timing" in (out / "DETAILS.md").read_text()


@pytest.mark.standard
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
        "--no-ceilings",
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
    # no speedup plot (nothing else was timed); torch-eager's memory at both token counts (its fwd peaks)
    assert doc["plots"] == ["plots/time-geglu-d96-h328.png", "plots/memory-geglu-d96-h328.png"]
    assert (out / doc["plots"][0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # rerun: nothing left to do, nothing duplicated; a torn last line (killed inside a write) is dropped
    with (out / JSONL).open("a") as f:
        f.write('{"type": "cell", "key": "torn')
    assert read_sweep(out)["config"]["progress"]["done"] == 4
    assert main(args) == 1
    assert (out / JSONL).read_text().endswith("\n") and "torn" not in (out / JSONL).read_text()
    assert len(_cell_lines(out)) == 4
    assert "4/4 cells already done" in capsys.readouterr().err


@pytest.mark.standard
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
                "--no-ceilings",
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


@pytest.mark.standard
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
                "--no-ceilings",
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
        (["--preset", "tiny", "--device-memory", "80 gigs"], "--device-memory: '80 gigs' is not a size"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_a_different_grid_in_the_same_folder_is_refused(
    tmp_path: Path, test_backends: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--preset", "tiny", "--backend", "raising", "--no-plots", "--no-ceilings", "--out", str(tmp_path)]
    assert main([*base, "--tokens", "1"]) == 1
    assert main([*base, "--tokens", "1", "2"]) == 2
    assert "holds a different sweep (it differs in: grid)" in capsys.readouterr().err
    assert len(_cell_lines(tmp_path)) == 1


def test_load_sweep_merges_what_cells_saw_and_refuses_non_sweeps(tmp_path: Path) -> None:
    """The GPU name and precision settings appear only once a backend has loaded its framework: cells carry them."""
    from compare.problem.cases import InputError

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


def _ceilings(flops_per_s: float) -> Ceilings:
    """Hand-made ceilings of float32: a matmul roof of ``flops_per_s`` (and a copy roof no step reaches)."""
    return Ceilings("cpu", {"float32": Ceiling(flops_per_s, 1e15, (64, 64, 64), dtype="float32", device="cpu")})


@pytest.mark.parametrize(("flops_per_s", "status"), [(1e18, "ok"), (1.0, "implausible")], ids=["honest", "beaten"])
def test_rows_are_held_to_the_ceilings_measured_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flops_per_s: float, status: str
) -> None:
    """The sweep measures the ceilings once, before its cells, for the swept dtypes, stores them (header and
    document) and holds every row to them as it is stored: a step faster than the matmul roof is implausible (a
    roof of 1 FLOP/s is beaten by any real step: the negative control), one below it stays ok, with its roofline."""
    calls: list[list[str]] = []

    def measure(dtypes: list[str], *args: object, **kw: object) -> Ceilings:
        calls.append(list(dtypes))
        return _ceilings(flops_per_s)

    monkeypatch.setattr(conductor, "measure_ceilings", measure)
    config = config_from_args(
        parser_for_sweep().parse_args(
            ["sweep", "--preset", "tiny", "--tokens", "1", "2", "--backend", "torch-eager", "--budget", "0.02"]
        )
    )
    doc = run_sweep(config, tmp_path, {"torch-eager": spec("torch-eager")}, RunOptions(ceilings=True))
    assert calls == [["float32"]], "measured once, for the swept dtypes"
    assert doc.ceilings == _ceilings(flops_per_s)
    assert [r.status for r in doc.results] == [status, status]
    for r in doc.results:
        assert r.cost is not None and r.cost.achieved is not None  # the roofline numbers, from the stored ceilings
        assert ("matmul ceiling" in r.implausible) == (status == "implausible"), r.implausible
        if status == "implausible":
            assert r.reason.startswith("implausible: "), r.reason
    assert json.loads((tmp_path / JSONL).read_text().splitlines()[0])["ceilings"] == to_json(_ceilings(flops_per_s))


def test_no_ceilings_measures_nothing_and_judges_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def measure(*args: object, **kw: object) -> Ceilings:
        raise AssertionError("measured with --no-ceilings")

    monkeypatch.setattr(conductor, "measure_ceilings", measure)
    args = ["--preset", "tiny", "--tokens", "1", "--backend", "torch-eager", "--budget", "0.02", "--no-plots"]
    assert main([*args, "--no-ceilings", "--out", str(tmp_path)]) == 0
    doc = load_sweep(tmp_path)
    assert doc.ceilings is None and [r.status for r in doc.results] == ["ok"]
    assert doc.results[0].implausible == ""


def test_the_sweep_records_memory_per_token_count_and_fits_the_device_memory(tmp_path: Path) -> None:
    """Every cell's memory record is stored; the report fits saved bytes against tokens (linear: the residual is
    bytes of rounding at most) and states the largest token count within --device-memory; the plot is written."""
    args = ["--preset", "tiny", "--tokens", "4", "8", "16", "--backend", "torch-eager", "--mode", "fwd+bwd"]
    assert main([*args, "--budget", "0.02", "--no-ceilings", "--device-memory", "1GiB", "--out", str(tmp_path)]) == 0
    doc = load_sweep(tmp_path)
    saved = {r.shape.tokens: r.memory.saved.bytes for r in doc.results if r.memory and r.memory.saved}
    hidden = doc.results[0].shape.hidden
    assert saved == {t: 4 * t * hidden * 4 for t in (4, 8, 16)}  # g, u, a, h: [tokens, hidden] float32 each
    report = (tmp_path / "DETAILS.md").read_text()
    assert "### Memory against tokens" in report and "1 GiB (`--device-memory`)" in report
    largest = (1 << 30) // (4 * hidden * 4)
    assert f"{largest:,} (extrapolated beyond 16)" in report
    assert (tmp_path / "plots" / f"memory-geglu-d{doc.results[0].shape.dim}-h{hidden}.png").is_file()
