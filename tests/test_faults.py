"""The fault-injection suite (``tests/faults.py``): real ``run``, ``sweep`` and tensor-parallel runs on ``tiny``,
interrupted by SIGINT, SIGTERM or SIGKILL at seeded random moments (during the tool's and the frameworks' imports,
inside cells, inside a worker group), each checked for its exit status, its files, the earlier results it must keep
and the processes it must not leave; some are rerun to completion (every fifth; every tenth in the long volley).
Then a full disk (a write wrapper that fails with ENOSPC: a small tmpfs needs privileges a test cannot count on), a
second signal, and a lock race.

``make test`` fires :data:`QUICK` shots (every command and signal, two on the real frameworks); the ``slow`` tier
fires :data:`MANY`, from another seed. What it cannot see:
a signal before the interpreter runs the tool's first line (Python's own handler is in place then), and a machine
that is not Linux (no ``/proc`` to find survivors by)."""

from __future__ import annotations

import collections
import concurrent.futures
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from compare.results.document import read_json
from tests import faults, numpy_backend

pytestmark = [pytest.mark.standard, pytest.mark.skipif(sys.platform != "linux", reason="signals and /proc")]

#: ``make test``'s shots, and the slow tier's. 100 (3 on the real frameworks) give each cheap command about 32 moments
#: (11 per signal) and hit a window of 9% of its life with probability 0.95 (200: 4.4%, at 152 s of a test worker in
#: ``make ci``, 14% of the suite's test time; 100: 98 s alone).
QUICK, MANY = 12, 100
#: Shots in flight at once.
PARALLEL = 4
SEED = 20261202


def _volley(
    tmp_path: Path, n: int, seed: int, real: int, rerun_every: int
) -> collections.Counter[tuple[str, str, int]]:
    """``n`` shots (``real`` of them on torch and JAX); every ``rerun_every``-th cheap one is rerun to completion."""

    def one(i: int, shot: faults.Shot) -> tuple[str, str, int]:
        got = faults.fire(shot, tmp_path / str(i))
        if i % rerun_every == 0 and shot.command != "real":
            faults.rerun_completes(shot, tmp_path / str(i))
        return shot.command, shot.sig.name, got.rc

    shots = faults.plan(n, seed, real)
    for i in range(len(shots)):
        (tmp_path / str(i)).mkdir()
    # four shots at a time (each in its own folder, with its own token): a shot mostly waits for its moment, and
    # a busy machine is one a user's run meets too
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return collections.Counter(pool.map(one, range(len(shots)), shots))


def _say(table: collections.Counter[tuple[str, str, int]]) -> None:
    for (command, sig, rc), n in sorted(table.items()):
        print(f"{command:6s} {sig:8s} exit {rc:4d}: {n}")


def test_twelve_interruptions_at_random_moments(tmp_path: Path) -> None:
    table = _volley(tmp_path, QUICK, SEED, real=2, rerun_every=5)
    _say(table)
    assert sum(table.values()) == QUICK
    # the control: a volley that never signalled would leave only exit 0; at least some shots must land
    assert any(rc != 0 for (_, _, rc) in table), table


@pytest.mark.slow
def test_a_hundred_interruptions_at_random_moments(tmp_path: Path) -> None:
    table = _volley(tmp_path, MANY, SEED + 1, real=3, rerun_every=10)
    _say(table)
    assert sum(table.values()) == MANY


def test_the_checks_catch_a_run_that_leaves_a_worker_behind(tmp_path: Path) -> None:
    """Negative control for the survivor check: a process started with the shot's token and left running is found."""
    token = uuid.uuid4().hex
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={faults.TOKEN_ENV: token}, start_new_session=True
    )
    try:
        time.sleep(0.2)
        assert faults.survivors(token) == [p.pid]
    finally:
        p.kill()
        p.wait()
    assert faults.wait_gone(token) == []


