"""Run ids: a run's store (``cells.jsonl``) and its ``results.json`` carry the same id, and ``report DIR`` renders the
newest run there, never an older run's ``results.json`` in silence (issue 31: after a SIGKILL into a folder that held
an older run of the same cells, ``report DIR`` re-rendered the older document). The SIGKILL is simulated by writing
the store's lines without the end mark and without a results.json (``tests/test_faults.py`` kills real runs). What it
cannot see: two runs of a fusion-compare from before run ids (no id on either side): those are told apart by their
cells only, as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compare.cli.main import main
from compare.formats.codec import from_json, to_json
from compare.formats.jsonl import read_records
from compare.results.document import Result, Results, read_json, write_json
from compare.results.load import Load
from compare.run.store import CELLS, new_run_id, open_run, read_store
from tests.test_diff import _doc, _result, _samples

pytestmark = pytest.mark.quick

OLD_ID, NEW_ID = "20250101T000000Z-aaaaaa", "20250102T000000Z-bbbbbb"


def _row(backend: str, median: float, note: str) -> Result:
    return from_json(Result, {**_result(backend, "float32", _samples(median, 0.05)), "note": note})


def _older_results(out: Path, rows: list[Result], run_id: str = OLD_ID) -> None:
    """An older run's complete ``results.json`` in ``out``."""
    write_json(out / "results.json", from_json(Results, {**_doc([to_json(r) for r in rows]), "run_id": run_id}))


def _killed_run(out: Path, rows: list[Result], run_id: str = NEW_ID) -> None:
    """A run's store as a SIGKILL leaves it: the header and its cells, no end mark, no summary written."""
    with open_run(out, {"command": "python -m compare run --preset tiny"}, run_id) as store:
        for r in rows:
            store.cell(r, {})


def test_the_store_and_its_document_carry_the_run_id(tmp_path: Path) -> None:
    _killed_run(tmp_path, [_row("torch-eager", 1e-3, "")])
    lines = read_records(tmp_path / CELLS)
    assert [x.get("run_id") for x in lines] == [NEW_ID, NEW_ID]
    doc = read_store(tmp_path / CELLS)
    assert doc.run_id == NEW_ID and doc.interrupted and doc.load is None
    a, b = new_run_id(), new_run_id()
    assert a != b and len(a) == len("20250101T000000Z-aaaaaa")
    with open_run(tmp_path, {}) as store:  # a store without a given id makes its own; its load line reads back
        store.load(Load(window_s=1.0, cores=2, others_cpu_s=0.5, steal_s=0.0))
        store.end()
    again = read_store(tmp_path / CELLS)
    assert again.run_id == store.run_id != "" and again.load == Load(1.0, 2, None, 0.5, 0.0) and not again.interrupted


def test_report_dir_rebuilds_from_the_newer_run_not_the_older_results_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: an older run's results.json of the same cell, a newer run killed with that cell (other
    numbers) and a new one stored: ``report DIR`` renders the store's run, rebuilds results.json and says why."""
    _older_results(tmp_path, [_row("torch-eager", 1e-3, "from the older run")])
    _killed_run(tmp_path, [_row("torch-eager", 7e-3, "from the newer run"), _row("jax-xla", 2e-3, "newer too")])
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"rebuilt from the store {tmp_path / CELLS}, run {NEW_ID}" in out
    assert f"{tmp_path / 'results.json'} was an older run's ({OLD_ID}" in out
    doc = read_json(tmp_path / "results.json")
    assert doc.run_id == NEW_ID and {r.backend for r in doc.results} == {"torch-eager", "jax-xla"}
    md = (tmp_path / "DETAILS.md").read_text()
    assert "from the newer run" in md and "newer too" in md and "from the older run" not in md


def test_report_dir_renders_the_runs_own_results_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative control: a results.json of the store's own run holding every stored cell is that run's summary (it
    has what the store does not: plots, budget, telemetry): rendered as it is, results.json untouched, no note."""
    rows = [_row("torch-eager", 1e-3, "the run's own summary")]
    _killed_run(tmp_path, rows)
    _older_results(tmp_path, rows, run_id=NEW_ID)
    before = (tmp_path / "results.json").read_bytes()
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'REPORT.md'}"
    assert (tmp_path / "results.json").read_bytes() == before
    assert "the run's own summary" in (tmp_path / "DETAILS.md").read_text()


def test_an_older_run_with_cells_the_newer_lacks_is_kept_and_the_report_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newer run was killed after one of the older run's two cells: the older results.json is never replaced by
    fewer cells; the newer run's document goes to results.interrupted.json and REPORT.interrupted.md, saying so."""
    _older_results(tmp_path, [_row("torch-eager", 1e-3, "old"), _row("jax-xla", 1e-3, "old")])
    before = (tmp_path / "results.json").read_bytes()
    _killed_run(tmp_path, [_row("torch-eager", 2e-3, "from the newer run")])
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"was an older run's ({OLD_ID}" in out and "kept: it holds cells this run lacks" in out
    assert (tmp_path / "results.json").read_bytes() == before
    assert read_json(tmp_path / "results.interrupted.json").run_id == NEW_ID
    assert "from the newer run" in (tmp_path / "DETAILS.interrupted.md").read_text()


def test_documents_from_before_run_ids_are_told_apart_by_their_cells(tmp_path: Path) -> None:
    """No id on either side (an older fusion-compare): a results.json holding every stored cell is rendered as before
    (by cells; the one case a run id cannot decide)."""
    rows = [_row("torch-eager", 1e-3, "no ids")]
    _killed_run(tmp_path, rows)
    lines = [json.loads(x) for x in (tmp_path / CELLS).read_text().splitlines()]
    without = [{k: v for k, v in x.items() if k != "run_id"} for x in lines]
    (tmp_path / CELLS).write_text("".join(json.dumps(x) + "\n" for x in without))
    _older_results(tmp_path, rows, run_id="")
    before = (tmp_path / "results.json").read_bytes()
    assert read_store(tmp_path / CELLS).run_id == ""
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "results.json").read_bytes() == before
