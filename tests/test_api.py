"""The public Python API (``compare/__init__.py``): run cases on backends, load results, render a report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import compare

pytestmark = pytest.mark.quick


def test_run_load_and_render(tmp_path: Path) -> None:
    case = compare.PRESETS["tiny"].case("bfloat16")
    doc = compare.run_cases([case], ["torch-eager"], modes=["fwd"], budget_s=0.05)
    (r,) = doc.results
    assert r.status == "ok" and r.parity is not None and r.parity.passed and r.timing and r.timing.median_s > 0
    path = tmp_path / "results.json"
    path.write_text(json.dumps(compare.to_json(doc)), encoding="utf-8")
    again = compare.load_results(path)
    assert isinstance(again, compare.Results) and again.results[0].backend == "torch-eager"
    assert again == doc  # what was written reads back the same, typed
    assert compare.render_report(again).startswith("# fusion-compare report")


def test_the_api_refuses_bad_names() -> None:
    with pytest.raises(compare.InputError, match="unknown backend 'torch-nope'; known backends: torch-eager"):
        compare.run_cases([compare.PRESETS["tiny"].case("float32")], ["torch-nope"])


def test_the_public_surface_is_what_all_lists() -> None:
    assert sorted(compare.__all__) == sorted(set(compare.__all__))
    assert all(hasattr(compare, name) for name in compare.__all__)
