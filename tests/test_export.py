"""``python -m compare export results.json --csv``: one flat row per cell, its figures those the report shows."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from compare.cli.main import main
from compare.report import export
from compare.report.summary import speedup_cell
from compare.results.document import read_json

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = [ROOT / "reports" / name / "results.json" for name in ("cpu", "cpu-tp")]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_one_row_per_cell_with_the_reports_figures(path: Path) -> None:
    doc = read_json(path)
    rows = list(csv.DictReader(io.StringIO(export.to_csv(doc))))
    assert len(rows) == len(doc.results) > 0
    assert tuple(rows[0]) == export.COLUMNS
    for r, row in zip(doc.results, rows, strict=True):
        assert (row["backend"], row["case"], row["dtype"], row["mode"]) == (r.backend, r.case, r.dtype, r.mode)
        assert row["status"] == r.status and row["world_size"] == str(r.world_size)
        assert row["median_s"] == ("" if r.timing is None else repr(r.timing.median_s))
        said = speedup_cell(doc.results, r)  # the summary table's cell: a figure, "within noise", "baseline", "-"
        if said.endswith("x") or "x," in said:
            assert row["speedup_verdict"] in ("faster", "slower") and row["speedup"], (said, row)
            assert float(row["speedup"]) == pytest.approx(float(said.split("x")[0]), abs=0.005)  # shown to 2 decimals
        else:
            assert row["speedup"] == "", (said, row)
            assert row["speedup_verdict"] == {"-": "not compared", "baseline": "baseline"}.get(
                said, row["speedup_verdict"]
            )
            if said.startswith("within noise"):
                assert row["speedup_verdict"] == "within noise"


def test_the_command_writes_the_file_or_prints_with_or_without_csv_its_one_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cells.csv"
    assert main(["export", str(COMMITTED[0]), "--csv", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 1 + len(read_json(COMMITTED[0]).results)
    assert main(["export", str(COMMITTED[0].parent), "--csv"]) == 0  # a folder, as `report` reads one
    assert capsys.readouterr().out.count("\n") >= 1 + len(read_json(COMMITTED[0]).results)
    p = subprocess.run(
        [sys.executable, "-m", "compare", "export", str(COMMITTED[0])], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0 and p.stdout.count("\n") == 1 + len(read_json(COMMITTED[0]).results), p.stderr
