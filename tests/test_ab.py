"""``python -m compare ab``: two worker processes, one per side, timed in one interleaved group and judged by the gate.

The A/A control (the same interpreter and checkout on both sides) must call no difference in at least 18 of 20
trials, on a quiet machine and with one core kept busy by another process; it runs the framework-free
``numpy-plain`` (``tests.numpy_backend``, about 1 s a trial) with one thread a side, and one trial runs torch-eager,
the real path. A side that sleeps each step, and one with one thread of two on ``cpu-mlp``, are found slower; a
side whose worker dies or cannot start is an error row for that side with the other side's rows kept; bad input
exits 2 naming it. The verdicts are pure functions of the document (``compare.report.ab``), checked on made-up
timings."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from compare.backends.registry import register, unregister
from compare.cli.main import main
from compare.problem.cases import InputError, preset
from compare.report import history as view
from compare.report.ab import findings, paired_verdicts, render, summary_lines, verdict
from compare.results import history
from compare.results.ab import ABResults, Pair, Process, Side, read_json, write_json
from compare.results.document import Result
from compare.results.environment import Environment
from compare.results.load import Load
from compare.run.ab import QUIET_IDLE, Plan, run_ab, side_env
from compare.timing.significance import PAIRED, compare_timing
from compare.timing.timer import INTERLEAVED, Timing, TimingConfig
from tests import numpy_backend
from tests import other_torch as other
from tests.faults import TOKEN_ENV, wait_gone

ROOT = Path(__file__).resolve().parent.parent
TINY = preset("tiny").case("float32")
#: One thread a side: a pool of two threads on a 2-core machine with a busy core sits, for a whole trial, with one
#: thread on the busy core in one process and not the other (docs/ab-and-history.md, "Two processes are not one").
ONE_THREAD = ["OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"]


@pytest.fixture
def numpy_plain() -> Iterator[str]:
    """``numpy-plain`` registered here; the workers are sent its registry line (their registry lacks it)."""
    register(numpy_backend.SPEC)
    try:
        yield numpy_backend.NAME
    finally:
        unregister(numpy_backend.NAME)


def _ab(tmp_path: Path, *args: str) -> tuple[int, ABResults | None]:
    out = tmp_path / "ab"
    status = main(["ab", "--preset", "tiny", *args, "--out", str(out)])
    return status, read_json(out / "ab.json") if (out / "ab.json").is_file() else None


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a", "/no/such/python3"], "--a '/no/such/python3': no such Python interpreter"),
        (["--b", "python-that-is-not-there"], "--b 'python-that-is-not-there': no such Python interpreter"),
        (["--a-env", "OMP_NUM_THREADS"], "--a-env 'OMP_NUM_THREADS' is not NAME=VALUE"),
        (["--b-env", "=1"], "--b-env '=1' is not NAME=VALUE"),
        (["--b-path", "/"], "--b-path / is not a checkout of fusion-compare"),
        (["--backend", "torch-tp"], "not the tensor-parallel torch-tp"),
    ],
)
def test_bad_input_exits_2_naming_it(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, doc = _ab(tmp_path, "--backend", "torch-eager", *args)
    assert status == 2 and doc is None
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.quick
def test_an_idle_side_sleeps_unless_told_otherwise() -> None:
    assert side_env({}, {}) == QUIET_IDLE
    assert side_env({"OMP_WAIT_POLICY": "active"}, {})["OMP_WAIT_POLICY"] == "active"
    assert "KMP_BLOCKTIME" not in side_env({}, {"KMP_BLOCKTIME": "200"})


@pytest.mark.quick
def test_a_worker_keeps_its_main_thread_on_the_cpu_it_is_sent_while_timed() -> None:
    """``Worker.place``: the calling thread alone is kept on the CPU (a thread started before keeps every CPU), one
    it may not use leaves it where it is, and None gives it every CPU again."""
    import threading

    from compare.run.ab_worker import Worker

    w, every = Worker(), os.sched_getaffinity(0)
    seen: list[set[int]] = []
    other = threading.Thread(target=lambda: (started.wait(10), seen.append(os.sched_getaffinity(0))))
    started = threading.Event()
    other.start()
    try:
        cpu = max(every)
        assert w.place(cpu) == cpu and os.sched_getaffinity(0) == {cpu}
        started.set()
        other.join(10)
        assert seen == [every]
        assert w.place(max(every) + 1) is None and os.sched_getaffinity(0) == {cpu}
    finally:
        assert w.place(None) is None and os.sched_getaffinity(0) == every


# ---- the verdicts, on made-up timings ----------------------------------------------------------------------------


def _timing(per_call_s: list[float], group: str = "g#1") -> Timing:
    s = sorted(per_call_s)
    n = len(s)
    return Timing(
        s[n // 2], s[3 * n // 4] - s[n // 4], s[0], s[-1], n, 1, 0.01, 3, tuple(per_call_s), INTERLEAVED, group,
        tuple(range(n)),
    )  # fmt: skip


def _pair(a_s: list[float] | None, b_s: list[float] | None, b_status: str = "ok") -> Pair:
    def row(samples: list[float] | None, status: str) -> Result:
        return Result.for_case(
            "numpy-plain", TINY, "fwd", status, timing=_timing(samples) if samples else None, reason=status
        )

    return Pair("numpy", row(a_s, "ok"), row(b_s, b_status))


@pytest.mark.quick
def test_the_verdicts_are_the_paired_tests() -> None:
    a = [1e-3 * (1 + 0.01 * (i % 3)) for i in range(12)]
    slower = _pair(a, [2 * x for x in a])
    v = verdict(slower)
    assert v.slower and v.timing == "slower" and v.ratio_cell.startswith("2.00x: slower (p 0.00024, 12 rounds")
    assert verdict(_pair(a, list(reversed(a)))).timing == "same"
    assert verdict(_pair(a, [x / 2 for x in a])).timing == "faster"
    assert verdict(_pair(a[:6], a[:6])).timing == "not tested (6 rounds)"
    assert verdict(_pair(a, None, "error")).timing == "not tested: B not timed: error"
    busy = Load(window_s=1.0, cores=2, others_cpu_s=0.5)  # others took a quarter of the cores
    assert verdict(slower, busy).timing == "ambiguous" and not verdict(slower, busy).slower
    assert verdict(slower, Load(window_s=1.0, cores=2, others_cpu_s=0.1)).slower  # 5%: explains up to 1.05x
    doc = ABResults(a=Side("A", "py", "/a"), b=Side("B", "py", "/b"), pairs=(slower, _pair(a, None, "error")))
    found = findings(doc)
    assert len(found) == 2 and "B slower than A" in found[0] and "error in B: error" in found[1], found
    deviates = findings(ABResults(pairs=(_pair(a, a, "deviates"),)))
    assert len(deviates) == 1 and "B loses parity (ok in A, deviates in B" in deviates[0], deviates
    assert slower.a.timing is not None and slower.b.timing is not None
    assert compare_timing(slower.a.timing, slower.b.timing).design == PAIRED
    md = render(doc)
    assert "**Finding**" in md and "2.00x: slower" in md and "## Errors" in md


def _processes(levels_ms: Sequence[float], seed: int) -> tuple[Process, ...]:
    """One worker process per level: 12 rounds of one group, each sample the level with a 2% lognormal jitter."""
    rng = random.Random(seed)
    return tuple(
        Process(1000 + i, "ok", _timing([m * 1e-3 * math.exp(rng.gauss(0, 0.02)) for _ in range(12)]))
        for i, m in enumerate(levels_ms)
    )


def _process_pair(a_ms: Sequence[float], b_ms: Sequence[float], seed: int = 0) -> Pair:
    """A pair whose sides' rows are their first workers' and whose per-process figures are ``a_ms`` and ``b_ms``."""
    pa, pb = _processes(a_ms, seed), _processes(b_ms, seed + 1)
    row = _pair(None, None)
    return Pair("jax", replace(row.a, timing=pa[0].timing), replace(row.b, timing=pb[0].timing), pa, pb)


@pytest.mark.quick
def test_a_process_offset_within_a_side_is_noise_not_a_difference() -> None:
    """The issue's A/A: a process of one build sits at 32-34 ms and another at 40 ms for a whole trial. One worker a
    side, the paired test calls that different (the defect); with three a side, a side whose processes differ so
    widens the band to their range, and nothing is called, in any placement of the levels."""
    a0, b0 = _processes([32.0], 0)[0].timing, _processes([40.0], 1)[0].timing
    assert a0 is not None and b0 is not None
    assert compare_timing(a0, b0).verdict == "slower"  # within one pair of processes: "different"
    for a_ms, b_ms in (([32, 40, 33], [40, 33, 39]), ([32, 33, 32], [40, 40, 33]), ([40, 32, 40], [33, 32, 34])):
        p = _process_pair(a_ms, b_ms)
        v = verdict(p)
        assert v.timing == "same" and not v.slower, (a_ms, b_ms, v)
        assert "3+3 processes" in v.ratio_cell and v.timing_verdict is not None
        assert v.timing_verdict.between == pytest.approx(0.25, abs=0.06) and v.timing_verdict.between_measured
        assert not findings(ABResults(pairs=(p,), workers=3))
    # one worker a side (a schema-1 document): the spread is not measured, and 25% is within the floor
    one = _process_pair([32], [40])
    assert verdict(one).timing == "same" and "not measured: floor 30%" in verdict(one).ratio_cell


@pytest.mark.quick
def test_a_difference_beyond_the_between_process_spread_is_called() -> None:
    """B's three processes at 48-50 ms against A's at 32-34 ms (each side's range 6%): slower, a finding; the
    mirror image faster; and a one-worker pair 2x apart is still beyond the floor."""
    p = _process_pair([32, 34, 33], [48, 50, 49])
    v = verdict(p)
    assert v.slower and v.timing == "slower" and v.ratio == pytest.approx(49 / 33, rel=0.03), v
    assert v.p is not None and v.p < 0.01 and "3+3 processes" in v.ratio_cell
    assert findings(ABResults(pairs=(p,), workers=3))
    assert verdict(_process_pair([48, 50, 49], [32, 34, 33])).timing == "faster"
    assert verdict(_process_pair([32], [64])).slower


@pytest.mark.standard  # about a second of t-tests
def test_the_process_rule_false_alarm_rate_with_processes_on_two_levels() -> None:
    """A/A where each process falls on 32 or 40 ms at random (the issue's jax-xla): the rule's false alarms stay
    near the 1.6% a direction that all of one side on one level and all of the other on the other makes (2^-6)."""
    rng = random.Random(7)
    trials, called = 400, 0
    for i in range(trials):
        a, b = ([rng.choice([32.0, 40.0]) for _ in range(3)] for _ in range(2))
        called += verdict(_process_pair(a, b, seed=i)).test != "same"
    assert called <= 0.05 * trials, called


@pytest.mark.quick
def test_an_ab_json_with_per_process_figures_round_trips(tmp_path: Path) -> None:
    """Schema 2 writes and reads back each worker's figures; a schema-1 document (one worker a side, no per-process
    figures) still reads and is judged; another schema is refused naming what it reads (exit 2 in the CLI)."""
    pair = _process_pair([32, 40, 33], [40, 33, 39])
    doc = ABResults(a=Side("A", "py", "/a"), b=Side("B", "py", "/b"), pairs=(pair,), workers=3)
    path = tmp_path / "ab.json"
    write_json(path, doc)
    back = read_json(path)
    assert back == doc and back.schema_version == 2 and len(back.pairs[0].b_processes) == 3
    data = json.loads(path.read_text(encoding="utf-8"))
    assert [x["pid"] for x in data["pairs"][0]["a_processes"]] == [1000, 1001, 1002]
    for pair in data["pairs"]:
        del pair["a_processes"], pair["b_processes"]
    del data["workers"]
    path.write_text(json.dumps({**data, "schema_version": 1}), encoding="utf-8")
    old = read_json(path)
    assert old.workers == 1 and old.pairs[0].a_processes == () and verdict(old.pairs[0]).timing == "same"
    path.write_text(json.dumps({**data, "schema_version": 99}), encoding="utf-8")
    with pytest.raises(InputError, match=r"schema_version 99; it reads 1, 2"):
        read_json(path)
    assert main(["report", str(path)]) == 2


@pytest.mark.quick
def test_ab_says_what_sets_b_apart_from_a() -> None:
    """Two sides of one commit and versions that differ in a variable alone: AB.md and the printed lines name it
    (a "1.96x slower" read beside identical versions and nothing else); two identical sides say so (the control)."""
    pair = _process_pair([32, 40, 33], [40, 33, 39])
    same = Side("A", "py", "/a", {"OMP_NUM_THREADS": "2"}, "c1", "3.11.7", {"torch": "2.13.0"})
    doc = ABResults(a=same, b=replace(same, name="B"), pairs=(pair,), workers=3)
    assert "B differs from A in: nothing recorded (the same build and settings)." in render(doc)
    doc = replace(doc, b=replace(same, name="B", env={"OMP_NUM_THREADS": "2", "FOO": "1"}))
    assert "B differs from A in: $FOO - -> 1." in render(doc)
    assert "B differs from A in: $FOO - -> 1" in summary_lines(doc)


@pytest.mark.quick
def test_an_ab_json_is_validated_on_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A timing whose samples and rounds differ, and a document of only its schema version, exit 2 naming the file
    and what is wrong (the first was exit 3 in ``report``, at a ``zip``; the second rendered "No finding", exit 0)."""
    pair = _process_pair([32, 40, 33], [40, 33, 39])
    path = tmp_path / "ab.json"
    write_json(path, ABResults(a=Side("A", "py", "/a"), b=Side("B", "py", "/b"), pairs=(pair,), workers=3))
    data = json.loads(path.read_text(encoding="utf-8"))
    timing = data["pairs"][0]["b"]["timing"]
    assert len(timing["rounds"]) == len(timing["samples_s"]) > 1
    timing["rounds"] = timing["rounds"][:-1]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match=r"pairs\[0\]\.b\.timing.*rounds has \d+ items but samples_s has \d+"):
        read_json(path)
    assert main(["report", str(path)]) == 2
    path.write_text(json.dumps({"schema_version": 1}), encoding="utf-8")
    assert main(["report", str(path)]) == 2
    assert "lacks created, command, timing, a, b, pairs" in capsys.readouterr().err