@pytest.mark.parametrize("where", ["store:4", "summary"])
def test_a_full_disk_keeps_the_store_and_says_how_to_rebuild(tmp_path: Path, where: str) -> None:
    """ENOSPC on the fourth store line (one cell stored), or on every summary file (all four stored): exit 4, the
    message names the store and the rebuild, and ``compare report DIR`` (with space again) rebuilds results.json
    holding every stored cell."""
    argv, cells = faults.COMMANDS["run"]
    out = tmp_path / "o"
    p = faults.start(argv, out, uuid.uuid4().hex, {"FUSION_COMPARE_TEST_ENOSPC": where})
    rc = p.wait(timeout=faults.RUN_S)
    err = (tmp_path / "o.err").read_text()
    assert rc == 4, err
    assert "No space left on device" in err and f"python -m compare report {out}" in err, err
    assert "from this run's store (run " in err and "not from an older run's results.json" in err, err
    stored = faults.store_cells(out, "run")
    assert len(stored) == (1 if where == "store:4" else cells), stored  # after the header and a resolution line
    assert not (out / "results.json").exists()
    assert faults.report(out) == 0
    assert set(faults.doc_cells(read_json(out / "results.json"))) == set(stored)


def test_two_runs_racing_for_one_folder_one_wins_and_the_other_is_refused(tmp_path: Path) -> None:
    argv, cells = faults.COMMANDS["run"]
    out = tmp_path / "o"
    out.mkdir()
    a = faults.start(argv, out, uuid.uuid4().hex)
    b = subprocess.Popen(
        [sys.executable, "-c", faults.PREAMBLE, *argv, "--out", str(out)],
        cwd=faults.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    b_err = b.communicate(timeout=faults.RUN_S)[1].decode()
    rcs = sorted([a.wait(timeout=faults.RUN_S), b.returncode])
    assert rcs == [0, 2], rcs
    a_err = (tmp_path / "o.err").read_text()
    loser = b_err if "in use by another command" in b_err else a_err
    assert "is in use by another command (pid " in loser and "python -m compare run" in loser, (a_err, b_err)
    assert len(faults.doc_cells(read_json(out / "results.json"))) == cells


def test_a_second_signal_stops_at_once_with_the_store_intact(tmp_path: Path) -> None:
    """SIGTERM inside a cell, SIGINT right after: exit 130 at once; every stored line is whole."""
    argv, _ = faults.COMMANDS["run"]
    out = tmp_path / "o"
    token = uuid.uuid4().hex
    p = faults.start(argv, out, token, {"FUSION_COMPARE_TEST_STEP_S": "0.5"})
    deadline = time.monotonic() + faults.RUN_S
    while not faults.store_cells(out, "run"):
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "o.err").read_text()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 130
    assert faults.wait_gone(token) == []
    assert "again: stopping now" in (tmp_path / "o.err").read_text()
    assert faults.report(out) == 0
    assert set(faults.doc_cells(read_json(out / "results.json"))) == set(faults.store_cells(out, "run"))


# --- each defect of the issue, reproduced as it was reported ----------------------------------------------------


def _wait_for(p: subprocess.Popen[bytes], err: Path, text: str, timeout_s: float = faults.RUN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in err.read_text(errors="replace"):
        assert p.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-3000:]
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_jax_loads_stops_the_run_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    """The signal the moment ``run --backend torch-eager jax-xla`` starts preparing jax-xla (JAX loads then; Python's
    own handler crashed the process there with SIGSEGV or SIGABRT, or XLA swallowed the interrupt and the run exited
    0): exit 130, no traceback and no ignored exception, a valid results.json that says it was interrupted, and no
    process left."""
    argv, _ = faults.COMMANDS["real"]
    out, err = tmp_path / "o", tmp_path / "o.err"
    token = uuid.uuid4().hex
    p = faults.start([*argv, "--verbose"], out, token)
    _wait_for(p, err, "jax-xla: prepare and first calls")
    p.send_signal(sig)
    assert p.wait(timeout=faults.END_S) == 130, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text and "Exception ignored" not in text, text
    assert f"{sig.name}: stopping after the cell in flight" in text
    assert faults.wait_gone(token) == []
    assert read_json(out / "results.json").interrupted


def test_an_interrupted_tp_run_keeps_the_tp_cells_it_finished(tmp_path: Path) -> None:
    """SIGINT while the worker group hangs in its second cell: the group is ended and its finished first cell is in
    results.json (it was dropped: "saved 0 finished cells")."""
    argv = ["run", *faults.TINY, "--backend", "fake-tp", "--dtype", "float32", "--mode", "fwd", "bwd"]
    out, err = tmp_path / "o", tmp_path / "o.err"
    token = uuid.uuid4().hex
    p = faults.start(argv, out, token, {"FAKE_TP_FAULT": "hang@bwd"})
    _wait_for(p, err, "fake-tp geglu")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=faults.END_S) == 130, err.read_text()
    assert faults.wait_gone(token) == []
    doc = read_json(out / "results.json")
    assert [(r.backend, r.mode, r.status) for r in doc.results] == [("fake-tp", "fwd", "ok")]
    assert "saved 1 finished cells" in err.read_text()


