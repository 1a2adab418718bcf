"""A user's own MLP (``--module``) gets the report a built-in case gets: the same sections, with "not modelled" where
the cost model's bytes-and-FLOPs plan would be, and FLOPs measured by ``torch.utils.flop_counter`` (torch) and XLA's
``cost_analysis()`` (JAX) instead; the module's backends join the compile-cost sweep as the built-in ones do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compare.cli.main import main
from compare.results.document import read_json

pytestmark = pytest.mark.standard

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "squared_relu_mlp.py"
COMMON = ["--dtype", "float32", "--mode", "fwd+bwd", "--budget", "0.02", "--no-ceilings", "--profile", "--memory"]
COMMON += ["--quiet", "--shape-sweep", "1", "64"]
DIM, HIDDEN = 96, 328


def _headings(text: str) -> list[str]:
    """The ``##`` section headings (case names, in ``###`` headings, aside)."""
    return [line for line in text.splitlines() if line.startswith("## ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("module-report")
    module = ["run", "--module", str(EXAMPLE), "--dim", str(DIM), "--hidden", str(HIDDEN)]
    assert main([*module, *COMMON, "--out", str(d / "m")]) == 0
    built_in = ["run", "--preset", "tiny", "--backend", "torch-eager", "jax-xla", "jax-unfused"]
    assert main([*built_in, *COMMON, "--out", str(d / "b")]) == 0
    return d / "m", d / "b"


def test_same_sections_as_a_built_in_case(runs: tuple[Path, Path]) -> None:
    m, b = runs
    for name in ("REPORT.md", "DETAILS.md"):
        assert _headings((m / name).read_text()) == _headings((b / name).read_text()), name
    details = (m / "DETAILS.md").read_text()
    for section in ("What fusion buys", "Cost model and roofline", "Cost model against XLA's cost analysis"):
        body = details.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        assert "not modelled" in body, section


def test_measured_flops_are_the_gemms(runs: tuple[Path, Path]) -> None:
    """torch's flop counter counts only matmuls: exactly the six GEMMs of forward+backward (2 forward, 4
    backward), 2 * tokens * dim * hidden each. XLA counts the elementwise ops (bias adds, ReLU, square and their
    backward) too: a few FLOPs per hidden and output element above the GEMMs."""
    m, _ = runs
    doc = read_json(m / "results.json")
    tokens = doc.results[0].shape.tokens
    gemms = 6 * 2 * tokens * DIM * HIDDEN
    by = {r.backend: r for r in doc.results}
    counted = by["torch-module"].kernels.flop_count  # type: ignore[union-attr]
    assert counted is not None and counted["flops"] == gemms, counted
    compiled = by["torch-module-compile"].kernels.flop_count  # type: ignore[union-attr]
    assert compiled is not None and compiled["flops"] == gemms, compiled
    for backend in ("jax-module", "jax-module-unfused"):
        xla = by[backend].kernels.xla_cost  # type: ignore[union-attr]
        assert xla is not None and gemms <= xla["flops"] <= gemms + 16 * tokens * (HIDDEN + DIM), (backend, xla)
    details = (m / "DETAILS.md").read_text()
    roofline = details.split("## Cost model and roofline\n", 1)[1].split("\n## ", 1)[0]
    for backend in ("torch-module", "jax-module"):
        row = next(line for line in roofline.splitlines() if line.startswith(f"| {backend} |"))
        assert re.search(r"\| [\d.]+ MFLOP \| (torch flop_counter|XLA cost_analysis) \|", row), row
        assert "FLOP/s" in row, row
    fusion = details.split("## What fusion buys\n", 1)[1].split("\n## ", 1)[0]
    assert "| jax-module | jax-module-unfused |" in fusion
    assert "| torch-module-compile | torch-module |" in fusion


def test_the_module_backends_join_the_compile_cost_sweep(runs: tuple[Path, Path]) -> None:
    """Each sweeping module backend over both token counts, with the variants of its built-in counterpart: eager
    compiles nothing, torch.compile (dynamic False and True) and its max-autotune twin and jax.jit compile once per
    new shape, by their own counters."""
    m, _ = runs
    doc = read_json(m / "results.json")
    rows = {(r["backend"], r["dynamic"], r["tokens"]): r for r in doc.shape_sweep}
    want = [("torch-module", None), ("torch-module-compile", False), ("torch-module-compile", True)]
    want += [("torch-module-compile-max-autotune", False), ("jax-module", False)]
    assert sorted(rows) == sorted((b, d, t) for b, d in want for t in (1, 64)), sorted(rows)
    for (backend, _, _), r in rows.items():
        assert r["compiles"] == (0 if backend == "torch-module" else 1) and not r.get("error"), r


def test_a_module_run_reads_as_one_against_its_own_baseline(runs: tuple[Path, Path]) -> None:
    """A module run names torch-module as its baseline everywhere it speaks of one (its legends said "tested against
    torch-eager" and "vs eager"), its CSV compares against torch-module (it said "not compared" on every row) with
    the module's sha256, and a failing row has no speedup (it read "151.20x")."""
    import csv
    import dataclasses
    import io

    from compare.report import export
    from compare.report.render import files
    from compare.report.summary import speedup_cell

    m, _ = runs
    text = (m / "REPORT.md").read_text(encoding="utf-8") + (m / "DETAILS.md").read_text(encoding="utf-8")
    assert "torch-eager" not in text and "vs eager" not in text
    assert "tested against torch-module" in text and "[vs torch-module](" in text
    doc = read_json(m / "results.json")
    rows = list(csv.DictReader(io.StringIO(export.to_csv(doc))))
    verdicts = {r["backend"]: r["speedup_verdict"] for r in rows}
    assert verdicts["torch-module"] == "baseline"
    assert all(v != "not compared" for v in verdicts.values()), verdicts
    assert {r["module_sha256"] for r in rows} == {doc.results[0].module.sha256}  # type: ignore[union-attr]
    failed = dataclasses.replace(doc.results[-1], status="parity-fail")
    assert failed.backend != "torch-module" and failed.timing is not None
    assert speedup_cell([*doc.results[:-1], failed], failed) == "- (parity-fail)"
    assert export.row(dataclasses.replace(doc, results=(*doc.results[:-1], failed)), failed)["speedup"] == ""
    assert "- (parity-fail)" in files(dataclasses.replace(doc, results=(*doc.results[:-1], failed)))["REPORT.md"]