@pytest.mark.quick
def test_an_ab_entry_is_side_b_flagged_by_the_ab_verdict(tmp_path: Path) -> None:
    """``ab --history``'s entry: B's rows, commit and versions on this machine, A named as the baseline; the history
    flags B's point by the A/B verdict (slower here), and an ambiguous one (a busy machine) flags nothing."""
    a = [1e-3 * (1 + 0.01 * (i % 3)) for i in range(12)]
    slower = _pair(a, [2 * x for x in a])
    sides = dict(a=Side("A", "py", "/a", commit="a" * 40, versions={"numpy": "2.3"}),
                 b=Side("B", "py", "/b", commit="b" * 40 + "+modified", versions={"numpy": "2.4"}))  # fmt: skip
    env = Environment(cpu="a CPU", cpu_count=2, cpu_isa=("avx2",), versions={"numpy": "9"})
    for load, flag in ((None, "slower"), (Load(window_s=1.0, cores=2, others_cpu_s=0.5), "")):
        doc = ABResults(pairs=(slower,), load=load, **sides)
        e = history.ab_entry(doc, env, paired_verdicts(doc))
        assert e.kind == "ab" and e.source == history.Source("b" * 40, True, None) and e.versions == {"numpy": "2.4"}
        assert e.results.results == (slower.b,) and e.machine == history.machine_of(env)
        (pv,) = e.paired
        assert pv.baseline == "aaaaaaa (numpy 2.3)" and pv.ratio == pytest.approx(2.0) and pv.p is not None
        (cell,) = view.build([e], e.machine).cells
        assert (cell.newest.flag, cell.newest.by) == ((flag, "A/B vs aaaaaaa (numpy 2.3)") if flag else ("", ""))


