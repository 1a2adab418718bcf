"""Nothing lost, and a crash never looks like a verdict.

Exit statuses are defined once (``compare.run.exitcodes``); every bad input is refused with status 2 and one line on
stderr before anything is measured; outputs are replaced atomically; results files are validated on load; an
interrupted run or sweep saves what finished (130); a terminated isolated sweep leaves no worker and no scratch.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compare.backends.registry import BackendSpec
from compare.cli import main
from compare.cli import sweep as sweep_command
from compare.formats import atomic
from compare.formats.codec import from_json
from compare.problem.cases import PRESETS, Case, InputError, Shape
from compare.results.document import SCHEMA_VERSION, Results, read_json, write_json
from compare.run import exitcodes, harness, preflight, store
from compare.run import sweep as sweep_run

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
#: A case whose golden data alone would need about 400 TB: refused by the memory check before anything runs.
HUGE_RUN = ["run", "--model", "geglu", "--batch", "100000000", "--dim", "100000", "--seq", "1", "--hidden", "8"]
TINY = ["--preset", "tiny", "--backend", "torch-eager", "--budget", "0.05", "--no-ceilings", "--no-plots"]


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any measurement fails the test: the input must be refused before."""

    def measured(*args: object, **kw: object) -> Any:
        raise AssertionError("measured before the input was checked")

    monkeypatch.setattr(harness, "run", measured)
    monkeypatch.setattr(harness, "run_one", measured)
    monkeypatch.setattr(sweep_run, "run_sweep", measured)


def _one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- exit statuses ----------------------------------------------------------------------------------------------


def test_exit_statuses_are_defined_once_and_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert (exitcodes.OK, exitcodes.FINDING, exitcodes.BAD_INPUT, exitcodes.INTERNAL_ERROR, exitcodes.INTERRUPTED) == (
        0,
        1,
        2,
        3,
        130,
    )
    assert not hasattr(main, "_exit_status") and not hasattr(sweep_command, "_exit_status")
    for args in (["--help"], ["run", "--help"], ["sweep", "--help"], ["diff", "--help"], ["report", "--help"]):
        with pytest.raises(SystemExit) as e:
            main.main(args)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "exit status:" in out and "130" in out and "internal error" in out, args
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "Exit status" in readme and "--retry-errors" in readme


def test_argparse_errors_stay_2() -> None:
    with pytest.raises(SystemExit) as e:
        main.main(["run", "--budget", "lots"])
    assert e.value.code == 2


