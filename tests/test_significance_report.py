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
from compare.formats.codec import from_json, to_json
from compare.problem.cases import PRESETS
from compare.report import render
from compare.report.cost import fusion_benefit, fusion_section
from compare.report.shapes import shapes_section
from compare.results.document import Result, Results
from compare.timing.compile_sweep import with_payback
from compare.timing.significance import MIN_PAIRS, NOT_TESTED, PAIRED, compare_timing
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
    r = to_json(Result.for_case(backend, CASE, "fwd", "ok"))
    r["timing"] = timing
    r["cost"] = to_json(cost(CASE, backend, "fwd"))
    return r


def _doc(eager: dict[str, Any], compiled: dict[str, Any]) -> Results:
    return from_json(
        Results,
        {
            "created": "2026-01-01T00:00:00+00:00",
            "config": {},
            "environment": {"versions": {}, "threads": {}, "precision": {}},
            "results": [_row("torch-eager", eager), _row("torch-compile", compiled)],
        },
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
    timing = _line(render.timing_section(doc.results), "| torch-compile")
    assert "within noise" in timing and "1.01x" not in timing
    assert "| baseline |" in _line(render.timing_section(doc.results), "| torch-eager")

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

    md = render.render(replace(doc, shape_sweep=tuple(rows)))
    assert "within noise" in md and "9,402" not in md and "30 us" not in md


def test_a_clear_2x_keeps_its_numbers() -> None:
    eager = _samples(10e-3, 0.02, seed=1)
    comp = _samples(5e-3, 0.02, seed=2)
    doc = _doc(_timing(sorted(eager)[10], 0.2e-3, eager), _timing(sorted(comp)[10], 0.1e-3, comp))
    timing = _line(render.timing_section(doc.results), "| torch-compile")
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
    assert "| 0.50x, unpaired |" in _line(render.timing_section(doc.results), "| torch-compile")
    (row,) = fusion_benefit(doc)
    assert row["measured_verdict"] == "slower"
    assert "-5 ms" in _line(fusion_section(doc), "| torch-compile")
    rows = with_payback(_sweep_rows((5e-3, 0.05e-3), (10e-3, 0.05e-3)))
    assert "never (slower than torch-eager)" in _line(shapes_section(_sweep(rows)), "| torch-compile")


def test_modes_section_speedups_follow_the_rule() -> None:
    doc = _doc(_timing(4.95e-3, 4.81e-3), _timing(4.92e-3, 0.05e-3))
    bwd = [
        replace(
            r, mode="bwd", timing=from_json(Timing, _timing(10e-3 if r.backend == "torch-eager" else 5e-3, 0.05e-3))
        )
        for r in doc.results
    ]
    md = render.modes_section([*doc.results, *bwd])
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


def _interleaved(median: float, rounds: int) -> dict[str, Any]:
    """A timing of one interleaved group of ``rounds`` rounds, samples within +-1% of ``median``."""
    samples = [median * (1 + 0.01 * (2 * i / (rounds - 1) - 1)) for i in range(rounds)]
    return {
        **_timing(median, 0.01 * median, samples),
        "design": "interleaved",
        "group": "g#1",
        "rounds": list(range(rounds)),
    }


@pytest.mark.parametrize("rounds", [5, MIN_PAIRS])
def test_a_paired_test_that_could_not_run_is_said_not_tested_in_every_table(rounds: int) -> None:
    """torch-compile 2x torch-eager, timed together for 5 rounds (the paired test needs 8): the timing table's
    speedup, the fusion table's measured saving and the summary say 'not tested (5 rounds)', never a number and
    never 'within noise'. The control: 8 rounds are tested, and the 2x is a number everywhere."""
    doc = _doc(_interleaved(10e-3, rounds), _interleaved(5e-3, rounds))
    cell = render.speedup_cell(doc.results, doc.results[1])
    (row,) = fusion_benefit(doc)
    fused = _line(fusion_section(doc), "| torch-compile")
    # what the report claims: its table rows and summary lines (the intros name every verdict the rule can give)
    md = "\n".join(x for x in render.render(doc).splitlines() if x.startswith(("|", "- **")))
    if rounds < MIN_PAIRS:
        assert cell == "not tested (5 rounds)", cell
        assert row["measured_verdict"] == NOT_TESTED and row["measured_pairs"] == 5
        assert "not tested (5 rounds)" in fused and "5 ms" not in fused.split("|")[13], fused
        assert "within noise" not in md and "2.00x" not in md
    else:
        assert cell == "2.00x", cell
        assert row["measured_verdict"] == "faster" and "not tested" not in md


def test_the_verdict_carries_not_tested_apart_from_within_noise() -> None:
    """Paired with fewer than MIN_PAIRS rounds: NOT_TESTED with its round count, not significant, no p-values (the
    test did not run). The control: one round more than enough gives p-values and a verdict."""
    for rounds, verdict in ((MIN_PAIRS - 1, NOT_TESTED), (MIN_PAIRS, "faster")):
        v = compare_timing(_interleaved(10e-3, rounds), _interleaved(5e-3, rounds))
        assert (v.verdict, v.pairs, v.design) == (verdict, rounds, PAIRED), v
        assert v.significant == (verdict == "faster") and (v.p_faster is None) == (verdict == NOT_TESTED)
        assert v.said("2x") == ("2x" if verdict == "faster" else f"not tested ({rounds} rounds)")
