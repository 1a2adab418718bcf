"""Plots from a results document: valid PNGs with deterministic names, and a report section embedding them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from compare.cost.model import cost, roofline
from compare.cost.records import Ceiling
from compare.formats.codec import from_json, to_json
from compare.problem.cases import Case, Shape
from compare.report.plots import plots_section, render_plots
from compare.results.document import SCHEMA_VERSION, Results

pytestmark = pytest.mark.quick

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _result(backend: str, tokens: int, median: float, cost: dict[str, Any] | None = None) -> dict[str, Any]:
    samples = [median * f for f in (0.95, 0.98, 1.0, 1.02, 1.1)]
    return {
        "backend": backend,
        "model": "geglu",
        "dtype": "float32",
        "mode": "fwd",
        "status": "ok",
        "shape": {"batch": tokens, "seq": 1, "dim": 96, "hidden": 328},
        "case": f"geglu-{tokens}x1x96-328-float32-normal-s0",
        "timing": {
            "median_s": median,
            "iqr_s": 0.04 * median,
            "min_s": samples[0],
            "max_s": samples[-1],
            "n": 5,
            "samples_s": samples,
        },
        "cost": cost,
    }


#: A machine's ceilings, as the run's ``ceilings`` probe would report them.
CEIL = {"flops_per_s": 3e11, "bytes_per_s": 2e10}


def _cost(backend: str, tokens: int, median: float) -> dict[str, Any]:
    """The real cost model's entry for the result, with the roofline numbers a run with ceilings stores."""
    case = Case("geglu", Shape(tokens, 1, 96, 328), "float32")
    c = cost(case, backend, "fwd")
    return to_json(replace(c, achieved=roofline(c, median, from_json(Ceiling, CEIL))))


def _typed(doc: dict[str, Any]) -> Results:
    return from_json(Results, doc)


def _doc(with_cost: bool) -> dict[str, Any]:
    rs = []
    for t in (1, 16, 256):
        for backend, speed in (("torch-eager", 1.0), ("jax-xla", 2.0)):
            median = 1e-5 * (1 + t / 16) / speed
            rs.append(_result(backend, t, median, _cost(backend, t, median) if with_cost else None))
    rs.append({**_result("torch-triton", 16, 1.0), "timing": None, "note": "interpreted"})  # untimed: not drawn
    return {
        "schema_version": SCHEMA_VERSION,
        "created": "2026-01-01T00:00:00+00:00",
        "config": {},
        "environment": {},
        "results": rs,
        **({"ceilings": {"device": "cpu", "float32": CEIL}} if with_cost else {}),
    }


@pytest.mark.standard
def test_plots_are_pngs_with_deterministic_names(tmp_path: Path) -> None:
    paths = render_plots(_typed(_doc(with_cost=True)), tmp_path / "plots")
    assert [p.name for p in paths] == [
        "roofline-geglu-d96-h328.png",
        "time-geglu-d96-h328.png",
        "speedup-geglu-d96-h328.png",
        "ceiling-geglu-d96-h328.png",
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1000, p
    # same document, same files
    again = render_plots(_typed(_doc(with_cost=True)), tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]


def test_ceiling_plot_skipped_without_cost(tmp_path: Path) -> None:
    paths = render_plots(_typed(_doc(with_cost=False)), tmp_path)
    assert [p.name for p in paths] == ["time-geglu-d96-h328.png", "speedup-geglu-d96-h328.png"]


def test_one_shape_with_ceilings_gets_its_roofline_plot(tmp_path: Path) -> None:
    """A single-shape run (``make report``) measured its ceilings: the roofline plot renders from the real cost
    model's numbers; the plots that need several token counts do not."""
    doc = _doc(with_cost=True)
    doc["results"] = [r for r in doc["results"] if r["shape"]["batch"] == 16]
    paths = render_plots(_typed(doc), tmp_path)
    assert [p.name for p in paths] == ["roofline-geglu-d96-h328.png"]
    assert paths[0].read_bytes()[:8] == PNG_SIGNATURE


def test_single_token_count_or_no_timing_gives_no_plots(tmp_path: Path) -> None:
    doc = _doc(with_cost=False)
    doc["results"] = [r for r in doc["results"] if r["shape"]["batch"] == 16]
    assert render_plots(_typed(doc), tmp_path) == []
    assert render_plots(Results(), tmp_path) == []
    assert not list(tmp_path.iterdir())


@pytest.mark.standard
def test_section_embeds_the_plots(tmp_path: Path) -> None:
    doc = _doc(with_cost=True)
    doc["plots"] = [p.relative_to(tmp_path).as_posix() for p in render_plots(_typed(doc), tmp_path / "plots")]
    md = plots_section(_typed(doc))
    assert md.startswith("## Plots")
    for rel in doc["plots"]:
        assert f"]({rel})" in md and (tmp_path / rel).is_file()
    assert "![geglu-d96-h328: median time per call against tokens](plots/time-geglu-d96-h328.png)" in md
    assert plots_section(_typed(doc), ["x/y.png"]).count("![") == 1
    assert plots_section(Results()) == ""


@pytest.mark.standard
def test_the_ceiling_plot_renders_from_a_real_run(tmp_path: Path) -> None:
    """A run that measures its ceilings stores the cost model's roofline numbers (``cost.achieved``) on every timed,
    modelled result, and the ceiling plot draws them: no hand-made keys on either side."""
    from compare.backends.registry import spec
    from compare.problem.cases import PRESETS
    from compare.problem.shape_cases import case_for_tokens
    from compare.run import harness
    from compare.run.options import RunOptions

    base = PRESETS["tiny"].case("float32")
    cases = [case_for_tokens(base, t) for t in (base.shape.tokens, 2 * base.shape.tokens)]
    options = RunOptions(harness.TimingConfig(budget_s=0.02), ceilings=True)
    doc = harness.run(cases, [spec("torch-eager")], ["fwd"], options)
    assert doc.ceilings is not None and doc.ceilings.get("float32") is not None
    assert all(r.cost is not None and r.cost.achieved is not None for r in doc.results), doc.results
    names = [p.name for p in render_plots(doc, tmp_path)]
    assert f"ceiling-{base.model}-d{base.shape.dim}-h{base.shape.hidden}.png" in names, names
    again = from_json(Results, to_json(doc))  # what results.json holds renders the same plot
    assert [p.name for p in render_plots(again, tmp_path / "again")] == names
