"""A sweep's file, ``results.jsonl``: append-only, one header line per start and one line per finished cell, written
with a single ``write`` and ``fsync``, under an exclusive lock; readable at any time as a results document. See
``compare.sweep.run`` for the protocol."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from compare.formats.jsonl import read_records
from compare.problem.cases import InputError
from compare.results.document import Results, load
from compare.sweep.grid import GRID_KEYS, cells_from_config, result_key

JSONL = "results.jsonl"


# --- the file -------------------------------------------------------------------------------------------------


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a sweep file (``compare.formats.jsonl.read_records``: a torn last line is ignored),
    each a header or a cell line, the first a header."""
    if not path.is_file():
        raise InputError(f"sweep file {path} does not exist")
    try:
        records = read_records(path)
    except ValueError as exc:
        raise InputError(f"sweep file {path} {exc}") from exc
    out = []
    for i, rec in enumerate(records, 1):
        if not isinstance(rec, dict) or rec.get("type") not in ("header", "cell"):
            raise InputError(f"sweep file {path} record {i} is neither a header nor a cell line")
        out.append(rec)
    if not out or out[0]["type"] != "header":
        raise InputError(f"sweep file {path} does not start with a header line: not a fusion-compare sweep")
    return out


def _jsonl_path(path: Path) -> Path:
    return path / JSONL if path.is_dir() else path


def load_sweep(path: Path | str) -> Results:
    """The typed results document of a sweep file or its folder (:func:`read_sweep`, validated like a
    ``results.json``: a bad cell is an :class:`InputError` naming the file, the row and the field)."""
    return load(read_sweep(path), str(path))


def read_sweep(path: Path | str) -> dict[str, Any]:
    """A results document (``run_id, schema_version, created, config, environment, results``) from a sweep file or
    its folder, as parsed JSON (not yet validated); ``run_id`` is the newest session's.

    Readable at any time, also while the sweep runs. ``created``, ``config`` and ``environment`` are the first
    header's; the environment's ``precision`` and ``threads`` merge what every finished cell reported, and its
    ``gpu`` is the first one a cell saw if the header had none (backends load torch after the header is written,
    and the GPU name is read only once torch is loaded). Results are in grid order, one per cell key (the last
    line wins if a key repeats; a line marked ``retrying``, a lost worker's attempt, is left out: the cell's next
    attempt follows it). ``config["progress"]`` says how many grid cells are done and how many sessions
    (starts) wrote the file; ``ceilings`` are the first session's that measured them (each session's rows were held
    to its own, as they were stored).
    """
    lines = _parse_lines(_jsonl_path(Path(path)))
    headers = [x for x in lines if x["type"] == "header"]
    first = headers[0]
    by_key: dict[str, dict[str, Any]] = {}
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    gpus: list[str] = []
    for rec in lines:
        if rec["type"] == "cell" and not rec.get("retrying"):  # a lost attempt's row: its next attempt follows
            r = rec["result"]
            by_key[result_key(r)] = r
            precision.update(rec.get("precision") or {})
            gpus += [rec["gpu"]] if rec.get("gpu") else []
            threads.update(r.get("threads") or {})
    config = dict(first["config"])
    grid = [c.key for c in cells_from_config(config)]
    in_grid = set(grid)
    ordered = [by_key[k] for k in grid if k in by_key] + [r for k, r in by_key.items() if k not in in_grid]
    config["progress"] = {"cells": len(grid), "done": sum(k in by_key for k in grid), "sessions": len(headers)}
    env = dict(first["environment"])
    env["precision"] = {**env.get("precision", {}), **precision}
    env["threads"] = {**env.get("threads", {}), **threads}
    if not env.get("gpu") and gpus:
        env["gpu"] = gpus[0]
    doc = {
        "run_id": str(headers[-1].get("run_id") or ""),  # the newest session's (each start's header has its own)
        "schema_version": first.get("schema_version"),
        "created": first["created"],
        "config": config,
        "environment": env,
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
    lines = _parse_lines(path)
    last = {result_key(x["result"]): x["result"] for x in lines if x["type"] == "cell" and not x.get("retrying")}
    return {k for k, r in last.items() if not (retry_errors and r.get("status") == "error")}


def check_same_grid(path: Path, config: dict[str, Any], env: dict[str, Any]) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    first = _parse_lines(path)[0]
    old = first["config"]
    differ = [k for k in GRID_KEYS if old.get(k) != config.get(k)]
    if differ:
        raise InputError(
            f"{path} holds a different sweep (it differs in: {', '.join(differ)}); "
            f"use another --out, or delete the folder to start over"
        )
    old_env = first["environment"]
    changed = [k for k in ("cpu", "gpu", "versions") if old_env.get(k) != env.get(k)]
    if changed:
        print(
            f"sweep: warning: resuming on a different environment (differs in: {', '.join(changed)}); the "
            f"report keeps the first session's",
            file=sys.stderr,
        )
