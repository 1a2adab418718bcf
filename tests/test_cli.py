"""The command line end to end: list, run, report rebuilt from JSON, and every bad input with its message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compare.cli.main import main
from compare.formats.codec import from_json
from compare.report.render import render
from compare.results.document import Results
from tests.conftest import TRITON_INTERPRETED
from tests.parity_backends import unexplained_rms

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compare", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def test_core_imports_neither_torch_nor_jax() -> None:
    code = (
        "import sys, compare.cli.main, compare.run.harness, compare.report.render, compare.problem.golden; "
        "import compare.timing.timer; "
        "bad = [m for m in ('torch', 'jax', 'flax', 'triton') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_list_shows_presets_and_available_backends() -> None:
    p = _cli("list")
    assert p.returncode == 0, p.stderr
    for name in ("blog-linear", "blog-mlp", "cpu-mlp", "tiny"):
        assert name in p.stdout
    for backend in ("torch-eager", "torch-compile", "torch-triton", "jax-xla"):
        line = next(x for x in p.stdout.splitlines() if x.strip().startswith(backend + " "))
        assert "available" in line and "unavailable" not in line, line


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    code = main(
        [
            "run",
            "--preset",
            "tiny",
            "--dtype",
            "float32",
            "bfloat16",
            "--backend",
            "torch-eager",
            "jax-xla",
            "torch-triton",
            "--budget",
            "0.05",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_run_writes_results_and_report(run_dir: Path) -> None:
    doc = json.loads((run_dir / "results.json").read_text())
    env = doc["environment"]
    assert env["cpu"] and env["versions"]["numpy"] and env["precision"]["torch_float32_matmul_precision"] == "highest"
    rows = {(r["backend"], r["dtype"]): r for r in doc["results"]}
    assert len(rows) == 6
    for (backend, _), r in rows.items():
        assert r["status"] == "ok", r
        assert set(r["parity"]) >= {"max_abs_err", "max_rel_err", "bound", "ratio", "passed"}
        if backend == "torch-triton" and TRITON_INTERPRETED:  # CPU: interpreted, parity only, never timed
            assert r["timing"] is None and "parity only" in r["note"]
        else:  # every other backend, and torch-triton compiled on CUDA: timed
            assert set(r["timing"]) >= {"median_s", "iqr_s", "min_s", "n", "first_call_s"}
    md = (run_dir / "DETAILS.md").read_text()
    for section in (
        "## Environment",
        "## Parity",
        "## What a pass means",
        "## Timing",
        "## Skipped, failed and implausible",
    ):
        assert section in md


def test_report_rebuilt_from_json_is_identical(run_dir: Path, tmp_path: Path) -> None:
    rebuilt = tmp_path / "REPORT.md"
    assert main(["report", str(run_dir / "results.json"), "--out", str(rebuilt)]) == 0
    for name in ("REPORT.md", "DETAILS.md"):  # the one page and its details, beside the --out file
        assert (tmp_path / name).read_text() == (run_dir / name).read_text()
    assert render(from_json(Results, json.loads((run_dir / "results.json").read_text()))) == rebuilt.read_text()


def test_a_failing_backend_keeps_the_others(tmp_path: Path) -> None:
    """A backend whose module is missing is recorded as an error-free skip with its reason; one that raises while
    preparing is an error; the other backends' results are all written."""
    from compare.backends.registry import BackendSpec
    from compare.problem.cases import PRESETS
    from compare.run import harness
    from compare.run.options import RunOptions

    broken = BackendSpec(
        name="broken", framework="torch", target="tests.broken_backend_does_not_exist", about="missing module"
    )
    raising = BackendSpec(name="raising", framework="torch", target="tests.raising_backend", about="raises in prepare")
    from compare.backends.registry import spec

    doc = harness.run(
        [PRESETS["tiny"].case("float32")],
        [broken, raising, spec("torch-eager")],
        ["fwd"],
        RunOptions(cfg=harness.TimingConfig(budget_s=0.05)),
    )
    by = {r.backend: r for r in doc.results}
    assert by["broken"].status == "skipped" and "cannot import" in by["broken"].reason
    assert by["raising"].status == "error" and "MemoryError: simulated out of memory" in by["raising"].reason
    eager = by["torch-eager"].timing
    assert by["torch-eager"].status == "ok" and eager is not None and eager.n >= 5
    md = render(doc)
    assert "simulated out of memory" in md and "| raising |" in md


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--preset", "huge"], "unknown preset 'huge'; known presets: blog-linear, blog-mlp, cpu-mlp, tiny"),
        (["run", "--preset", "tiny", "--backend", "torch-nope"], "unknown backend 'torch-nope'; known backends: "),
        (["run", "--preset", "tiny", "--model", "moe"], "unknown model 'moe'; known models: linear, geglu"),
        (["run", "--preset", "tiny", "--dtype", "float8"], "unknown dtype 'float8'; known dtypes: float32, bfloat16"),
        (["run", "--preset", "tiny", "--mode", "train"], "unknown mode 'train'; known modes: fwd, bwd, fwd+bwd"),
        (["run", "--preset", "tiny", "--hidden", "0"], "shape dimension 'hidden' must be a positive integer, got 0"),
        (["run", "--preset", "tiny", "--batch", "-3"], "shape dimension 'batch' must be a positive integer, got -3"),
        (["run", "--model", "geglu", "--batch", "2", "--seq", "3"], "missing: --dim, --hidden"),
        (["report", "nowhere/results.json"], "results file nowhere/results.json does not exist"),
    ],
)
def test_bad_input_exits_2_naming_what_is_wrong(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "bad input left files behind"  # `report nowhere/...` made nowhere/.lock


def test_drifted_golden_exits_2_naming_the_file(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", golden)
    target = golden / "geglu-3x37x96-328-float32-normal-s0.safetensors"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0x10
    target.write_bytes(bytes(data))
    p = _cli(
        "run",
        "--preset",
        "tiny",
        "--backend",
        "torch-eager",
        "--out",
        str(tmp_path / "o"),
        env={"FUSION_COMPARE_GOLDEN_DIR": str(golden)},
    )
    assert p.returncode == 2, p.stderr
    assert "geglu-3x37x96-328-float32-normal-s0.safetensors does not match its manifest" in p.stderr
    assert "python scripts/make_golden.py" in p.stderr


def test_a_deviation_exits_0_and_1_under_strict(tmp_path: Path) -> None:
    """jax-xla's bias gradient of a bf16 linear layer deviates (a token sum in the low dtype: a real difference, not
    a different function; the gate reports it as an unexplained deviation of the rms, in numbers): ``run`` reports it
    and exits 0; with ``--strict`` the same run exits 1. On XLA:CPU."""
    args = ["run", "--preset", "tiny", "--model", "linear", "--dtype", "bfloat16", "--mode", "fwd+bwd"]
    args += ["--backend", "jax-xla", "--budget", "0.02", "--no-plots", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    (row,) = doc["results"]
    assert row["status"] == "deviates" and row["parity"]["tier"] == "deviates", row["reason"]
    assert row["parity"]["deviated"] == ["dbias:max", "dbias:rms"] or row["parity"]["deviated"] == ["dbias:rms"]
    dbias = next(t for t in row["parity"]["tensors"] if t["tensor"] == "dbias")
    assert unexplained_rms(dbias["cause"]), dbias["cause"]
    summary = (tmp_path / "a" / "REPORT.md").read_text()
    assert "deviates: jax-xla" in summary and f"dbias:rms: {dbias['cause']}" in summary
    assert main([*args, "--strict", "--out", str(tmp_path / "b")]) == 1


def test_prepare_fills_the_data_cache_that_run_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` computes a case's reference, plain computation and resolution into the data cache, under the very
    keys a run reads: after it, neither the plain computation nor the reference is computed again (the control: with
    an empty cache the plain computation runs). A second prepare is a hit; bad input and a cache that is off are
    refused (exit 2)."""
    from compare.problem import datacache, golden
    from compare.problem.cases import PRESETS
    from compare.run import cell

    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))
    argv = ["prepare", "--model", "geglu", "--batch", "2", "--seq", "5", "--dim", "24", "--hidden", "40"]
    assert main([*argv, "--dtype", "float32", "bfloat16", "--mode", "fwd", "fwd+bwd"]) == 0
    kinds = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir())
    assert kinds == ["plain"] * 2 + ["reference"] * 2 + ["resolution"] * 2

    def computed(*a: object, **k: object) -> None:
        raise AssertionError("computed again")

    case = PRESETS["tiny"].case("bfloat16", model="geglu")
    case = type(case)(case.model, type(case.shape)(2, 5, 24, 40), "bfloat16", case.dist, 0)
    monkeypatch.setattr(cell, "plain_run_of", computed)
    monkeypatch.setattr(golden, "compute", computed)
    golden.golden_for.cache_clear()
    plain = cell.plain_reference.__wrapped__(case)  # type: ignore[attr-defined]
    assert set(plain) == set(golden.golden_for(case).ref)  # every gradient read, none computed
    assert main([*argv, "--dtype", "bfloat16", "--mode", "fwd+bwd"]) == 0
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "empty"))
    golden.golden_for.cache_clear()
    with pytest.raises(AssertionError, match="computed again"):
        cell.plain_reference.__wrapped__(case)  # type: ignore[attr-defined]
    assert main([*argv, "--mode", "fwdx"]) == 2
    monkeypatch.setenv(datacache.ENV, "off")
    assert main(argv) == 2