@pytest.mark.standard
def test_ab_history_appends_side_b_and_the_history_command_reads_it(numpy_plain: str, tmp_path: Path) -> None:
    """The CLI's path: ``ab --history H`` appends one ``ab`` entry whose paired verdicts are the A/B report's, and
    ``history H`` flags B's point (exit 1) exactly when ``ab`` called B slower; ``report`` rebuilds AB.md. (B sleeps
    5 ms a step: on a quiet machine it is called slower; beside other tests the load makes it ambiguous, and nothing
    is flagged.)"""
    h = tmp_path / "h"
    status, doc = _ab(
        tmp_path, "--backend", numpy_plain, "--budget", "0.05", "--history", str(h), "--a-env", *ONE_THREAD,
        "--b-env", *ONE_THREAD, f"{numpy_backend.STEP_ENV}=0.005",
    )  # fmt: skip
    assert doc is not None and status in (0, 1)
    (path,) = h.glob("*/*.json")
    e = history.load(json.loads(path.read_text(encoding="utf-8")), str(path))
    (p,) = doc.pairs
    v = verdict(p, doc.load)
    assert e.kind == "ab" and e.versions == doc.b.versions and e.results.results == (p.b,)
    assert [(x.backend, x.verdict, x.ratio) for x in e.paired] == [(p.b.backend, v.timing, v.ratio)]
    flagged = v.timing == "slower"
    assert main(["history", str(h), "--out", str(tmp_path / "view")]) == int(flagged)
    assert ("**slower** (A/B vs " in (tmp_path / "view" / "HISTORY.md").read_text(encoding="utf-8")) == flagged
    md = tmp_path / "ab" / "AB.md"  # `report` rebuilds AB.md from ab.json, the folder's or the file's
    written = md.read_text(encoding="utf-8")
    for where in (md.parent, md.parent / "ab.json"):
        md.unlink()
        assert main(["report", str(where)]) == 0 and md.read_text(encoding="utf-8") == written