def _first_prepare(p: subprocess.Popen[bytes], marks: Path, err: Path, other_than: int | None = None) -> None:
    """Wait until a process other than ``other_than`` has prepared a ``numpy-plain`` step (the mark it leaves in
    ``marks``: ``tests.numpy_backend``): the moment is the run's own, not a time guessed from this machine's speed."""
    deadline = time.monotonic() + faults.RUN_S
    while not [m for m in marks.iterdir() if m.suffix != f".{other_than}"]:
        assert p.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-3000:]
        time.sleep(0.02)


def test_an_interrupted_run_never_reduces_an_earlier_runs_results(tmp_path: Path) -> None:
    """A complete run, then the same run interrupted inside its first cell (the signal once the cell's step is
    prepared; its first call sleeps 2 s): the earlier results.json and REPORT.md stay as they were; the interrupted
    run's document goes to results.interrupted.json. (A fixed second after the start landed before any cell here,
    and before the tool's handlers on a slow enough machine.)"""
    argv, cells = faults.COMMANDS["run"]
    out, err, marks = tmp_path / "o", tmp_path / "o.err", tmp_path / "marks"
    marks.mkdir()
    assert faults.start(argv, out, uuid.uuid4().hex).wait(timeout=faults.RUN_S) == 0
    before = (out / "results.json").read_bytes(), (out / "REPORT.md").read_bytes()
    p = faults.start(
        argv, out, uuid.uuid4().hex, {"FUSION_COMPARE_TEST_STEP_S": "2", numpy_backend.MARK_ENV: str(marks)}
    )
    _first_prepare(p, marks, err)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=faults.END_S) == 130, err.read_text()
    assert ((out / "results.json").read_bytes(), (out / "REPORT.md").read_bytes()) == before
    assert len(faults.doc_cells(read_json(out / "results.json"))) == cells
    assert read_json(out / "results.interrupted.json").interrupted
    assert "kept the earlier run's" in err.read_text()


def test_a_run_into_a_running_sweeps_folder_is_refused(tmp_path: Path) -> None:
    """``run`` and ``sweep`` hold the same lock: a run into a sweep's folder while it runs exits 2 naming the sweep
    (it replaced the sweep's results.json), and so does ``report DIR``."""
    argv, _ = faults.COMMANDS["sweep"]
    out, err = tmp_path / "o", tmp_path / "o.err"
    token = uuid.uuid4().hex
    p = faults.start(argv, out, token, {"FUSION_COMPARE_TEST_STEP_S": "1"})
    try:
        deadline = time.monotonic() + faults.RUN_S
        while not (out / "results.jsonl").is_file():
            assert p.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        for cmd in (["run", *faults.TINY, "--backend", "numpy-plain", "--out", str(out)], ["report", str(out)]):
            r = subprocess.run(
                [sys.executable, "-c", faults.PREAMBLE, *cmd],
                cwd=faults.ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 2, r.stderr
            assert "is in use by another command (pid " in r.stderr and "python -m compare sweep" in r.stderr, r.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=faults.END_S)
    assert faults.wait_gone(token) == []


def test_sigkill_of_an_isolated_sweep_takes_its_worker_with_it(tmp_path: Path) -> None:
    """SIGKILL of the ``sweep --isolate`` parent (which can end nothing itself): its worker, in a cell that would
    run for a minute, dies with it (Linux's parent-death signal) instead of running on with parent pid 1."""
    argv, _ = faults.COMMANDS["sweep"]
    out, err, marks = tmp_path / "o", tmp_path / "o.err", tmp_path / "marks"
    marks.mkdir()
    token = uuid.uuid4().hex
    p = faults.start(argv, out, token, {"FUSION_COMPARE_TEST_STEP_S": "60", numpy_backend.MARK_ENV: str(marks)})
    # the worker has prepared its cell's step, so it has asked for its parent-death signal (its first act:
    # compare.run.cell_worker), whatever this machine's speed (a fixed half second was the guess before)
    _first_prepare(p, marks, err, other_than=p.pid)
    p.kill()
    p.wait()
    assert faults.wait_gone(token, timeout_s=5) == []
