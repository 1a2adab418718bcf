"""The history (``--history DIR`` on run and sweep, ``python -m compare history DIR``): entries appended and never
rewritten, one machine shown, and the change-point rule of ``compare.report.history`` flagging a step, not noise or
a single outlier. Histories are built from the committed ``reports/cpu/results.json`` with each entry's samples
rescaled; the runs are the framework-free ``numpy-plain`` backend in process, and one ``torch-eager`` pair in
subprocesses."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import functools
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from compare.backends import registry
from compare.cli.main import main
from compare.formats.atomic import write_bytes_new
from compare.formats.codec import to_json
from compare.problem.cases import InputError
from compare.report import history as view
from compare.results import history
from compare.results.document import Results, read_json
from compare.results.environment import Environment, Node
from compare.run import preflight, stop
from compare.timing.significance import FASTER, SLOWER, WITHIN_NOISE, compare_timing
from compare.timing.timer import Timing
from tests import numpy_backend

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "reports" / "cpu" / "results.json"
T0 = datetime.datetime(2026, 1, 5, 9, 0, tzinfo=datetime.UTC)
PNG = b"\x89PNG\r\n\x1a\n"


@functools.cache
def _committed() -> Results:
    return read_json(COMMITTED)


def _timed() -> int:
    return sum(r.timing is not None for r in _committed().results)


def _scaled_timing(t: Timing, factor: float, rng: np.random.Generator) -> Timing:
    """``t`` with every sample times ``factor`` and a 2% jitter each (lognormal), its summary recomputed."""
    samples = np.asarray(t.samples_s) * factor * np.exp(rng.normal(0.0, 0.02, len(t.samples_s)))
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return dataclasses.replace(
        t,
        samples_s=tuple(float(x) for x in samples),
        median_s=float(med),
        iqr_s=float(q3 - q1),
        min_s=float(samples.min()),
        max_s=float(samples.max()),
    )


def _scaled(factor: float, seed: int, versions: dict[str, str | None] | None = None) -> Results:
    """The committed document with every warm timing rescaled by ``factor`` (and jittered by ``seed``)."""
    doc, rng = _committed(), np.random.default_rng(seed)
    rows = tuple(
        r if r.timing is None else dataclasses.replace(r, timing=_scaled_timing(r.timing, factor, rng))
        for r in doc.results
    )
    env = doc.environment if versions is None else dataclasses.replace(doc.environment, versions=versions)
    return dataclasses.replace(doc, results=rows, environment=env, run_id=f"run-{seed}")


def _build(folder: Path, factors: Sequence[float], torch_at: int | None = None) -> list[Path]:
    """A history of one entry per factor, commits ``c1...``, ``c2...``, one hour apart; from entry ``torch_at`` on,
    another torch version."""
    paths = []
    for i, f in enumerate(factors):
        versions = None
        if torch_at is not None and i >= torch_at:
            versions = {**_committed().environment.versions, "torch": "9.9.9"}
        src = history.Source(f"c{i + 1}" + "0" * 38, False, "0.1.0")
        e = history.entry(_scaled(f, seed=i, versions=versions), "run", src, T0 + datetime.timedelta(hours=i))
        paths.append(history.write(folder, e))
    return paths


def _history(folder: Path) -> view.History:
    entries = [e for _, e in history.read(folder).entries]
    return view.build(entries, view.pick(view.machines(entries), None))


def _same(a: object, b: object) -> bool:
    """Two records hold the same JSON (``==`` on records would call a NaN field unequal to itself)."""
    return json.dumps(to_json(a), sort_keys=True) == json.dumps(to_json(b), sort_keys=True)


def _flags(h: view.History) -> set[tuple[str, ...]]:
    return {tuple(p.flag for p in c.points) for c in h.cells}


# --- the rule, on histories built from the committed document ---------------------------------------------------


def test_flat_noise_flags_nothing_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _build(tmp_path, [1.0, 1.02, 0.99])
    h = _history(tmp_path)
    assert len(h.cells) == _timed() and _flags(h) == {("", "", "")} and not h.regressions
    assert main(["history", str(tmp_path)]) == 0
    assert "0 with the newest point flagged slower" in capsys.readouterr().out


def test_a_step_at_commit_3_flags_the_newest_slower_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _build(tmp_path, [1.0, 1.01, 1.5], torch_at=2)
    h = _history(tmp_path)
    assert _flags(h) == {("", "", SLOWER)} and len(h.regressions) == len(h.cells)
    newest = h.cells[0].newest
    assert newest.changed == ("torch 2.13.0+cpu -> 9.9.9",) and newest.by == "change point"
    assert newest.vs_previous is not None and newest.vs_previous.ratio == pytest.approx(1.5 / 1.01, rel=0.05)
    assert main(["history", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "slower: torch-eager · geglu 8x128x768->3072 · float32 · fwd at entry #3 (c300000)" in out


def test_a_setting_that_alone_tells_two_entries_of_one_commit_apart_is_named(tmp_path: Path) -> None:
    """Entries of the same commit and versions: the third run with an instruction-set cap set, then an A/B entry
    whose side B ran with a variable; each row names what changed (it said "-" beside "1.96x slower"). The first
    two rows name nothing (the control)."""
    src = history.Source("c1" + "0" * 38, False, "0.1.0")
    for i in range(3):
        doc = _scaled(1.0 if i < 2 else 1.96, seed=i)
        if i == 2:
            caps = {**doc.environment.isa_caps, "ATEN_CPU_CAPABILITY": "avx2"}
            doc = dataclasses.replace(doc, environment=dataclasses.replace(doc.environment, isa_caps=caps))
        history.write(tmp_path, history.entry(doc, "run", src, T0 + datetime.timedelta(hours=i)))
    e = history.entry(_scaled(1.96, seed=3), "ab", src, T0 + datetime.timedelta(hours=3))
    history.write(tmp_path, dataclasses.replace(e, variables={"FOO": "1"}))
    changed = [p.changed for p in _history(tmp_path).cells[0].points]
    assert changed == [(), (), ("$ATEN_CPU_CAPABILITY - -> avx2",), ("$ATEN_CPU_CAPABILITY avx2 -> -", "$FOO - -> 1")]
    assert main(["history", str(tmp_path)]) in (0, 1)
    assert "$ATEN_CPU_CAPABILITY - -> avx2" in (tmp_path / "report" / "HISTORY.md").read_text(encoding="utf-8")


def test_a_single_slow_outlier_in_the_middle_flags_nothing_on_its_return(tmp_path: Path) -> None:
    _build(tmp_path, [1.0, 1.5, 1.0])
    h = _history(tmp_path)
    assert _flags(h) == {("", SLOWER, "")}  # the outlier was the newest once: flagged then, and not the step back
    assert not h.regressions and main(["history", str(tmp_path)]) == 0


def test_the_table_has_one_row_per_cell_per_entry_and_the_plot_is_a_png(tmp_path: Path) -> None:
    _build(tmp_path / "h", [1.0, 1.02, 0.99])
    out = tmp_path / "view"
    assert main(["history", str(tmp_path / "h"), "--out", str(out)]) == 0
    md = (out / "HISTORY.md").read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| #")]
    assert len(rows) == 3 * _timed()
    assert md.count("## ") == _timed() and "](history.png)" in md
    assert "| #2 | 2026-01-05 10:00 | `c200000` |" in md
    assert (out / "history.png").read_bytes().startswith(PNG)
    assert not (tmp_path / "h" / "report").exists()  # --out given: nothing in the history folder


def _timing(samples: Sequence[float]) -> Timing:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    n = len(samples)
    return Timing(float(med), float(q3 - q1), min(samples), max(samples), n, 1, math.nan, 0, tuple(samples))


def _level(level: float, seed: int, spread: float = 0.02, n: int = 15) -> Timing:
    rng = np.random.default_rng(seed)
    return _timing([float(level * math.exp(x)) for x in rng.normal(0.0, spread, n)])


def _timings(levels: Sequence[float], noisy: int | None = None) -> list[Timing]:
    """One timing per level, 15 samples of a 2% lognormal spread each (50% at ``noisy``), seeded by position."""
    return [_level(x, i, 0.5 if i == noisy else 0.02) for i, x in enumerate(levels)]


def _rule(levels: Sequence[float], noisy: int | None = None) -> list[str]:
    return [s.flag for s in view.change_points(_timings(levels, noisy))]


def test_the_rule_on_plain_steps() -> None:
    assert _rule([1, 1, 1, 1, 1, 1]) == [""] * 6
    assert _rule([1, 1, 1, 1.5, 1.5, 1.5]) == ["", "", "", SLOWER, "", ""]  # flagged once, where it happens
    assert _rule([1, 1, 1.5, 2.25, 2.25]) == ["", "", SLOWER, SLOWER, ""]  # a second step is a new one
    assert _rule([1, 1.5]) == ["", SLOWER]  # two points: as diff compares two runs
    assert _rule([1.5, 1.5, 1.5, 1, 1]) == ["", "", "", FASTER, ""]


def test_one_noisy_point_neither_raises_nor_hides_a_flag() -> None:
    assert _rule([1, 1, 1, 0.6, 1]) == ["", "", "", FASTER, ""]  # a fast outlier: the return is not slower
    assert _rule([1, 1, 1, 1.5, 1]) == ["", "", "", SLOWER, ""]  # a slow one: the return is not faster
    # a spread so wide at i-1 that the step is within its noise (so "slower than i-1" alone would hide it), and i-1
    # itself within noise of the level: the points before it still see the step
    ts = _timings([1, 1, 1, 1.3, 1.5], noisy=3)
    assert compare_timing(view.unpaired(ts[3]), view.unpaired(ts[4])).verdict == WITHIN_NOISE
    assert _rule([1, 1, 1, 1.3, 1.5], noisy=3) == ["", "", "", "", SLOWER]


def test_runs_are_compared_unpaired_even_from_one_interleaved_group(tmp_path: Path) -> None:
    """The committed timings are interleaved, and rescaled copies share their group and rounds: paired, every round
    would say slower by 1.01x. Unpaired, 1% is within the threshold."""
    _build(tmp_path, [1.0, 1.01])
    h = _history(tmp_path)
    assert {c.newest.vs_previous.design for c in h.cells if c.newest.vs_previous} == {"unpaired"}


def test_an_ab_verdict_flags_its_cell_in_place_of_the_rule(tmp_path: Path) -> None:
    _build(tmp_path, [1.0, 1.01])
    r = next(r for r in _committed().results if r.timing is not None)
    verdict = history.PairedVerdict(r.backend, r.case, r.mode, r.world_size, "c1000000", SLOWER, 1.04, 0.001)
    e = dataclasses.replace(
        history.entry(
            _scaled(1.0, seed=7), "ab", history.Source("c3" + "0" * 38, False, None), T0 + datetime.timedelta(hours=5)
        ),
        paired=(verdict,),
    )
    history.write(tmp_path, e)
    h = _history(tmp_path)
    flagged = [c for c in h.cells if c.newest.flag]
    assert [c.key[0] for c in flagged] == [r.backend] and flagged[0].newest.by == "A/B vs c1000000"
    assert main(["history", str(tmp_path)]) == 1


def test_a_resumed_sweeps_carried_cells_are_shown_once(tmp_path: Path) -> None:
    doc = _scaled(1.0, seed=0)
    for i in range(2):  # the same document twice: a resumed sweep that found every cell done
        history.write(
            tmp_path, history.entry(doc, "sweep", history.Source(None, None, "0.1.0"), T0 + datetime.timedelta(hours=i))
        )
    h = _history(tmp_path)
    assert {len(c.points) for c in h.cells} == {1} and h.carried == _timed()


def test_a_sweep_row_of_other_hardware_is_left_out(tmp_path: Path) -> None:
    doc = _scaled(1.0, seed=0)
    other = Node(host="n2", cpu="another CPU", cpu_isa=("avx2",))
    gpu = Node(host="n3", cpu=doc.environment.cpu, cpu_isa=doc.environment.cpu_isa, gpu="NVIDIA H100 (CUDA 12.4)")
    same = Node(host="n1", cpu=doc.environment.cpu, cpu_isa=doc.environment.cpu_isa)  # no GPU seen: torch not loaded
    timed = [i for i, r in enumerate(doc.results) if r.timing is not None]
    nodes = {timed[0]: other, timed[1]: gpu}
    rows = [dataclasses.replace(r, node=nodes.get(i, same)) for i, r in enumerate(doc.results)]
    history.write(
        tmp_path,
        history.entry(dataclasses.replace(doc, results=tuple(rows)), "sweep", history.Source(None, None, None)),
    )
    h = _history(tmp_path)
    assert h.elsewhere == 2 and len(h.cells) == _timed() - 2


# --- entries: the format, the folder, the machines ------------------------------------------------------------


def test_an_entry_round_trips_and_names_its_machine_and_commit(tmp_path: Path) -> None:
    (path,) = _build(tmp_path, [1.0])
    assert path.parent.name == path.parent.name.lower() and path.parent.parent == tmp_path
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["history_schema"] == history.HISTORY_SCHEMA and data["kind"] == "run"
    assert data["machine"]["key"] == path.parent.name and len(path.parent.name) == 12
    assert data["source"] == {"commit": "c1" + "0" * 38, "dirty": False, "version": "0.1.0"}
    assert data["results"]["run_id"] == data["run_id"] == "run-0" and "paired" not in data
    (read,) = history.read(tmp_path).entries
    assert _same(read[1], history.load(data, "x")) and _same(read[1].results, _scaled(1.0, seed=0))


def test_the_machine_key_is_the_hardware_only() -> None:
    env = Environment(cpu="CPU X", cpu_count=8, cpu_isa=("avx2",), gpu="NVIDIA H100 80GB HBM3 (CUDA 12.4)")
    m = history.machine_of(env)
    assert m.gpu == "NVIDIA H100 80GB HBM3"  # the CUDA build is a version, not a machine
    other_cuda = history.machine_of(dataclasses.replace(env, gpu="NVIDIA H100 80GB HBM3 (CUDA 12.8)", platform="p"))
    assert other_cuda.key == m.key
    assert history.machine_of(dataclasses.replace(env, cpu_count=4)).key != m.key
    assert history.machine_of(dataclasses.replace(env, cpu_isa=None)).key != m.key
    assert m.key == history.Machine("CPU X", ("avx2",), 8, "NVIDIA H100 80GB HBM3").key  # stable: no salted hash()


def test_an_entry_is_never_rewritten(tmp_path: Path) -> None:
    target = tmp_path / "e.json"
    write_bytes_new(target, b"first")
    with pytest.raises(FileExistsError):
        write_bytes_new(target, b"second")
    assert target.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["e.json"]
    e = history.entry(_scaled(1.0, seed=0), "run", history.Source(None, None, None), T0)
    paths = {history.write(tmp_path, e) for _ in range(3)}  # the same moment three times: three files
    assert len(paths) == 3


def test_a_file_system_without_hard_links_is_refused_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(OSError):
        write_bytes_new(tmp_path / "e.json", b"entry")
    assert not list(tmp_path.iterdir())  # neither the file nor its temporary
    with pytest.raises(InputError, match=r"cannot add an entry to history folder .* hard link"):
        preflight.check_history(tmp_path / "H")
    assert not list((tmp_path / "H").iterdir())  # the probe is gone


def test_bad_and_foreign_files_are_named_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (path,) = _build(tmp_path, [1.0])
    (tmp_path / "notes.json").write_text("{not json", encoding="utf-8")
    (path.parent / "foreign.json").write_text('{"results": []}', encoding="utf-8")
    bad = json.loads(path.read_text(encoding="utf-8"))
    bad["machine"]["key"] = "0" * 12
    (path.parent / "edited.json").write_text(json.dumps(bad), encoding="utf-8")
    read = history.read(tmp_path)
    assert len(read.entries) == 1 and {p.name for p, _ in read.skipped} == {"notes.json", "foreign.json", "edited.json"}
    assert main(["history", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "notes.json cannot be read as JSON" in err and "foreign.json is not a fusion-compare history entry" in err
    assert "edited.json: machine.key" in err
    assert "## Skipped files" in (tmp_path / "report" / "HISTORY.md").read_text(encoding="utf-8")


def test_the_machine_with_most_entries_is_shown_and_an_unknown_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _build(tmp_path, [1.0, 1.0])
    doc = _scaled(1.0, seed=9)
    env = dataclasses.replace(doc.environment, cpu="another CPU")
    e = history.entry(dataclasses.replace(doc, environment=env), "run", history.Source(None, None, None), T0)
    history.write(tmp_path, e)
    entries = [e for _, e in history.read(tmp_path).entries]
    found = view.machines(entries)
    assert [n for _, n in found] == [2, 1] and view.pick(found, None).cpu == doc.environment.cpu
    assert view.pick(found, e.machine.key[:5]) == e.machine
    assert main(["history", str(tmp_path), "--machine", e.machine.key]) == 0
    assert f"machine {e.machine.key}: 1 entry (another CPU" in capsys.readouterr().out
    assert main(["history", str(tmp_path), "--machine", "ffff"]) == 2
    err = capsys.readouterr().err
    assert "--machine 'ffff' is not a machine of this history; known machines:" in err and e.machine.key in err
    with pytest.raises(InputError, match="no history entries"):
        view.pick([], None)


def test_an_empty_or_missing_history_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(tmp_path / "none")]) == 2
    assert main(["history", str(tmp_path)]) == 2
    assert "no history entries in" in capsys.readouterr().err


def test_the_source_is_this_checkouts_commit_or_none(tmp_path: Path) -> None:
    assert history.source(tmp_path) == history.Source(None, None, history.source(tmp_path).version)  # no checkout
    if not (ROOT / ".git").exists():  # tests run from an unpacked archive: no checkout to name
        assert history.checkout() is None and history.source().commit is None
        return
    assert history.checkout() == ROOT
    if shutil.which("git") is None:
        assert history.source().commit is None  # git missing: unknown, never an error
        return
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    src = history.source()
    assert src.commit == head.stdout.strip() and src.dirty in (True, False)


# --- the runs: appended after results.json, nothing when interrupted, refused before measuring -------------------


def _run_args(out: Path, hist: Path) -> list[str]:
    return [
        "run", "--preset", "tiny", "--backend", numpy_backend.NAME, "--dtype", "float32", "--mode", "fwd",
        "--budget", "0.02", "--no-ceilings", "--no-plots", "--gpu-build", "", "--out", str(out), "--history", str(hist),
    ]  # fmt: skip


@pytest.fixture
def numpy_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BACKENDS, numpy_backend.NAME, numpy_backend.SPEC)


@pytest.mark.standard
def test_a_run_appends_itself_after_its_results(
    tmp_path: Path, numpy_plain: None, capsys: pytest.CaptureFixture[str]
) -> None:
    hist = tmp_path / "H"
    for _ in range(2):
        assert main(_run_args(tmp_path / "O", hist)) == 0
    assert capsys.readouterr().out.count("appended to the history: ") == 2
    (read,) = [history.read(hist)]
    assert len(read.entries) == 2 and not read.skipped
    e = read.entries[-1][1]
    assert _same(e.results, read_json(tmp_path / "O" / "results.json"))  # the document as written
    assert e.kind == "run" and e.run_id == e.results.run_id != "" and e.source == history.source()
    assert e.versions == e.results.environment.versions and e.machine == history.machine_of(e.results.environment)


@pytest.mark.standard
def test_a_sweep_appends_itself_and_its_resumption_shows_each_cell_once(tmp_path: Path, numpy_plain: None) -> None:
    args = [
        "sweep", "--preset", "tiny", "--tokens", "1", "2", "--backend", numpy_backend.NAME, "--dtype", "float32",
        "--mode", "fwd", "--budget", "0.02", "--no-ceilings", "--no-plots",
        "--out", str(tmp_path / "O"), "--history", str(tmp_path / "H"),
    ]  # fmt: skip
    assert main(args) == 0 and main(args) == 0  # the second finds every cell done: the same cells again
    entries = [e for _, e in history.read(tmp_path / "H").entries]
    assert [e.kind for e in entries] == ["sweep", "sweep"]
    h = _history(tmp_path / "H")
    assert len(h.cells) == 2 and {len(c.points) for c in h.cells} == {1} and h.carried == 2


def test_an_interrupted_run_appends_nothing(tmp_path: Path, numpy_plain: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop, "_requested", "SIGINT")  # a signal while the tool loaded: the first check stops
    assert main(_run_args(tmp_path / "O", tmp_path / "H")) == 130
    assert (tmp_path / "H").is_dir() and not list((tmp_path / "H").rglob("*.json"))


def test_a_history_folder_that_cannot_be_written_is_refused_before_measuring(
    tmp_path: Path, numpy_plain: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert main(_run_args(tmp_path / "O", tmp_path / "file" / "H")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create output folder") and "(--history)" in err, err
    assert not (tmp_path / "O" / "cells.jsonl").exists()
    with pytest.raises(InputError, match=r"--history .* exists and is not a folder"):
        preflight.check_history(tmp_path / "file")
    assert main([*_run_args(tmp_path / "O", tmp_path / "H")[:-1], ""]) == 2  # --history '': names no folder


@pytest.mark.standard
def test_two_real_runs_then_the_history_command(tmp_path: Path) -> None:
    """The command line end to end: two ``torch-eager`` runs append two entries, ``history`` renders them."""
    run = [
        sys.executable, "-m", "compare", "run", "--preset", "tiny", "--backend", "torch-eager", "--dtype", "float32",
        "--mode", "fwd", "--budget", "0.05", "--no-ceilings", "--no-plots", "--cache", "warm",
        "--history", str(tmp_path / "H"), "--out", str(tmp_path / "O"),
    ]  # fmt: skip
    for _ in range(2):
        p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0 and "appended to the history: " in p.stdout, p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "compare", "history", str(tmp_path / "H")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stderr  # 1 only if this machine's noise made the second run slower
    assert ": 2 entries (" in p.stdout and "1 cell," in p.stdout
    md = (tmp_path / "H" / "report" / "HISTORY.md").read_text(encoding="utf-8")
    assert len([line for line in md.splitlines() if line.startswith("| #")]) == 2
    assert (tmp_path / "H" / "report" / "history.png").read_bytes().startswith(PNG)


def _one_build(folder: Path, factors: Sequence[float]) -> None:
    """A history of one entry per factor, all of one build (commit ``c1...``, the committed versions), a minute
    apart: the same code run again, each run its own process."""
    src = history.Source("c1" + "0" * 38, False, "0.1.0")
    for i, f in enumerate(factors):
        history.write(folder, history.entry(_scaled(f, seed=i), "run", src, T0 + datetime.timedelta(minutes=i)))


def test_two_runs_of_one_build_at_two_process_levels_flag_nothing(tmp_path: Path) -> None:
    """The issue's two identical ``run --history`` runs (jax-xla 34.2 -> 39.4 ms, each tight within its process):
    two runs measure no between-process spread, so 15% is within the floor: no flag, exit 0, and the table says so.
    (The unpaired rule alone calls it slower.)"""
    _one_build(tmp_path, [1.0, 39.4 / 34.2])
    h = _history(tmp_path)
    assert _flags(h) == {("", "")} and not h.regressions
    v = h.cells[0].newest.vs_previous
    assert v is not None and v.between is not None and not v.between_measured
    first, newest = (view.unpaired(p.timing) for p in (h.cells[0].points[0], h.cells[0].newest))
    assert compare_timing(first, newest).regression
    assert main(["history", str(tmp_path), "--out", str(tmp_path / "view")]) == 0
    assert "between-process spread not measured: floor 30%" in (tmp_path / "view" / "HISTORY.md").read_text("utf-8")


def test_earlier_runs_of_one_build_measure_the_between_run_spread() -> None:
    """Three or more earlier runs of the build of the point before: their medians' range is the band. Runs at two
    process levels 25% apart make a 25% band (the next run at the upper level is not flagged); three tight runs make a
    narrow one, and a 15% step below the floor is flagged; runs of other builds measure nothing."""
    levels = [1.0, 1.25, 1.0, 1.25]
    assert [s.flag for s in view.change_points(_timings(levels), ["b"] * 4)] == [""] * 4
    tight = [1.0, 1.01, 0.995, 1.15]
    steps = view.change_points(_timings(tight), ["b"] * 4)
    assert [s.flag for s in steps] == ["", "", "", SLOWER]
    assert steps[3].vs_previous is not None and steps[3].vs_previous.between_measured
    assert steps[3].vs_previous.between == pytest.approx(0.015, abs=0.02)
    assert [s.flag for s in view.change_points(_timings(tight), ["b1", "b2", "b3", "b4"])] == [""] * 4
