"""Running one sweep cell: here (``compare.run.harness.run_one``), or in a worker process (``python -m
compare.run.cell_worker CELL RESULT``, started through ``compare.run.child``) whose crash, signal or timeout
becomes the cell's ``error`` result. See ``compare.run.sweep``."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec
from compare.formats.atomic import write_text_atomic
from compare.formats.codec import from_json, to_json
from compare.problem import golden
from compare.problem.cases import Case, FileChanged
from compare.results import document, environment
from compare.run import child, harness, stop
from compare.run.grid import Cell

ROOT = Path(__file__).resolve().parents[2]


def run_cell_inprocess(
    s: BackendSpec, cell: Cell, cfg: harness.TimingConfig, plain_refs: dict[str, Any]
) -> tuple[document.Result, dict[str, Any]]:
    """Run one cell here, its memory record too (``harness.run_one(memory=True)``: the report plots memory against
    tokens); return (its result, ``{"precision": ..., "gpu": ...}`` as the backend left them)."""
    if cell.case.name not in plain_refs:
        plain_refs.clear()  # cells come case by case: keep one plain reference at a time
        try:
            plain_refs[cell.case.name] = harness.plain_reference(cell.case)
        except FileChanged as exc:  # a weights or module file changed since the driver hashed it: the cell's error
            r = document.Result.for_case(s.name, cell.case, cell.mode, "error", reason=str(exc))
            return r, {"precision": {}, "gpu": None}
    precision: dict[str, Any] = {}
    r = harness.run_one(s, cell.case, cell.mode, plain_refs[cell.case.name], cfg, precision, memory=True)
    return r, {"precision": precision, "gpu": environment.gpu()}


def run_cell_isolated(
    s: BackendSpec, cell: Cell, cfg: harness.TimingConfig, scratch: Path, timeout_s: float | None = None
) -> tuple[document.Result, dict[str, Any]]:
    """Run one cell in a worker process (``compare.run.child``: its own process group, ended with everything it
    started on a timeout or an interrupt); a crash, a signal or a timeout becomes an ``error`` result with the exit
    status, the signal and the tail of its stderr in ``extras``."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="cell-") as tmp:
        cell_path, result_path = Path(tmp) / "cell.json", Path(tmp) / "result.json"
        write_text_atomic(cell_path, json.dumps(payload(s, cell, cfg)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
        cmd = [sys.executable, "-m", "compare.run.cell_worker", str(cell_path), str(result_path)]
        worker = child.start(cmd, env=env)
        try:
            waited = worker.wait(timeout_s, check=stop.check)
            timed_out = waited is None
            rc = worker.end() if waited is None else waited
            tail = worker.tail()  # compare.run.child.TAIL_LINES lines
        finally:
            worker.close()  # ends the group first when the wait was interrupted
        if not timed_out and rc == 0 and result_path.is_file():
            out = json.loads(result_path.read_text(encoding="utf-8"))
            return from_json(document.Result, out["result"]), out["meta"]
    extras: dict[str, Any] = {"exit_code": rc, "stderr_tail": tail}
    if timed_out:
        reason = f"worker process timed out after {timeout_s:g} s and was killed"
    elif rc < 0:
        extras["signal"] = child.signal_name(rc)
        reason = f"worker process {child.killed_by(rc)}"
    elif rc != 0:
        reason = f"worker process {child.describe_exit(rc)}"
        last = tail.splitlines()[-1] if tail else ""
        reason += f": {last.strip()}" if last else ""
    else:
        reason = "worker process exited with status 0 but wrote no result"
    r = document.Result.for_case(s.name, cell.case, cell.mode, "error", reason=reason, extras=extras)
    return r, {"precision": {}, "gpu": None}


def payload(s: BackendSpec, cell: Cell, cfg: harness.TimingConfig, **more: Any) -> dict[str, Any]:
    """A cell as a worker is sent it (JSON data); ``golden_sha256``: the driver's hash of its golden data."""
    return {"spec": to_json(s), "case": to_json(cell.case), "mode": cell.mode, "timing": asdict(cfg), **more}


#: A worker process's plain references, one case at a time (as the local engine keeps them).
_PLAIN: dict[str, Any] = {}


def run_payload(sent: dict[str, Any], node_id: str = "") -> dict[str, Any]:
    """Run one cell of a :func:`payload` as a worker does: check its golden data against the driver's hash (when
    sent one: a difference is an ``error`` naming both), run it (:func:`run_cell_inprocess`), label the result with
    this node. Returns ``{"result": ..., "meta": ...}`` as JSON data."""
    s, case = from_json(BackendSpec, sent["spec"], strict=True), from_json(Case, sent["case"])
    cell, expected = Cell(s.name, case, sent["mode"]), sent.get("golden_sha256")
    meta: dict[str, Any] = {"precision": {}, "gpu": None}
    error = functools.partial(document.Result.for_case, s.name, case, cell.mode, "error")
    try:
        mine = golden.data_sha256(case) if expected is not None else None
    except (golden.GoldenError, FileChanged) as exc:  # a weights or module file changed since the driver hashed it too
        r = error(reason=f"golden data on node {node_id or '?'}: {exc}")
    else:
        if mine != expected:
            why = (
                f"golden data differs between the driver and this worker (case {case.name}): the driver's sha256 "
                f"{expected}, this worker's {mine}; the nodes hold different golden files or generation code"
            )
            r = error(reason=why, extras={"golden_sha256": mine, "driver_golden_sha256": expected})
        else:
            r, meta = run_cell_inprocess(s, cell, harness.TimingConfig(**sent["timing"]), _PLAIN)
            r = replace(r, extras={**r.extras, "golden_sha256": mine}) if mine is not None else r
    return {"result": to_json(replace(r, node=environment.node(node_id))), "meta": meta}


def worker_main(cell_path: Path, result_path: Path) -> int:
    """Worker entry point: run the cell :func:`payload` in ``cell_path`` describes, write the outcome to
    ``result_path``."""
    child.die_with_parent()
    out = run_payload(json.loads(cell_path.read_text(encoding="utf-8")))
    write_text_atomic(result_path, json.dumps(out, allow_nan=True))
    return 0


if __name__ == "__main__":  # the worker process: python -m compare.run.cell_worker CELL.json RESULT.json
    if len(sys.argv) != 3:
        print("usage: python -m compare.run.cell_worker CELL.json RESULT.json", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(worker_main(Path(sys.argv[1]), Path(sys.argv[2])))