# ---- real workers ------------------------------------------------------------------------------------------------


def _trial() -> str:
    """One A/A trial on ``tiny`` float32 fwd, one thread a side: the timing verdict."""
    plan = Plan((TINY,), (numpy_backend.SPEC,), ("fwd",), TimingConfig(budget_s=0.05), profile=False, memory=False)
    env = side_env(dict(x.split("=") for x in ONE_THREAD))
    doc = run_ab(Side("A", sys.executable, str(ROOT), env), Side("B", sys.executable, str(ROOT), env), plan)
    (p,) = doc.pairs
    assert p.a.status == "ok" and p.b.status == "ok", (p.a.reason, p.b.reason)
    assert p.a.timing is not None and p.b.timing is not None and p.a.timing.group == p.b.timing.group
    assert p.a.extras["ab_cpu"] == p.b.extras["ab_cpu"] is not None  # both main threads on one CPU while timed
    return verdict(p).test


@pytest.mark.slow
@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "one-core-busy"])
def test_a_a_calls_no_difference_in_18_of_20_trials(numpy_plain: str, busy: bool) -> None:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        calls = [_trial() for _ in range(20)]
    finally:
        if hog is not None:
            hog.kill()
            hog.wait(timeout=10)
    assert calls.count("same") >= 18, calls


