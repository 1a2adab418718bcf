"""A multi-host job folder (``compare.run.tp_hosts``) is one job: ``tp-job`` refuses a folder holding an earlier
job's events, ``tp-collect`` refuses events of another job (their job id is not the job file's) and a job whose
process 0 finished nothing, and a cell process 0 never finished is an error row (exit 1), never a missing one. Each
case here was reported as success (exit 0): the old job's cell, or 0 results."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from compare.cli.main import main
from compare.formats.codec import to_json
from compare.problem.cases import PRESETS
from compare.results.document import Result, read_json

pytestmark = pytest.mark.quick

JOB = ["tp-job", "--preset", "tiny", "--dtype", "float32", "--mode", "fwd", "bwd", "--world-size", "2"]
JOB += ["--backend", "jax-tp", "--addr", "127.0.0.1"]


def _job(folder: Path) -> dict[str, object]:
    assert main([*JOB, "--out", str(folder)]) == 0
    doc = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _events(folder: Path, job_id: object, done: list[int]) -> None:
    case = PRESETS["tiny"].case("float32")
    lines = [{"event": "ready", "t": time.time(), "job_id": job_id, "environment": {}}]
    for i, mode in enumerate(("fwd", "bwd")):
        if i in done:
            row = {**to_json(Result.for_case("jax-tp", case, mode, "skipped", reason="stand-in")), "world_size": 2}
            lines.append({"event": "done", "cell": i, "result": row})
    (folder / "rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_a_job_of_this_folder_is_collected(tmp_path: Path) -> None:
    """The control: process 0's events of this job, every cell done: exit 0, both rows."""
    doc = _job(tmp_path)
    _events(tmp_path, doc["job_id"], [0, 1])
    assert main(["tp-collect", str(tmp_path)]) == 0
    assert [r.mode for r in read_json(tmp_path / "results.json").results] == ["fwd", "bwd"]


def test_tp_job_into_a_folder_with_an_earlier_jobs_events_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _job(tmp_path)
    _events(tmp_path, doc["job_id"], [0, 1])
    before = (tmp_path / "job.json").read_bytes()
    assert main([*JOB, "--out", str(tmp_path)]) == 2
    assert "holds the event files of an earlier job (rank0.jsonl)" in _error(capsys)
    assert (tmp_path / "job.json").read_bytes() == before


def test_events_of_another_job_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _job(tmp_path)
    _events(tmp_path, "0" * 32, [0, 1])
    assert main(["tp-collect", str(tmp_path)]) == 2
    assert f"is not this job's: the job file's id is {doc['job_id']}" in _error(capsys)
    assert not (tmp_path / "results.json").exists()


def test_a_job_whose_process_0_finished_nothing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JAX workers that crashed on a port in use leave a ready event, or none, and no cell: exit 2, not 0 results."""
    doc = _job(tmp_path)
    _events(tmp_path, doc["job_id"], [])
    assert main(["tp-collect", str(tmp_path)]) == 2
    assert "process 0 finished no cell of this job" in _error(capsys)
    assert not (tmp_path / "results.json").exists()


def test_a_cell_process_0_never_finished_is_an_error_row(tmp_path: Path) -> None:
    doc = _job(tmp_path)
    _events(tmp_path, doc["job_id"], [0])
    assert main(["tp-collect", str(tmp_path)]) == 1
    rows = read_json(tmp_path / "results.json").results
    assert [(r.mode, r.status) for r in rows] == [("fwd", "skipped"), ("bwd", "error")]
    assert "process 0 reported no result for this cell" in rows[1].reason
