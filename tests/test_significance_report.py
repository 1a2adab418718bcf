"""Derived figures obey ``compare diff``'s significance rule: a difference within noise is never printed as a number.

The noisy case is the one a real CPU report showed: torch-eager at 4.95 ms with an IQR of 4.81 ms against a
compiled step at 4.92 ms. It used to read "measured saved 30 us" and "paid back after 9,402 calls"; the speedup,
the measured saving and the payback must all say "within noise" instead. A clear 2x with a tight spread keeps its
numbers.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from compare.cost.model import cost
from compare.problem.cases import PRESETS
from compare.report import render as report
from compare.report.cost import fusion_benefit, fusion_section
from compare.report.shapes import shapes_section, with_payback
from compare.results.document import Result, Results
from compare.timing.timer import Timing

pytestmark = pytest.mark.quick

CASE = PRESETS["cpu-mlp"].case("float32")


def _samples(median: float, rel_iqr: float, n: int = 20, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, rel_iqr / 1.349)) for _ in range(n)]


def _timing(median: float, iqr: float, samples: list[float] | None = None) -> dict[str, Any]:
    t = {
        "median_s": median,
        "iqr_s": iqr,
        "min_s": median - iqr / 2,
        "max_s": median + iqr / 2,
        "n": 20,
        "calls_per_sample": 1,
        "first_call_s": 0.5,
        "noisy": iqr > 0.1 * median,
    }
    if samples is not None:
        t["samples_s"] = samples
    return t


def _row(backend: str, timing: dict[str, Any]) -> dict[str, Any]:
    r = Result.for_case(backend, CASE, "fwd", "ok").to_dict()
    r["timing"] = timing
    r["cost"] = cost(CASE, backend, "fwd").to_dict()
    return r


def _doc(eager: dict[str, Any], compiled: dict[str, Any]) -> Results:
    return Results.from_dict(
        {
            "created": "2026-01-01T00:00:00+00:00",
            "config": {},
            "environment": {"versions": {}, "threads": {}, "precision": {}},
            "results": [_row("torch-eager", eager), _row("torch-compile", compiled)],
        }
    )


def _sweep(rows: list[dict[str, Any]]) -> Results:
    """A document holding only a shape sweep's rows."""
    return Results(shape_sweep=tuple(rows))


def _sweep_rows(eager: tuple[float, float], compiled: tuple[float, float]) -> list[dict[str, Any]]:
    common = {
        "tokens": 1024,
        "model": "geglu",
        "dim": 768,
        "hidden": 3072,
        "dtype": "float32",
        "mode": "fwd",
        "framework": "torch",
        "compile_counter": "c",
        "timed": True,
    }
    return [
        {
            **common,
            "backend": "torch-eager",
            "dynamic": None,
            "generic": True,
            "compiles": 0,
            "first_call_s": 0.01,
            "median_s": eager[0],
            "iqr_s": eager[1],
        },
        {
            **common,
            "backend": "torch-compile",
            "dynamic": False,
            "generic": False,
            "compiles": 1,
            "first_call_s": 0.3,
            "median_s": compiled[0],
            "iqr_s": compiled[1],
        },
    ]


def _line(md: str, start: str) -> str:
    return next(x for x in md.splitlines() if x.startswith(start))