@pytest.mark.standard
def test_a_a_with_torch_eager(tmp_path: Path) -> None:
    """The real path through the CLI: torch in both workers, their versions and commit said, paired timings, both
    judged ok; no difference called (an A/A false call has a chance of about 1%: one more trial is allowed)."""
    args = ["--backend", "torch-eager", "--budget", "0.1", "--a-env", *ONE_THREAD, "--b-env", *ONE_THREAD]
    for attempt in range(2):
        status, doc = _ab(tmp_path / str(attempt), *args)
        assert doc is not None
        (p,) = doc.pairs
        assert p.a.status == "ok" and p.b.status == "ok", (p.a.reason, p.b.reason)
        assert doc.a.versions.get("torch") and doc.a.commit and doc.b.versions == doc.a.versions
        assert doc.a.env["OMP_NUM_THREADS"] == "1" and doc.a.env["OMP_WAIT_POLICY"] == "passive"
        assert p.a.threads.get("torch_intra_op") == 1 and p.b.threads.get("torch_intra_op") == 1  # the side's env
        assert p.a.kernels is not None and p.b.kernels is not None  # profiled by default
        if verdict(p).timing == "same":
            assert status == 0
            md = (tmp_path / str(attempt) / "ab" / "AB.md").read_text(encoding="utf-8")
            assert "torch 2" in md and "No finding" in md
            return
    pytest.fail(f"an A/A pair of torch-eager was called different twice: {verdict(p)}")