def test_an_unexpected_exception_is_an_internal_error_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kw: object) -> Any:
        raise RuntimeError("the harness broke")

    monkeypatch.setattr(harness, "run", broken)
    monkeypatch.delenv(exitcodes.DEBUG_ENV, raising=False)
    assert main.main(["run", *TINY, "--out", str(tmp_path / "o")]) == 3
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith("internal error: RuntimeError: the harness broke") and "FUSION_COMPARE_DEBUG=1" in line
    monkeypatch.setenv(exitcodes.DEBUG_ENV, "1")
    assert main.main(["run", *TINY, "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: RuntimeError: the harness broke" in err


def test_an_unhandled_interrupt_is_130(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kw: object) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "run", interrupted)
    assert main.main(["run", *TINY, "--out", str(tmp_path / "o")]) == 130
    assert _one_line_error(capsys.readouterr().err) == "interrupted"


# --- every argument checked before anything is measured --------------------------------------------------------


def _bad_out_dirs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    f = tmp_path / "a-file"
    f.write_text("x")
    return {
        "regular file": (str(f), "exists and is not a folder"),
        "file in the way": (str(f / "sub"), "cannot create output folder"),
        "name too long": (str(tmp_path / ("n" * 300)), "cannot create output folder"),
    }


@pytest.mark.parametrize("which", ["regular file", "file in the way", "name too long"])
def test_unusable_out_folder_exits_2_before_measuring(
    which: str, tmp_path: Path, no_measuring: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out, message = _bad_out_dirs(tmp_path)[which]
    assert main.main(["run", *TINY, "--out", out]) == 2
    assert message in _one_line_error(capsys.readouterr().err)


def test_sweep_refuses_an_unusable_out_folder(
    tmp_path: Path, no_measuring: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out, message = _bad_out_dirs(tmp_path)["regular file"]
    assert main.main(["sweep", "--preset", "tiny", "--backend", "torch-eager", "--out", out]) == 2
    assert message in _one_line_error(capsys.readouterr().err)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_under_proc_exits_2(no_measuring: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["run", *TINY, "--out", "/proc/x"]) == 2
    assert "cannot create output folder /proc/x" in _one_line_error(capsys.readouterr().err)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_folder_exits_2(tmp_path: Path, no_measuring: None, capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert main.main(["run", *TINY, "--out", str(ro)]) == 2
        assert "cannot write in output folder" in _one_line_error(capsys.readouterr().err)
    finally:
        ro.chmod(stat.S_IRWXU)


def test_prepare_out_dir_proves_it_can_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write test itself (what a read-only folder trips, even where the tests run as root)."""

    def cannot(*args: object, **kw: object) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(preflight.tempfile, "NamedTemporaryFile", cannot)
    with pytest.raises(InputError, match=r"cannot write in output folder .*Permission denied"):
        preflight.prepare_out_dir(tmp_path / "o")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", *TINY, "--shape-sweep", "0"], "--shape-sweep token counts must be positive integers, got 0"),
        (["run", *TINY, "--shape-sweep", "8", "-4"], "--shape-sweep token counts must be positive integers, got -4"),
        (["run", *TINY, "--seed", "-5"], "seed must be a non-negative integer, got -5"),
        (["run", *TINY, "--budget", "0"], "--budget must be a finite number > 0, got 0.0"),
        (["run", *TINY, "--budget", "nan"], "--budget must be a finite number > 0, got nan"),
        (["run", *TINY, "--budget", "inf"], "--budget must be a finite number > 0, got inf"),
        (["run", *TINY, "--backend", "torch-eager", "torch-eager"], "a backend repeats: torch-eager, torch-eager"),
        (["run", *TINY, "--dtype", "float32", "float32"], "a dtype repeats"),
        (["run", *TINY, "--mode", "fwd", "fwd"], "a mode repeats"),
        (
            [*HUGE_RUN, "--backend", "torch-eager"],
            "bytes) of memory",
        ),
        (["sweep", "--preset", "tiny", "--seq", "0"], "shape dimension 'seq' must be a positive integer, got 0"),
        (["sweep", "--preset", "tiny", "--seed", "-5"], "seed must be a non-negative integer, got -5"),
        (["sweep", "--preset", "tiny", "--budget", "nan"], "--budget must be a finite number > 0"),
        (["sweep", "--preset", "tiny", "--backend", "torch-eager", "torch-eager"], "a backend repeats"),
        (["sweep", "--preset", "tiny", "--isolate", "--cell-timeout", "nan"], "--cell-timeout must be a finite"),
        (["sweep", "--preset", "tiny", "--isolate", "--cell-timeout", "0"], "--cell-timeout must be a finite"),
        (
            ["sweep", "--model", "geglu", "--dim", "100000", "--hidden", "8", "--tokens", "100000000"],
            "bytes) of memory",
        ),
    ],
)
def test_bad_arguments_exit_2_before_measuring(
    args: list[str], message: str, tmp_path: Path, no_measuring: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main([*args, "--out", str(tmp_path / "o")]) == 2
    assert message in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()  # refused before the output folder was even made


def test_too_large_names_bytes_needed_and_available(
    no_measuring: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        *HUGE_RUN,
        "--out",
        str(tmp_path / "o"),
    ]
    assert main.main(args) == 2
    line = _one_line_error(capsys.readouterr().err)
    case = Case("geglu", Shape(100000000, 1, 100000, 8), "float32")
    found = re.search(r"needs about .* \(([\d,]+) bytes\) of memory at its peak \((\w+): ", line)
    assert found is not None and "bytes) are available" in line, line
    plan = preflight.peak_plan(case, 5, backward=False)  # fwd: the default mode of --model
    assert int(found[1].replace(",", "")) == plan.peak and found[2] == plan.phase == "fresh", line


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--threshold", "nan", "--threshold must be a finite number >= 0, got nan"),
        ("--threshold", "-0.1", "--threshold must be a finite number >= 0"),
        ("--k", "0", "--k must be a finite number > 0"),
        ("--k", "inf", "--k must be a finite number > 0"),
        ("--alpha", "0", "--alpha must be a finite number > 0 and <= 1"),
        ("--alpha", "1.5", "--alpha must be a finite number > 0 and <= 1"),
        ("--alpha", "nan", "--alpha must be a finite number > 0 and <= 1"),
    ],
)
def test_diff_refuses_non_finite_options(
    option: str, value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    write_json(path, from_json(Results, _doc()))
    assert main.main(["diff", str(path), str(path), option, value]) == 2
    assert message in _one_line_error(capsys.readouterr().err)


def test_the_peak_plan_bounds_what_the_golden_data_holds() -> None:
    """Every phase of the plan holds at least the golden data's weights and inputs, as ``Golden`` holds them."""
    from compare.problem.golden import make_golden

    for case in (PRESETS["tiny"].case("float32"), PRESETS["blog-linear"].case("bfloat16")):
        g = make_golden(case)
        held = sum(a.nbytes for d in (g.inputs, g.params) for a in d.values())
        plan = preflight.peak_plan(case, 0, backward=True)
        assert all(
            held <= sum(parts.values()) < 20 * held + sum(a.nbytes for a in g.ref.values()) * 3
            for parts in plan.phases.values()
        )
    small = PRESETS["tiny"].case("float32")
    with pytest.raises(InputError, match=r"needs about .* but only 1 kB \(1,000 bytes\) are available \(test\)"):
        preflight.check_memory([small], available=(1000, "test"))
    preflight.check_memory([small], available=(preflight.peak_plan(small, 0, True).peak, "test"))


def test_the_backends_timed_together_count_in_the_memory_needed() -> None:
    """A run holds per backend timed together its weights in the dtype and one call's gradients: a real layer
    whose golden data fits can be refused for them, naming how many would fit, and is accepted with that many; a
    tensor-parallel backend runs in its own workers and is not counted here."""
    from compare.backends.registry import spec

    case = Case("swiglu", Shape(1, 16, 4096, 14336), "bfloat16")
    five = [spec(b) for b in ("torch-eager", "torch-compile", "jax-xla", "jax-unfused", "torch-eager-remat")]
    assert all(case.model in s.models for s in five)
    flush = 1_500_000_000  # timed with cold samples: the flush's buffer is held while the backends are
    need = preflight.peak_plan(case, 5, True, flush).peak
    assert preflight.peak_plan(case, 5, True, flush).phase == "timing"
    assert need > preflight.peak_plan(case, 0, True, flush).peak
    assert preflight.peak_plan(case, 5, False, flush).peak < need  # the forward holds no gradients
    room = (need - 1, "test")
    preflight.check_memory([case], available=room, flush=flush)  # no backends named: the golden data alone fits
    refused = r"5 backends' weights .* try at most 4 backends or --cache warm \(no cold-cache flush\)$"
    with pytest.raises(InputError, match=refused):
        preflight.check_memory([case], five, available=room, flush=flush)
    preflight.check_memory([case], five[:4], available=room, flush=flush)
    tp = spec("torch-tp-manual")
    assert tp.runtime
    preflight.check_memory([case], [tp, *five[:4]], available=room, flush=flush)  # its workers hold their own


def test_the_cold_flush_and_a_wide_dtype_are_named_when_dropping_them_would_fit() -> None:
    """The refusal says what would fit: ``--dtype bfloat16`` for a float32 case, ``--cache warm`` when the flush's
    buffer is what tips it over."""
    from compare.backends.registry import spec

    five = [spec(b) for b in ("torch-eager", "torch-compile", "jax-xla", "jax-unfused", "torch-eager-remat")]
    flush = 1_500_000_000
    case = Case("swiglu", Shape(1, 16, 4096, 14336), "bfloat16")
    warm = preflight.peak_plan(case, 5, True, 0).peak
    timing = [sum(preflight.peak_plan(case, 5, True, f).phases["timing"].values()) for f in (0, flush)]
    assert timing[1] == timing[0] + flush  # the flush's buffer is held while timing
    with pytest.raises(InputError, match=r"try at most 4 backends or --cache warm \(no cold-cache flush\)$"):
        preflight.check_memory([case], five, available=(warm, "test"), flush=flush)
    wide = Case("swiglu", case.shape, "float32")
    with pytest.raises(InputError, match=r"float32.* try --dtype bfloat16$"):
        preflight.check_memory([wide], five, available=(warm + flush, "test"), flush=flush)


def test_available_memory_is_read() -> None:
    from compare.results.environment import available_memory_bytes

    got = available_memory_bytes()
    if Path("/proc/meminfo").is_file():
        assert got is not None and got[0] > 0 and ("MemAvailable" in got[1] or "control group" in got[1])


@pytest.mark.parametrize("version", [1, 2])
def test_a_control_groups_memory_limit_is_the_memory_available(tmp_path: Path, version: int) -> None:
    """A container's limit, not the host's free memory: the room left under the process's control group's limit
    (cgroup v2's memory.max less memory.current; v1's limit_in_bytes less usage_in_bytes) where it is smaller than
    MemAvailable; no limit ("max", or v1's huge number) leaves MemAvailable. Control: the same tree without a
    limit."""
    from compare.results.environment import available_memory_bytes

    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 32000000 kB\nMemAvailable: 20000000 kB\n")
    group = cg / "job" if version == 2 else cg / "memory" / "job"
    group.mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/job\n" if version == 2 else "4:memory:/job\n")
    limit, usage = (
        ("memory.max", "memory.current") if version == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )
    (group / limit).write_text(f"{4 << 30}\n")
    (group / usage).write_text(f"{1 << 30}\n")
    got = available_memory_bytes(cg, proc)
    assert got is not None and got[0] == 3 << 30 and "control group" in got[1], got
    (group / limit).write_text("max\n" if version == 2 else "9223372036854771712\n")
    assert available_memory_bytes(cg, proc) == (20000000 * 1024, "MemAvailable in /proc/meminfo")


# --- atomic writes ---------------------------------------------------------------------------------------------


class _Os:
    """``os`` as :mod:`compare.formats.atomic` sees it, with some functions replaced (the real ``os`` stays
    untouched)."""

    def __init__(self, **replaced: Any) -> None:
        self.replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return self.replaced[name] if name in self.replaced else getattr(os, name)


class _FullDisk:
    """A file object that writes half of what it is given, then fails as a full disk does."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def write(self, data: bytes) -> int:
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def test_a_failed_write_keeps_the_previous_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.json"
    old = _doc()
    write_json(path, from_json(Results, old))
    before = path.read_bytes()
    monkeypatch.setattr(atomic, "os", _Os(fdopen=lambda fd, *a, **kw: _FullDisk(os.fdopen(fd, *a, **kw))))
    new = copy.deepcopy(old)
    new["results"][0]["status"] = "error"
    with pytest.raises(OSError) as e:
        write_json(path, from_json(Results, new))
    assert e.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary file left


def test_an_interrupt_inside_a_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "REPORT.md"
    atomic.write_text_atomic(path, "old report\n")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "os", _Os(fsync=interrupted))
    with pytest.raises(KeyboardInterrupt):
        atomic.write_text_atomic(path, "new report\n")
    assert path.read_text(encoding="utf-8") == "old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPORT.md"]


def test_atomic_write_is_utf8_and_keeps_permissions(tmp_path: Path) -> None:
    path = tmp_path / "REPORT.md"
    atomic.write_text_atomic(path, "median 4.9 µs\n")
    assert path.read_bytes() == "median 4.9 µs\n".encode()
    path.chmod(0o640)
    atomic.write_text_atomic(path, "median 5.0 µs\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text(encoding="utf-8") == "median 5.0 µs\n"


def test_outputs_are_written_atomically_everywhere() -> None:
    """No command writes an output with a plain ``write_text``: each goes through ``write_text_atomic``."""
    for name in ("cli/main", "cli/outputs", "cli/history", "results/document"):
        source = (ROOT / "compare" / f"{name}.py").read_text(encoding="utf-8")
        assert ".write_text(" not in source and ".write_bytes(" not in source, name
        assert "write_text_atomic" in source or "write_json" in source, name


# --- results files validated on load ----------------------------------------------------------------------------


def _doc() -> dict[str, Any]:
    r = {
        "backend": "torch-eager",
        "model": "geglu",
        "dtype": "float32",
        "mode": "fwd",
        "status": "ok",
        "shape": {"batch": 3, "seq": 37, "dim": 96, "hidden": 328},
        "case": "geglu-3x37x96-328-float32-normal-s0",
        "reason": "",
        "note": "",
        "parity": None,
        "timing": {
            "median_s": 1e-3,
            "iqr_s": 1e-5,
            "min_s": 9e-4,
            "n": 5,
            "calls_per_sample": 1,
            "first_call_s": 0.1,
            "samples_s": [1e-3] * 5,
        },
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "created": "2026-01-01T00:00:00+00:00",
        "config": {},
        "environment": {"versions": {}, "threads": {}, "precision": {}},
        "results": [r],
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("shape"), "result #0 (torch-eager) lacks shape"),
        (lambda r: r["shape"].pop("hidden"), "result #0 (torch-eager) has a shape without positive integer hidden"),
        (lambda r: r["shape"].update(batch="3"), "has a shape without positive integer batch"),
        (lambda r: r["timing"].pop("median_s"), "result #0 (torch-eager) has a timing without median_s"),
        (lambda r: r["timing"].update(median_s=0), "median_s that is not a finite positive number (0)"),
        (lambda r: r["timing"].update(median_s=float("nan")), "median_s that is not a finite positive number"),
        (lambda r: r["timing"].pop("iqr_s"), "has a timing without iqr_s"),
        (lambda r: r.update(status="fine"), "has an unknown status 'fine'"),
        (lambda r: r.pop("backend"), "result #0 lacks backend"),
    ],
)
def test_report_and_diff_refuse_a_bad_row(
    edit: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc()
    edit(doc["results"][0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    good = tmp_path / "good.json"
    write_json(good, from_json(Results, _doc()))
    assert main.main(["report", str(bad), "--out", str(tmp_path / "R.md")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"results file {bad}: " in line and message in line
    assert not (tmp_path / "R.md").exists()
    assert main.main(["diff", str(good), str(bad)]) == 2
    assert message in _one_line_error(capsys.readouterr().err)


def test_unreadable_results_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "latin1.json").write_bytes(b'{"results": [], "environment": {}, "x": "\xe9"}')
    (tmp_path / "list.json").write_text("[]", encoding="utf-8")
    for name, message in (("latin1.json", "cannot be read"), ("list.json", "lacks 'environment' and 'results'")):
        assert main.main(["report", str(tmp_path / name)]) == 2
        assert message in _one_line_error(capsys.readouterr().err)


def test_truncated_golden_manifest_exits_2_naming_it(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", golden)
    manifest = golden / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    p = subprocess.run(
        [sys.executable, "-m", "compare", "run", *TINY, "--out", str(tmp_path / "o")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FUSION_COMPARE_GOLDEN_DIR": str(golden)},
    )
    assert p.returncode == 2, p.stderr
    line = _one_line_error(p.stderr)
    assert "MANIFEST.json" in line and "not valid JSON" in line
    assert not (tmp_path / "o").exists()  # refused before the output folder was even made


# --- interrupted run, locked folder -----------------------------------------------------------------------------


def test_interrupted_run_saves_what_finished(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``harness.run`` returns the finished cells with ``interrupted``: run writes them and exits 130."""

    def partial(*args: object, **kw: object) -> Results:
        return from_json(Results, {**_doc(), "interrupted": True})

    monkeypatch.setattr(harness, "run", partial)
    out = tmp_path / "o"
    assert main.main(["run", *TINY, "--shape-sweep", "8", "--out", str(out)]) == 130
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith(f"interrupted: saved 1 finished cells to {out / 'results.json'}")
    doc = read_json(out / "results.json")
    assert doc.interrupted is True and len(doc.results) == 1 and not doc.shape_sweep
    assert "shape_sweep" not in json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert "# fusion-compare report" in (out / "REPORT.md").read_text(encoding="utf-8")


def test_a_second_run_into_the_same_folder_is_refused(
    tmp_path: Path, no_measuring: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    out.mkdir()
    with preflight.lock_folder(out):
        assert main.main(["run", *TINY, "--out", str(out)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"{out} is in use by another command (pid {os.getpid()}: python -m compare run)" in line, line
    with preflight.lock_folder(out):  # released when the first one ends
        pass


# --- sweep: --retry-errors, SIGTERM -----------------------------------------------------------------------------


@pytest.fixture
def flaky() -> Iterator[None]:
    """A backend named ``flaky``: raising (tests.raising_backend) until the test swaps in torch-eager's module."""
    from compare.backends import registry

    registry.register(
        BackendSpec(name="flaky", framework="none", target="tests.raising_backend", about="raises, then works")
    )
    yield
    registry.BACKENDS.pop("flaky", None)


@pytest.mark.standard
def test_retry_errors_reruns_error_cells_and_the_new_line_wins(
    tmp_path: Path, flaky: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from compare.backends import registry

    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--preset",
        "tiny",
        "--tokens",
        "1",
        "--backend",
        "flaky",
        "--budget",
        "0.02",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main.main(args) == 1
    registry.register(BackendSpec(name="flaky", target="torch_impl.backends.eager", about="works now"))
    assert main.main(args) == 1  # without the flag the stored error stands
    assert store.load_sweep(out).results[0].status == "error"
    assert main.main([*args, "--retry-errors"]) == 0
    assert "retrying 1 cell(s)" in capsys.readouterr().err
    (r,) = store.load_sweep(out).results
    assert r.status == "ok" and r.timing is not None and r.timing.n >= 5
    lines = [json.loads(x) for x in (out / store.JSONL).read_text(encoding="utf-8").splitlines()]
    assert [x["result"]["status"] for x in lines if x["type"] == "cell"] == ["error", "ok"]


@pytest.mark.standard
def test_stale_scratch_is_removed_on_start(tmp_path: Path, flaky: None) -> None:
    out = tmp_path / "sweep"
    (out / ".cells" / "cell-stale").mkdir(parents=True)
    (out / ".cells" / "cell-stale" / "cell.json").write_text("{}", encoding="utf-8")
    assert (
        main.main(["sweep", "--preset", "tiny", "--tokens", "1", "--backend", "flaky", "--no-plots", "--out", str(out)])
        == 1
    )
    assert not (out / ".cells").exists()


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a live process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid, pgrp = raw[raw.rindex(")") + 2 :].split()[:3]
    return state, int(ppid), int(pgrp)


def _workers(pid: int) -> list[int]:
    """Live sweep workers (``python -m compare.run.cell_worker ...``) whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            s = _proc_stat(int(d.name))
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if s and s[1] == pid and b"compare.run.cell_worker" in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
    return out


def _group_alive(pgid: int) -> bool:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            s = _proc_stat(int(d.name))
            if s and s[2] == pgid and s[0] != "Z":
                return True
    return False


LAUNCH = """
import sys
from compare.backends import registry
from compare.backends.registry import BackendSpec
registry.register(BackendSpec(name="misbehaving", framework="none", target="tests.test_sweep", about="hangs in bwd"))
from compare.cli.main import main
raise SystemExit(main(["sweep", *sys.argv[1:]]))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file() or os.name != "posix", reason="needs Linux /proc")
@pytest.mark.slow
def test_sigterm_stops_an_isolated_sweep_and_its_worker(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-c",
        LAUNCH,
        "--preset",
        "tiny",
        "--tokens",
        "1",
        "--backend",
        "misbehaving",
        "--mode",
        "bwd",
        "--isolate",
        "--no-plots",
        "--out",
        str(out),
    ]
    p = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    worker = None
    try:
        deadline = time.monotonic() + 120
        while worker is None:
            assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
            assert time.monotonic() < deadline, "no worker process started in time"
            kids = _workers(p.pid)
            worker = kids[0] if kids else None
            time.sleep(0.05)
        assert (out / ".cells").is_dir()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        err = p.stderr.read().decode() if p.stderr else ""
        assert rc == 130, err
        assert "Traceback" not in err and "sweep: stopped by SIGTERM" in err
        deadline = time.monotonic() + 30
        while _group_alive(worker):
            assert time.monotonic() < deadline, "the worker's process group outlived the sweep"
            time.sleep(0.05)
        assert not (out / ".cells").exists()
        assert store.read_sweep(out)["config"]["progress"]["done"] == 0  # the cell in flight is not a result
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        if p.stderr:
            p.stderr.close()
        if worker is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker, signal.SIGKILL)


#: ``python -m compare`` with the test-only ``gated`` backend registered (tests/gated_backend.py). SIGINT raises
#: KeyboardInterrupt as at a terminal, even where this test runs with SIGINT ignored (a shell's background job).
GATED_RUN = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from compare.backends import registry
from tests import gated_backend
registry.register(gated_backend.SPEC)
from compare.cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.slow
@pytest.mark.parametrize("second", [False, True], ids=["released", "second-signal"])
def test_ctrl_c_during_a_real_run_saves_the_finished_cells(tmp_path: Path, second: bool) -> None:
    """End to end: SIGINT while the second case is in flight (the gated backend's bfloat16 step waits for a release
    file). The signal sets a flag (``compare.run.stop``): the run says it stops after the cell in flight, and

    - ``released``: the test then releases the step; the run gives the cells in flight up at the next check (they
      would be timed next) and writes the two finished ones, exit 130;
    - ``second-signal``: a second SIGINT ends the run at once (130, no summary written); the store holds the first
      case's two cells (a case's cells of one mode finish together: they are timed together), and
      ``compare report DIR`` rebuilds results.json from it.

    No traceback either way."""
    from tests import gated_backend

    out, gate, log = tmp_path / "o", tmp_path / "gate", tmp_path / "stderr.txt"
    gate.mkdir()
    cmd = [sys.executable, "-c", GATED_RUN, "run", "--preset", "tiny", "--backend", "torch-eager", gated_backend.NAME]
    cmd += ["--dtype", "float32", "bfloat16", "--mode", "fwd", "--budget", "0.05", "--no-ceilings", "--no-plots"]
    cmd += ["--out", str(out)]
    env = {**os.environ, gated_backend.GATE_ENV: str(gate), gated_backend.DTYPE_ENV: "bfloat16"}
    with log.open("wb") as stderr:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (gate / "started").exists():  # the float32 case is done: the cases run one after another
            assert p.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        while "stopping after the cell in flight" not in log.read_text(encoding="utf-8"):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.05)
        if second:
            p.send_signal(signal.SIGINT)
        else:
            (gate / "release").touch()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    text = log.read_text(encoding="utf-8")
    assert p.returncode == 130, text
    name = PRESETS["tiny"].case("float32").name
    assert "Traceback" not in text and f"[2/4] gated {name} fwd -> ok" in text, text
    first_case = [("torch-eager", "float32", "ok"), ("gated", "float32", "ok")]
    if second:
        assert not (out / "results.json").exists()
        assert main.main(["report", str(out)]) == 0
        doc = read_json(out / "results.json")
        assert doc.interrupted is True
        assert [(r.backend, r.dtype, r.status) for r in doc.results] == first_case
        # the report's first line says so (it read "Run ...: 2 ok.")
        assert "cut short (killed, or its disk full): 2 of 4 planned cells**: 2 ok." in _run_line(out)
        return
    assert f"interrupted: saved 2 finished cells to {out / 'results.json'}" in text
    doc = read_json(out / "results.json")
    assert doc.interrupted is True
    assert [(r.backend, r.dtype, r.status) for r in doc.results] == first_case
    assert "interrupted by SIGINT: 2 of 4 planned cells**: 2 ok." in _run_line(out)
    assert main.main(["report", str(out)]) == 0  # rebuilt from the store: the same words
    assert "interrupted by SIGINT: 2 of 4 planned cells**: 2 ok." in _run_line(out)


def test_an_argument_that_is_not_utf_8_is_a_path_and_a_recorded_escape(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out $'a\\xff'`` (Python's surrogateescape: ``a\\udcff``): the folder is made with that byte, the run's
    files are written and the command is recorded with ``\\xff``; it was exit 3 at the folder's lock, leaving a
    folder that held only ``.lock``."""

    def finished(*args: Any, **kw: object) -> Results:
        return from_json(Results, {**_doc(), "config": args[3].config})  # harness.run's options

    monkeypatch.setattr(harness, "run", finished)
    out = tmp_path / os.fsdecode(b"a\xff")
    assert main.main(["run", *TINY, "--out", str(out)]) == 0, capsys.readouterr().err
    assert (os.fsencode(tmp_path) + b"/a\xff/results.json") in [os.fsencode(p) for p in out.iterdir()]
    assert f"--out '{tmp_path}/a\\xff'" in read_json(out / "results.json").config.command
    assert "a\\xff" in (out / "REPORT.md").read_text(encoding="utf-8")


def test_a_store_with_a_bad_middle_line_and_diff_of_folders_say_the_real_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's store whose middle line is torn: ``report`` and ``export`` exit 2 naming the store and the line (they
    said "results.json does not exist"). ``diff`` and ``export`` of run folders read them as ``report`` does (``diff``
    said "does not exist"); ``export`` needs no ``--csv``."""
    out = tmp_path / "o"
    out.mkdir()
    row = from_json(Results, _doc()).results[0]
    with store.open_run(out, {"command": "the run"}) as s:
        s.cell(row)
        s.end()
    assert main.main(["report", str(out)]) == 0
    assert main.main(["diff", str(out), str(out)]) == 0
    assert main.main(["export", str(out), "--out", str(tmp_path / "cells.csv")]) == 0
    capsys.readouterr()
    lines = (out / store.CELLS).read_text(encoding="utf-8").splitlines()
    (out / store.CELLS).write_text("\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n", encoding="utf-8")
    (out / "results.json").unlink()
    for command in (["report", str(out)], ["export", str(out)]):
        assert main.main(command) == 2
        assert f"store {out / store.CELLS}: line 2 is not valid JSON" in _one_line_error(capsys.readouterr().err)


def _run_line(out: Path) -> str:
    """REPORT.md's first line after its title."""
    return (out / "REPORT.md").read_text(encoding="utf-8").splitlines()[2]


def test_a_new_run_into_a_cut_short_run_s_folder_keeps_its_stored_cells(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed with a cell in ``cells.jsonl`` and no ``results.json``: the next run into the folder moves the
    store to ``cells.<run id>.jsonl`` (and says so) before it empties its own; ``report`` that file rebuilds the
    killed run. A finished run's store is emptied as before (the control)."""
    out = tmp_path / "o"
    out.mkdir()
    row = from_json(Results, _doc()).results[0]
    with store.open_run(out, {"command": "the killed run"}) as killed:
        killed.cell(row)

    def partial(*args: object, **kw: object) -> Results:
        return from_json(Results, {**_doc(), "interrupted": True})

    monkeypatch.setattr(harness, "run", partial)
    assert main.main(["run", *TINY, "--out", str(out)]) == 130
    aside = out / f"cells.{killed.run_id}.jsonl"
    assert f"kept a cut-short run's store: {out / 'cells.jsonl'} is now {aside}" in capsys.readouterr().err
    assert [r.backend for r in store.read_store(aside).results] == ["torch-eager"]
    assert store.read_store(aside).run_id == killed.run_id
    assert store.set_aside(out) is None  # this run's results.json holds its one cell: nothing to keep
    assert main.main(["report", str(aside), "--out", str(tmp_path / "KILLED.md")]) == 0
    assert "cut short (killed, or its disk full): 1 cell**" in (tmp_path / "KILLED.md").read_text(encoding="utf-8")


def test_a_results_file_of_another_schema_version_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An old (no ``schema_version``) or foreign-version results file is a clear bad-input error, not a KeyError."""
    from compare.results.document import SCHEMA_VERSION

    doc = json.loads((ROOT / "reports" / "cpu" / "results.json").read_text(encoding="utf-8"))
    assert doc["schema_version"] == SCHEMA_VERSION
    for version in (None, 1, "x"):
        bad = dict(doc)
        if version is None:
            bad.pop("schema_version")
        else:
            bad["schema_version"] = version
        path = tmp_path / f"r{version}.json"
        path.write_text(json.dumps(bad), encoding="utf-8")
        assert main.main(["report", str(path), "--out", str(tmp_path / "R.md")]) == exitcodes.BAD_INPUT
        err = capsys.readouterr().err
        assert f"this fusion-compare reads schema_version {SCHEMA_VERSION}" in err and err.count("\n") == 1, err


@pytest.mark.quick
@pytest.mark.parametrize("writes", [True, False])
def test_a_command_refused_while_the_holder_is_still_writing_its_line_names_the_holder(
    tmp_path: Path, writes: bool
) -> None:
    """Two commands started at one moment: the loser can find the lock taken and its file still empty (the holder
    writes its line right after taking the lock). It reads again briefly, so it names the holder; a holder that
    never writes is 'a process starting up'."""
    import fcntl
    import threading

    from compare.run import preflight

    fd = os.open(tmp_path / preflight.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if writes:
            threading.Timer(0.05, lambda: os.pwrite(fd, b"pid 4243: python -m compare run\n", 0)).start()
        with pytest.raises(InputError) as err, preflight.lock_folder(tmp_path, "run"):
            pass
        assert ("pid 4243: python -m compare run" if writes else "a process starting up") in str(err.value)
    finally:
        os.close(fd)


def test_a_case_whose_tokens_are_its_cost_is_told_how_many_would_fit() -> None:
    """Where the tokens, not the weights, fill the memory (a long sequence through a small layer), the refusal names
    a token count that fits."""
    case = Case("swiglu", Shape(64, 4096, 256, 512), "bfloat16")
    need = preflight.peak_plan(case, 1, True).peak
    fits = preflight.peak_plan(Case("swiglu", Shape(1, 4096, 256, 512), "bfloat16"), 1, True).peak
    assert fits < need
    from compare.backends.registry import spec

    with pytest.raises(InputError, match=r"try at most 4096 tokens \(--batch 1 --seq 4096\)$"):
        preflight.check_memory([case], [spec("torch-eager")], available=(fits, "test"))
