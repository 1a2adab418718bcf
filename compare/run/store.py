"""A run's store of finished cells, ``<out>/cells.jsonl``: every finished cell on disk as it finishes, so a run
killed at any moment (SIGKILL, a power cut, a full disk) loses at most the cells in flight.

One JSON object per line (``compare.formats.jsonl``: one ``write`` and ``fsync`` per line), in this order:

- ``{"type": "header", "kind": "run", "run_id", "schema_version", "created", "config", "environment"}``: once, when
  the run starts (the file is emptied first: it holds one run, whose ``run_id`` (:func:`new_run_id`) its cell lines
  and its ``results.json`` carry too);
- ``{"type": "ceilings", "ceilings"}``: this machine's matmul and copy ceilings, when measured (before any cell);
- ``{"type": "resolution", "rows"}``: the gate's resolution rows of a case, before its cells;
- ``{"type": "cell", "run_id", "result", "precision", "threads"}``: one finished cell (a result row as
  ``results.json`` holds it, already held to the ceilings measured first), appended the moment its verdict is known;
- ``{"type": "shape_sweep", "rows"}``: the compile-cost rows, when that sweep ends;
- ``{"type": "load", "load"}``: the machine's load over the measurements (``compare.results.load``), when they end.

:func:`read_store` turns it back into a results document (``interrupted`` unless the run's last line, ``{"type":
"end"}``, is there), the document ``python -m compare report DIR`` rebuilds ``results.json`` and ``REPORT.md`` from.
A ``results.json`` is only ever replaced by a document that holds at least the cells the store holds
(:func:`never_fewer`). A folder's ``results.json`` of another ``run_id`` than its store's is an older run's (the store
is emptied when a run starts): ``report DIR`` rebuilds from the store then (:func:`is_older_run`).
"""

from __future__ import annotations

import datetime
import secrets
from pathlib import Path
from typing import Any

from compare.cost.records import Ceilings
from compare.formats.codec import from_json, to_json
from compare.formats.jsonl import Appender, read_records
from compare.gate.resolution import ResolutionRow
from compare.problem.cases import InputError
from compare.results import environment
from compare.results.document import Config, Result, Results, load, read_json
from compare.results.load import Load

#: The store's file name in a run's output folder.
CELLS = "cells.jsonl"
KINDS = ("header", "ceilings", "resolution", "cell", "shape_sweep", "load", "end")


def new_run_id() -> str:
    """A run's id: its UTC start time and 6 random hex digits (``20260101T120000Z-3fa9c2``), unique per start."""
    return f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class RunStore:
    """The store of one run (see the module docstring); every method appends one line and returns once it is on
    disk. A failed write raises ``OSError`` (the lines before it stay whole)."""

    def __init__(self, out: Path, config: dict[str, Any], run_id: str = "") -> None:
        self.path = out / CELLS
        self.cells = 0
        self.run_id = run_id or new_run_id()
        self._w = Appender(self.path, fresh=True)
        self._w.append(
            {
                "type": "header",
                "kind": "run",
                "run_id": self.run_id,
                "schema_version": Results().schema_version,
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "config": config,
                "environment": environment.collect({}, {}),
            }
        )

    def ceilings(self, ceil: Ceilings) -> None:
        self._w.append({"type": "ceilings", "ceilings": to_json(ceil)})

    def resolution(self, rows: list[ResolutionRow]) -> None:
        self._w.append({"type": "resolution", "rows": [to_json(r) for r in rows]})

    def cell(self, result: Result, precision: dict[str, Any]) -> None:
        self._w.append({"type": "cell", "run_id": self.run_id, "result": to_json(result), "precision": precision})
        self.cells += 1

    def shape_sweep(self, rows: list[dict[str, Any]]) -> None:
        self._w.append({"type": "shape_sweep", "rows": rows})

    def load(self, record: Load) -> None:
        self._w.append({"type": "load", "load": to_json(record)})

    def end(self) -> None:
        self._w.append({"type": "end"})

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_store(path: Path) -> bool:
    """True when ``path`` is a run's store (its first line is a run header)."""
    try:
        first = read_records(path)[:1]
    except (OSError, ValueError):
        return False
    return bool(first) and isinstance(first[0], dict) and first[0].get("kind") == "run"


def read_store(path: Path) -> Results:
    """The results document of a run's store (see the module docstring); a file that is not one, or a bad line, is
    an :class:`InputError` naming the file and the line."""
    if not path.is_file():
        raise InputError(f"store {path} does not exist")
    try:
        records = read_records(path)
    except ValueError as exc:
        raise InputError(f"store {path}: {exc}") from exc
    if not records or not isinstance(records[0], dict) or records[0].get("kind") != "run":
        raise InputError(f"{path} does not start with a run's header line: not a fusion-compare run store")
    bad = [i for i, r in enumerate(records, 1) if not isinstance(r, dict) or r.get("type") not in KINDS]
    if bad:
        raise InputError(f"store {path}: line {bad[0]} is not one of: {', '.join(KINDS)}")
    head = records[0]
    rows = [r["result"] for r in records if r["type"] == "cell"]
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    for r in records:
        if r["type"] == "cell":
            precision.update(r.get("precision") or {})
            threads.update(r["result"].get("threads") or {})
    env = dict(head["environment"])
    env["precision"] = {**env.get("precision", {}), **precision}
    env["threads"] = {**env.get("threads", {}), **threads}
    doc = load(
        {"schema_version": head.get("schema_version"), "created": head["created"], "environment": env, "results": rows},
        str(path),
    )
    ceilings = next((from_json(Ceilings, r["ceilings"]) for r in records if r["type"] == "ceilings"), None)
    resolution = tuple(from_json(ResolutionRow, x) for r in records if r["type"] == "resolution" for x in r["rows"])
    sweep = next((tuple(r["rows"]) for r in records if r["type"] == "shape_sweep"), ())
    machine = next((from_json(Load, r["load"]) for r in records if r["type"] == "load"), None)
    return Results(
        schema_version=doc.schema_version,
        created=doc.created,
        config=from_json(Config, head["config"]),
        environment=doc.environment,
        results=doc.results,
        resolution=resolution,
        ceilings=ceilings,
        interrupted=records[-1]["type"] != "end",
        shape_sweep=sweep,
        load=machine,
        run_id=str(head.get("run_id") or ""),
    )


def cell_key(r: Result) -> tuple[str, str, str, int]:
    """What makes a result row one cell of a results document: backend, case, mode and world size."""
    return r.backend, r.case, r.mode, r.world_size


def never_fewer(existing: Path, doc: Results) -> Results | None:
    """The results document that may replace ``existing`` (a ``results.json``): ``doc`` unless ``existing`` is a
    readable results document holding cells ``doc`` lacks (an earlier run's), and then None: keep it."""
    if not existing.is_file():
        return doc
    try:
        old = read_json(existing)
    except InputError:  # not a results document we can read: nothing there to keep
        return doc
    return None if {cell_key(r) for r in old.results} - {cell_key(r) for r in doc.results} else doc


def is_older_run(existing: Results, stored: Results) -> bool:
    """Whether ``existing`` (a folder's ``results.json``) was written by an older run than ``stored`` (its store's
    document): their run ids differ (the store is emptied when a run starts, so the store's run is the newest that
    started there). Two documents without an id (written before runs had one) cannot be told apart by id: False."""
    return existing.run_id != stored.run_id