def test_noise_is_said_not_numbered() -> None:
    doc = _doc(_timing(4.95e-3, 4.81e-3), _timing(4.92e-3, 0.05e-3))
    timing = _line(report.timing_section(doc.results), "| torch-compile")
    assert "within noise" in timing and "1.01x" not in timing
    assert "| baseline |" in _line(report.timing_section(doc.results), "| torch-eager")

    (row,) = fusion_benefit(doc)
    assert row["measured_verdict"] == "within noise"
    assert abs(row["measured_saved_s"] - 0.03e-3) < 1e-12  # the number stays in the data
    fused = _line(fusion_section(doc), "| torch-compile")
    assert "within noise" in fused and "30 us" not in fused

    rows = with_payback(_sweep_rows((4.95e-3, 4.81e-3), (4.92e-3, 0.05e-3)))
    assert rows[1]["payback_verdict"] == "within noise" and rows[1]["payback_calls"] is None
    text = shapes_section(_sweep(rows))
    compiled = _line(text, "| torch-compile")
    assert "never (not faster beyond noise than torch-eager)" in compiled and "calls" not in compiled

    md = report.render(replace(doc, shape_sweep=tuple(rows)))
    assert "within noise" in md and "9,402" not in md and "30 us" not in md


def test_a_clear_2x_keeps_its_numbers() -> None:
    eager = _samples(10e-3, 0.02, seed=1)
    comp = _samples(5e-3, 0.02, seed=2)
    doc = _doc(_timing(sorted(eager)[10], 0.2e-3, eager), _timing(sorted(comp)[10], 0.1e-3, comp))
    timing = _line(report.timing_section(doc.results), "| torch-compile")
    vs_eager = timing.split("|")[17]  # the timing table's "vs eager" column
    assert "2.0" in vs_eager and "x" in vs_eager, timing  # "2.00x" give or take noise
    (row,) = fusion_benefit(doc)
    assert row["measured_verdict"] == "faster"
    assert "within noise" not in _line(fusion_section(doc), "| torch-compile")

    rows = with_payback(_sweep_rows((10e-3, 0.1e-3), (5e-3, 0.05e-3)))
    assert rows[1]["payback_verdict"] == "faster"
    assert rows[1]["payback_calls"] == (0.3 - 5e-3) / 5e-3
    assert "59 calls vs torch-eager" in shapes_section(_sweep(rows))


def test_slower_beyond_noise_is_numbered_and_never_pays_back() -> None:
    doc = _doc(_timing(5e-3, 0.05e-3), _timing(10e-3, 0.05e-3))
    assert "| 0.50x, unpaired |" in _line(report.timing_section(doc.results), "| torch-compile")
    (row,) = fusion_benefit(doc)
    assert row["measured_verdict"] == "slower"
    assert "-5 ms" in _line(fusion_section(doc), "| torch-compile")
    rows = with_payback(_sweep_rows((5e-3, 0.05e-3), (10e-3, 0.05e-3)))
    assert "never (slower than torch-eager)" in _line(shapes_section(_sweep(rows)), "| torch-compile")


def test_modes_section_speedups_follow_the_rule() -> None:
    doc = _doc(_timing(4.95e-3, 4.81e-3), _timing(4.92e-3, 0.05e-3))
    bwd = [
        replace(r, mode="bwd", timing=Timing.from_dict(_timing(10e-3 if r.backend == "torch-eager" else 5e-3, 0.05e-3)))
        for r in doc.results
    ]
    md = report.modes_section([*doc.results, *bwd])
    row = _line(md, "| torch-compile")
    assert "4.92 ms (within noise, unpaired)" in row and "5 ms (2.00x, unpaired)" in row


def test_old_documents_are_judged_again() -> None:
    """A results file written before the verdict existed carries a call count computed from noise: not shown."""
    rows = with_payback(_sweep_rows((4.95e-3, 4.81e-3), (4.92e-3, 0.05e-3)))
    for r in rows:
        r.pop("payback_verdict")
    rows[1]["payback_calls"] = 9402.0
    assert "9,402" not in shapes_section(_sweep(rows))


def test_significance_is_framework_free_and_imports_no_report() -> None:
    code = (
        "import sys, compare.timing.significance; "
        "bad = [m for m in ('torch', 'jax', 'compare.report.render', 'compare.report.diff') if m in sys.modules]; "
        "assert not bad, bad; "
        "import compare.report.diff; "
        "assert compare.report.diff.compare_timing is compare.timing.significance.compare_timing"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
