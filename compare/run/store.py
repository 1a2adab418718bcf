"""The stores of finished cells, JSON lines (``compare.formats.jsonl``: one ``write`` and ``fsync`` per line), so a
run or sweep killed at any moment (SIGKILL, a power cut, a full disk) loses at most the cells in flight. One writer
(:class:`Store`) and one reader (:func:`lines`: a torn last line dropped, the first line a header, every line of a
known type) for both:

A run's store, ``<out>/cells.jsonl`` (:func:`open_run`: emptied when the run starts, it holds one run; a cut-short
run's store whose cells no ``results.json`` holds is moved aside first, :func:`set_aside`), in order:

- ``{"type": "header", "kind": "run", "run_id", "schema_version", "created", "config", "environment"}``: once (the
  ``run_id`` (:func:`new_run_id`) its cell lines and its ``results.json`` carry too);
- ``{"type": "ceilings", "ceilings"}``: this machine's matmul and copy ceilings, when measured (before any cell);
- ``{"type": "resolution", "rows"}``: the gate's resolution rows of a case, before its cells;
- ``{"type": "cell", "run_id", "result", "precision"}``: one finished cell (a result row as ``results.json`` holds
  it, already held to the ceilings measured first), appended the moment its verdict is known;
- ``{"type": "shape_sweep", "rows"}``: the compile-cost rows, when that sweep ends;
- ``{"type": "load", "load"}``: the machine's load over the measurements (``compare.results.load``), when they end;
- ``{"type": "end"}``: the run ended (without it, :func:`read_store`'s document is ``interrupted``, cut short
  without a word: killed, or its disk full); ``{"type": "end", "stopped_by": "SIGINT"}``: a signal stopped it.

A sweep's store, ``<out>/results.jsonl`` (``compare.run.sweep``), append-only: a ``header`` line per start (its run
id, config, environment, engine and, when measured, ceilings) and a ``cell`` line per finished cell (that run id, its
``key``, the result and what its worker reported), read by :func:`read_sweep` in grid order; resumed by cell key
(:func:`done_keys`).

A ``results.json`` is only ever replaced by a document that holds at least the cells the store holds
(:func:`never_fewer`). A folder's ``results.json`` of another ``run_id`` than its run store's is an older run's:
``python -m compare report DIR`` rebuilds from the store then (:func:`is_older_run`).
"""

from __future__ import annotations

import datetime
import json
import secrets
import sys
from pathlib import Path
from typing import Any

from compare.cost.records import Ceilings
from compare.formats.codec import from_json, to_json
from compare.formats.jsonl import Appender, read_records
from compare.gate.resolution import ResolutionRow
from compare.problem.cases import InputError
from compare.results import environment
from compare.results.document import SCHEMA_VERSION, Config, Result, Results, load, read_json
from compare.results.load import Load
from compare.run.grid import GRID_KEYS, cells_from_config, result_key

#: The store's file name in a run's output folder, and in a sweep's.
CELLS, JSONL = "cells.jsonl", "results.jsonl"
KINDS = ("header", "ceilings", "resolution", "cell", "shape_sweep", "load", "end")


def new_run_id() -> str:
    """A run's id: its UTC start time and 6 random hex digits (``20260101T120000Z-3fa9c2``), unique per start."""
    return f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class Store:
    """An open store at ``path`` (emptied first when ``fresh``), its lines written for this start's ``run_id`` (given,
    or a new one); every method appends one line and returns once it is on disk. A failed write raises ``OSError``
    (the lines before it stay whole)."""

    def __init__(self, path: Path, fresh: bool = False, run_id: str = "") -> None:
        self.path, self.cells, self.run_id = path, 0, run_id or new_run_id()
        self._w = Appender(path, fresh=fresh)

    def header(self, config: dict[str, Any], env: dict[str, Any] | None = None, **extra: Any) -> None:
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        env = environment.collect({}, {}) if env is None else env
        head = {"run_id": self.run_id, "schema_version": SCHEMA_VERSION, "created": created, "config": config}
        self._w.append({"type": "header", **head, "environment": env, **extra})

    def cell(self, result: Result, precision: dict[str, Any] | None = None, **fields: Any) -> None:
        """A finished cell: the run's carries the precision settings seen so far, the sweep's its ``key`` and what
        its worker reported (``precision``, ``gpu``, ``wall_s``; ``retrying`` on a lost worker's attempt)."""
        more = {"precision": precision} if precision is not None else {}
        self._w.append({"type": "cell", "run_id": self.run_id, "result": to_json(result), **more, **fields})
        self.cells += 1

    def ceilings(self, ceil: Ceilings) -> None:
        self._w.append({"type": "ceilings", "ceilings": to_json(ceil)})

    def resolution(self, rows: list[ResolutionRow]) -> None:
        self._w.append({"type": "resolution", "rows": [to_json(r) for r in rows]})

    def shape_sweep(self, rows: list[dict[str, Any]]) -> None:
        self._w.append({"type": "shape_sweep", "rows": rows})

    def load(self, record: Load) -> None:
        self._w.append({"type": "load", "load": to_json(record)})

    def end(self, stopped_by: str = "") -> None:
        """The run's last line: it ended, finished or stopped by the signal ``stopped_by``."""
        self._w.append({"type": "end", **({"stopped_by": stopped_by} if stopped_by else {})})

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_aside(out: Path) -> Path | None:
    """Move a cut-short run's store out of the way of a new run in ``out``: ``cells.jsonl`` holding cells that no
    ``results.json`` of its run holds (a run killed, or stopped with its disk full, before its summary) becomes
    ``cells.<its run id>.jsonl`` (``python -m compare report`` that file renders it). Returns where it went; None
    where there was nothing to keep (no store, no cell, or a ``results.json`` of that run with every cell)."""
    path = out / CELLS
    try:
        stored = read_store(path) if is_store(path) else None
    except InputError:  # unreadable: not a store this tool can rebuild; the new run starts it afresh
        return None
    if stored is None or not stored.results:
        return None
    try:
        summary = read_json(out / "results.json") if (out / "results.json").is_file() else None
    except InputError:
        summary = None
    if summary is not None and not is_older_run(summary, stored) and not keys(stored) - keys(summary):
        return None
    target = out / f"cells.{stored.run_id or 'unnamed'}.jsonl"
    path.rename(target)
    return target


