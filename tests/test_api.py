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


def test_a_module_file_is_a_case_checked_as_the_cli_checks_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``compare.module_case``: the example as a case run by ``run_cases`` on its backends, both ok; a file whose
    ``reference`` leaves out a bias refused with the CLI's words."""
    from tests.test_module_file import EXAMPLE, module_source, write

    monkeypatch.setenv("FUSION_COMPARE_CACHE", str(tmp_path / "cache"))  # this test's golden, computed here
    case = compare.module_case(EXAMPLE, 96, 328)
    assert case.model == "module" and case.module is not None and case.shape.tokens == 3 * 37
    doc = compare.run_cases([case], ["torch-module", "jax-module"], modes=["fwd"], budget_s=0.05)
    assert [(r.backend, r.status) for r in doc.results] == [("torch-module", "ok"), ("jax-module", "ok")]
    wrong = module_source(
        extra="""
        def reference(params, x):
            return np.maximum(x @ params["up.weight"].T + params["up.bias"], 0.0) ** 2 @ params["down.weight"].T
        """
    )
    with pytest.raises(compare.InputError, match=r"its reference\(params, x\) and its torch_module differ"):
        compare.module_case(write(tmp_path, wrong), 96, 96)