@pytest.mark.standard
def test_a_dead_worker_is_an_error_row_for_its_side(numpy_plain: str, tmp_path: Path) -> None:
    """B's worker kills itself at its sixth step, in each mode: B's rows are errors with the signal, A's are kept and
    timed, the next mode starts B a new worker, the exit status is a finding, and no worker is left."""
    t0, token = time.monotonic(), f"{TOKEN_ENV}=ab-{uuid.uuid4().hex}"
    status, doc = _ab(
        tmp_path, "--backend", numpy_plain, "--mode", "fwd", "bwd", "--budget", "0.05",
        "--a-env", token, "--b-env", token, f"{numpy_backend.DIE_ENV}=6",
    )  # fmt: skip
    assert wait_gone(token.split("=")[1]) == []
    assert status == 1 and doc is not None
    assert [(p.a.status, p.b.status) for p in doc.pairs] == [("ok", "error")] * 2
    for p in doc.pairs:
        assert p.a.timing is not None and p.a.timing.n >= 10
        assert "side B: its worker was killed by signal SIGKILL" in p.b.reason, p.b.reason
    assert time.monotonic() - t0 < 60


@pytest.mark.standard
def test_a_signal_while_the_workers_end_exits_130_and_keeps_the_last_ab_json(
    numpy_plain: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT sent as the first worker is told to end (after the last look at the flag between cells): exit 130,
    the previous ``ab.json`` untouched and no worker left. It was "stopping after the cell in flight", then the
    previous ``ab.json`` overwritten and exit 0."""
    import signal

    from compare.run import ab as ab_run

    out = tmp_path / "ab"
    out.mkdir()
    (out / "ab.json").write_text("the previous run's\n")
    close, sent = ab_run.Remote.close, []

    def interrupted(self: ab_run.Remote) -> None:
        if not sent:  # once: a second signal ends the process at once, by design
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        close(self)

    monkeypatch.setattr(ab_run.Remote, "close", interrupted)
    token = f"{TOKEN_ENV}=ab-{uuid.uuid4().hex}"
    args = ["--backend", numpy_plain, "--mode", "fwd", "--budget", "0.05", "--a-env", token]
    status = main(["ab", "--preset", "tiny", *args, "--out", str(out)])
    assert wait_gone(token.split("=")[1]) == []
    assert status == 130
    assert (out / "ab.json").read_text() == "the previous run's\n"


@pytest.mark.standard
def test_an_environment_value_that_is_not_utf_8_reaches_the_worker_and_is_recorded_escaped(
    numpy_plain: str, tmp_path: Path
) -> None:
    """``--b-env $'FOO=\\xff'``: B's worker runs with it and ``ab.json`` and ``AB.md`` record it escaped; it was exit
    3 at the folder's lock."""
    status, doc = _ab(tmp_path, "--backend", numpy_plain, "--mode", "fwd", "--budget", "0.05", "--b-env",
                      os.fsdecode(b"FOO=\xff"))  # fmt: skip
    assert status in (0, 1) and doc is not None
    assert [(p.a.status, p.b.status) for p in doc.pairs] == [("ok", "ok")]
    assert "FOO=\\xff" in doc.command
    assert "FOO=\\xff" in (tmp_path / "ab" / "AB.md").read_text(encoding="utf-8")


@pytest.mark.standard
def test_a_worker_that_cannot_start_is_an_error_row_for_its_side(numpy_plain: str, tmp_path: Path) -> None:
    status, doc = _ab(tmp_path, "--backend", numpy_plain, "--budget", "0.05", "--b-env", "PYTHONHOME=/nonexistent")
    assert status == 1 and doc is not None
    (p,) = doc.pairs
    assert p.a.status == "ok" and p.a.timing is not None and p.b.status == "error"
    assert "exited with status 1 (waiting for its handshake)" in p.b.reason, p.b.reason
    assert doc.b.problem == p.b.reason.removeprefix("side B: ") and not doc.a.problem


@pytest.mark.slow
@pytest.mark.quiet  # a second thread needs a free core: in `make ci`, alone, after the two test workers are done
def test_b_with_one_thread_is_slower_on_cpu_mlp(tmp_path: Path) -> None:
    """The issue's own case: B with one thread against A with two, torch-eager on ``cpu-mlp`` float32, slower beyond
    the noise of the paired ratio (a CI machine's rounds spread +/-27% a side; B was slower in each of them). Where
    ab finds no difference, the test measures what a second thread buys outside the tool: below 1.25x on a GEMM of
    the case (a hyperthread sibling, a shared core), "same" is the right answer and the test skips saying so; above
    it, ab missed a real difference and the test fails."""
    out = tmp_path / "ab"
    status = main(
        ["ab", "--preset", "cpu-mlp", "--backend", "torch-eager", "--no-profile", "--out", str(out),
         "--a-env", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2", "--b-env", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"]
    )  # fmt: skip
    doc = read_json(out / "ab.json")
    (p,) = doc.pairs
    assert p.a.threads.get("torch_intra_op") == 2 and p.b.threads.get("torch_intra_op") == 1
    assert p.a.status == "ok" and p.b.status == "ok" and doc.load is not None
    v = verdict(p, doc.load)
    if doc.load.busy:  # a second thread needs a free core; and a busy machine's difference is not a finding
        if v.test != "slower":
            pytest.skip(f"other work held the cores: {doc.load.describe()}; B/A {v.ratio_cell}")
        assert v.timing == "ambiguous" and status == 0, (v, status)
    elif not v.slower:  # a machine whose second thread buys little (a core's hyperthread sibling) has no finding
        gain = _second_thread_gain()
        if gain < SECOND_THREAD_GAIN:
            pytest.skip(f"this machine's second thread buys {gain:.2f}x on a cpu-mlp GEMM; B/A {v.ratio_cell}")
        pytest.fail(f"a second thread buys {gain:.2f}x on a cpu-mlp GEMM here, yet ab said {v} (exit {status})")
    else:
        assert status == 1, (v, status)


#: What a second thread must buy on a cpu-mlp GEMM, measured outside the tool, for ab's one-thread B to be slower.
SECOND_THREAD_GAIN = 1.25


def _second_thread_gain() -> float:
    """The ``[1024, 768] @ [768, 3072]`` float32 GEMM's best of 7 with one thread over its best of 7 with two, in
    this process, outside the tool: what the second thread buys on this machine now."""
    import torch

    x, w = torch.randn(1024, 768), torch.randn(768, 3072)
    before, best = torch.get_num_threads(), {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            times = []
            for _ in range(9):
                t0 = time.perf_counter()
                torch.matmul(x, w)
                times.append(time.perf_counter() - t0)
            best[n] = min(times[2:])
    finally:
        torch.set_num_threads(before)
    return best[1] / best[2]


@pytest.mark.standard
@pytest.mark.quiet  # the rule turns any difference ambiguous on a busy machine: alone, after the other tests
def test_b_that_sleeps_each_step_is_slower(numpy_plain: str, tmp_path: Path) -> None:
    """B sleeps 5 ms before each step of numpy-plain on ``tiny`` (a step of about 1 ms), so it is slower on any CPU
    and under any load; found so, exit 1, on a quiet machine. On a busy one the load explains any change, so the
    same difference is ambiguous, exit 0. (A second thread is no such control: on a 2-core CI machine, B with one
    thread of two was slower in 10 of 10 rounds, p 0.00098, but within that machine's +/-38% noise band.)"""
    status, doc = _ab(
        tmp_path, "--backend", numpy_plain, "--budget", "0.1", "--a-env", *ONE_THREAD,
        "--b-env", *ONE_THREAD, f"{numpy_backend.STEP_ENV}=0.005",
    )  # fmt: skip
    assert doc is not None and doc.load is not None
    (p,) = doc.pairs
    assert p.a.status == "ok" and p.b.status == "ok", (p.a.reason, p.b.reason)
    v = verdict(p, doc.load)
    assert v.test == "slower", v
    if doc.load.busy:
        assert v.timing == "ambiguous" and status == 0, (v, status)
    else:
        assert v.slower and status == 1, (v, status)


# ---- two torch versions ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_torch() -> Path:
    """The interpreter of ``tests.other_torch``'s environment (the previous torch minor release), built here where
    ``make ci`` has not built it; skipped, with pip's words, only where pip cannot install it."""
    why = other.build(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}))
    if why:
        pytest.skip(why)
    return other.python()