def open_run(out: Path, config: dict[str, Any], run_id: str = "") -> Store:
    """A run's store ``out/cells.jsonl``, emptied (a cut-short run's store set aside first, :func:`set_aside`), its
    header written."""
    store = Store(out / CELLS, fresh=True, run_id=run_id)
    try:
        store.header(config, kind="run")
    except BaseException:
        store.close()
        raise
    return store


def lines(path: Path, kinds: tuple[str, ...] = KINDS, what: str = "store") -> list[dict[str, Any]]:
    """Every complete line of a store (a torn last line is ignored), each a JSON object of one of ``kinds``, the
    first a header; anything else is an :class:`InputError` naming ``what`` (the store or sweep file), the file and
    the line."""
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist")
    try:
        records = read_records(path)
    except ValueError as exc:
        raise InputError(f"{what} {path}: {exc}") from exc
    bad = [i for i, r in enumerate(records, 1) if not isinstance(r, dict) or r.get("type") not in kinds]
    if bad:
        raise InputError(f"{what} {path}: line {bad[0]} is not one of: {', '.join(kinds)}")
    if not records or records[0]["type"] != "header":
        raise InputError(f"{what} {path} does not start with a header line: not a fusion-compare {what}")
    return records


def _environment(head: dict[str, Any], cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The first header's environment, its ``precision`` and ``threads`` merged with what every cell reported, and
    its ``gpu`` the first one a cell saw if it had none (backends load torch after the header is written)."""
    env, gpus = dict(head["environment"]), [c["gpu"] for c in cells if c.get("gpu")]
    env["precision"] = dict(env.get("precision", {}))
    env["threads"] = dict(env.get("threads", {}))
    for c in cells:
        env["precision"].update(c.get("precision") or {})
        env["threads"].update(c["result"].get("threads") or {})
    if not env.get("gpu") and gpus:
        env["gpu"] = gpus[0]
    return env


def is_store(path: Path) -> bool:
    """True when ``path`` is a run's store: its first line is a run header (a bad line after it is the store's to
    name, :func:`read_store`; it read as "not a store", and then "results.json does not exist")."""
    try:
        with path.open("rb") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("kind") == "run"


def read_store(path: Path) -> Results:
    """The results document of a run's store (see the module docstring); a file that is not one, or a bad line, is
    an :class:`InputError` naming the file and the line."""
    records = lines(path)
    head = records[0]
    if head.get("kind") != "run":
        raise InputError(f"{path} does not start with a run's header line: not a fusion-compare run store")
    cells = [r for r in records if r["type"] == "cell"]
    doc = load(
        {
            "schema_version": head.get("schema_version"),
            "created": head["created"],
            "environment": _environment(head, cells),
            "results": [r["result"] for r in cells],
        },
        str(path),
    )
    first = {r["type"]: r for r in reversed(records)}  # each type's first line
    return Results(
        schema_version=doc.schema_version,
        created=doc.created,
        config=from_json(Config, head["config"]),
        environment=doc.environment,
        results=doc.results,
        resolution=tuple(from_json(ResolutionRow, x) for r in records if r["type"] == "resolution" for x in r["rows"]),
        ceilings=from_json(Ceilings, first["ceilings"]["ceilings"]) if "ceilings" in first else None,
        interrupted=records[-1]["type"] != "end" or "stopped_by" in records[-1],
        shape_sweep=tuple(first["shape_sweep"]["rows"]) if "shape_sweep" in first else (),
        load=from_json(Load, first["load"]["load"]) if "load" in first else None,
        run_id=str(head.get("run_id") or ""),
        stopped_by=str(records[-1].get("stopped_by") or ""),
    )


def load_sweep(path: Path | str) -> Results:
    """The typed results document of a sweep file or its folder (:func:`read_sweep`, validated like a
    ``results.json``: a bad cell is an :class:`InputError` naming the file, the row and the field)."""
    return load(read_sweep(path), str(path))


def read_sweep(path: Path | str) -> dict[str, Any]:
    """A results document (``run_id, schema_version, created, config, environment, results``) from a sweep file or
    its folder, as parsed JSON (not yet validated); ``run_id`` is the newest session's.

    Readable at any time, also while the sweep runs. ``created``, ``config`` and ``environment`` are the first
    header's (:func:`_environment`). Results are in grid order, one per cell key (the last line wins if a key
    repeats; a line marked ``retrying``, a lost worker's attempt, is left out: the cell's next attempt follows it).
    ``config["progress"]`` says how many grid cells are done and how many sessions (starts) wrote the file;
    ``ceilings`` are the first session's that measured them (each session's rows were held to its own, as they were
    stored).
    """
    path = Path(path)
    records = lines(path / JSONL if path.is_dir() else path, ("header", "cell"), "sweep file")
    headers = [x for x in records if x["type"] == "header"]
    cells = [x for x in records if x["type"] == "cell" and not x.get("retrying")]
    by_key = {result_key(c["result"]): c["result"] for c in cells}
    config = dict(headers[0]["config"])
    grid = [c.key for c in cells_from_config(config)]
    in_grid = set(grid)
    ordered = [by_key[k] for k in grid if k in by_key] + [r for k, r in by_key.items() if k not in in_grid]
    config["progress"] = {"cells": len(grid), "done": sum(k in by_key for k in grid), "sessions": len(headers)}
    doc = {
        "run_id": str(headers[-1].get("run_id") or ""),  # the newest session's (each start's header has its own)
        "schema_version": headers[0].get("schema_version"),
        "created": headers[0]["created"],
        "config": config,
        "environment": _environment(headers[0], cells),
        "results": ordered,
    }
    ceilings = next((h["ceilings"] for h in headers if h.get("ceilings")), None)  # the first session's measured
    return {**doc, "ceilings": ceilings} if ceilings else doc


def done_keys(path: Path, retry_errors: bool = False) -> set[str]:
    """Keys of the cells already in a sweep file (empty if there is none); with ``retry_errors``, less those whose
    last stored result is an ``error`` (they run again). A row marked ``retrying`` (a lost worker's attempt, whose
    next attempt was to follow) does not make its cell done."""
    if not path.is_file() or path.stat().st_size == 0:
        return set()
    records = lines(path, ("header", "cell"), "sweep file")
    last = {result_key(x["result"]): x["result"] for x in records if x["type"] == "cell" and not x.get("retrying")}
    return {k for k, r in last.items() if not (retry_errors and r.get("status") == "error")}


def check_same_grid(path: Path, config: dict[str, Any], env: dict[str, Any]) -> None:
    """A sweep file's first header holds this ``config``'s grid (else InputError: one file holds one sweep); a
    different environment is a warning (the report keeps the first session's)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    first = lines(path, ("header", "cell"), "sweep file")[0]
    differ = [k for k in GRID_KEYS if first["config"].get(k) != config.get(k)]
    if differ:
        raise InputError(
            f"{path} holds a different sweep (it differs in: {', '.join(differ)}); "
            f"use another --out, or delete the folder to start over"
        )
    changed = [k for k in ("cpu", "gpu", "versions") if first["environment"].get(k) != env.get(k)]
    if changed:
        print(
            f"sweep: warning: resuming on a different environment (differs in: {', '.join(changed)}); the "
            f"report keeps the first session's",
            file=sys.stderr,
        )


def cell_key(r: Result) -> tuple[str, str, str, int]:
    """What makes a result row one cell of a results document: backend, case, mode and world size."""
    return r.backend, r.case, r.mode, r.world_size


def keys(doc: Results) -> set[tuple[str, str, str, int]]:
    """The cells of ``doc`` (:func:`cell_key`)."""
    return {cell_key(r) for r in doc.results}


def never_fewer(existing: Path, doc: Results) -> Results | None:
    """The results document that may replace ``existing`` (a ``results.json``): ``doc`` unless ``existing`` is a
    readable results document holding cells ``doc`` lacks (an earlier run's), and then None: keep it."""
    if not existing.is_file():
        return doc
    try:
        old = read_json(existing)
    except InputError:  # not a results document we can read: nothing there to keep
        return doc
    return None if keys(old) - keys(doc) else doc


def is_older_run(existing: Results, stored: Results) -> bool:
    """Whether ``existing`` (a folder's ``results.json``) was written by an older run than ``stored`` (its store's
    document): their run ids differ (the store is emptied when a run starts, so the store's run is the newest that
    started there). Two documents without an id (written before runs had one) cannot be told apart by id: False."""
    return existing.run_id != stored.run_id
