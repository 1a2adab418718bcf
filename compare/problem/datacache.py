"""A disk cache for data that is a pure function of the case: generated golden data and the plain computation.

Both are deterministic and the same bits on every machine (``compare.problem.fixedbits``), and costly on a large case (a
``cpu-mlp`` golden and its plain computation take tens of seconds on a 2-core CPU), and every process of a
tensor-parallel group or a sweep needs them. An entry is a safetensors file (no pickle) under
``$FUSION_COMPARE_CACHE`` (default ``$XDG_CACHE_HOME/fusion-compare``, else ``~/.cache/fusion-compare``; ``off``
disables the cache), named by a sha256 of what it is (``kind``, the case) and of the source of every module that
computes it, so a changed formula misses the cache instead of reading a stale answer. Writes are atomic; an entry
that cannot be read (truncated, foreign) is a miss and is written again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from compare.formats.atomic import write_bytes_atomic, write_text_atomic

ENV = "FUSION_COMPARE_CACHE"
#: The modules whose source decides the cached values (a change to any of them is a new key).
SOURCES: tuple[str, ...] = (
    "problem/fixedbits.py",
    "problem/reference.py",
    "problem/golden.py",
    "problem/checkpoint.py",
    "run/cell.py",
    "problem/datacache.py",
)


def folder() -> Path | None:
    """The cache folder, or None when the cache is off."""
    where = os.environ.get(ENV, "")
    if where == "off":
        return None
    if where:
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fusion-compare"


def _source_digest() -> str:
    here = Path(__file__).resolve().parents[1]  # compare/
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()


def key(kind: str, what: dict[str, Any]) -> str:
    """The entry name of ``kind`` (e.g. ``golden``, ``plain``) for ``what`` (a JSON-able description of the case)."""
    text = json.dumps({"kind": kind, "what": what, "source": _source_digest()}, sort_keys=True)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def load(name: str) -> dict[str, np.ndarray] | None:
    """The tensors of entry ``name``, or None (cache off, no entry, or an entry that cannot be read)."""
    d = folder()
    if d is None:
        return None
    path = d / f"{name}.safetensors"
    if not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    try:
        return st_load(path.read_bytes())
    except (OSError, SafetensorError):  # truncated or foreign: a miss, written again by the caller
        return None


def save(name: str, tensors: dict[str, np.ndarray]) -> None:
    """Write entry ``name`` (atomically); a cache that cannot be written (read-only, full) is left as it is."""
    d = folder()
    if d is None:
        return
    from safetensors.numpy import save as st_save

    try:
        d.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(d / f"{name}.safetensors", st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()}))
    except OSError:  # the cache is an optimisation: the caller already holds the values
        return


def source_digest(paths: list[str]) -> str:
    """A sha256 of the source of the modules ``paths`` (relative to the project root, files or folders: every
    ``.py`` below a folder, in sorted order), for a key whose value depends on more than :data:`SOURCES`."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in paths:
        p = root / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def load_json(name: str) -> Any:
    """The JSON value of entry ``name``, or None (cache off, no entry, or one that cannot be read or parsed)."""
    d = folder()
    if d is None:
        return None
    path = d / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # absent, truncated or foreign: a miss
        return None


def save_json(name: str, value: Any) -> None:
    """Write entry ``name`` as JSON (atomically); a cache that cannot be written is left as it is."""
    d = folder()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / f"{name}.json", json.dumps(value, sort_keys=True, allow_nan=True))
    except OSError:  # the cache is an optimisation: the caller already holds the value
        return