@pytest.mark.quick
def test_the_second_torch_is_not_built_where_the_disk_has_not_the_room(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A full disk fails every install at once, the project's own among them: the build says why it did not start
    (the test then skips with it) and writes nothing but its lock."""
    env = tmp_path / ".venv-torch-prev"
    monkeypatch.setattr(other, "ENV", env)
    monkeypatch.setattr(
        other.shutil, "disk_usage", lambda _: other.shutil._ntuple_diskusage(2**40, 2**40 - 2**30, 2**30)
    )
    why = other.build([])
    assert why.startswith("1.0 GiB free on the disk;") and str(other.ROOM_GIB) in why, why
    assert [p.name for p in tmp_path.iterdir()] == [f"{env.name}.lock"]


@pytest.mark.slow
def test_ab_across_two_torch_minor_versions(other_torch: Path, tmp_path: Path) -> None:
    """A: this environment's torch; B: the previous minor release. Both judged ok against the same golden data, their
    versions said, torch-eager timed paired and profiled on each. (torch-compile would add B's first Inductor set-up
    under its own version, 30 s here; the path through ``ab`` is the same.)"""
    status, doc = _ab(
        tmp_path, "--b", str(other_torch), "--backend", "torch-eager", "--dtype", "float32",
        "--a-env", *ONE_THREAD, "--b-env", *ONE_THREAD,
    )  # fmt: skip
    assert doc is not None and status in (0, 1), status
    a_torch, b_torch = doc.a.versions["torch"], doc.b.versions["torch"]
    assert a_torch.split(".")[:2] != b_torch.split(".")[:2], (a_torch, b_torch)
    assert b_torch.startswith(other.requirement().split("==")[1].removesuffix("*")), b_torch
    assert doc.a.versions["numpy"] == doc.b.versions["numpy"]  # the rest is this environment's
    assert [p.b.backend for p in doc.pairs] == ["torch-eager"]
    for p in doc.pairs:
        assert p.a.status == "ok" and p.b.status == "ok", (p.a.reason, p.b.reason)
        assert not verdict(p, doc.load).test.startswith("not tested"), verdict(p, doc.load)
        assert p.a.kernels is not None and p.b.kernels is not None
    md = (tmp_path / "ab" / "AB.md").read_text(encoding="utf-8")
    assert f"torch {a_torch} / torch {b_torch}" in md, md[:3000]
