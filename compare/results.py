"""Results are data: one record per (backend, case, mode), plus the environment; stored as ``results.json``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compare.atomic import write_text_atomic
from compare.cases import Case, InputError

#: The version of the results document's layout, stored as its ``schema_version``. 2: the statistical parity gate
#: (every check per tensor), the resolution table and the implausible flag. A file of another version is refused
#: on load with a clear error (rerun, or rebuild the report with the fusion-compare that wrote it).
SCHEMA_VERSION = 2
STATUSES: tuple[str, ...] = ("ok", "parity-fail", "error", "skipped")


@dataclass
class Result:
    """What happened to one backend on one case and mode. ``parity``/``timing`` are None where not measured."""

    backend: str
    model: str
    dtype: str
    shape: dict[str, int]
    case: str
    mode: str
    status: str
    reason: str = ""
    note: str = ""
    device: str = ""
    parity: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    threads: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; known: {', '.join(STATUSES)}")

    @staticmethod
    def for_case(backend: str, case: Case, mode: str, status: str, **kw: Any) -> Result:
        s = case.shape
        shape = {"batch": s.batch, "seq": s.seq, "dim": s.dim, "hidden": s.hidden}
        return Result(backend, case.model, case.dtype, shape, case.name, mode, status, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write a results document atomically (the previous file survives a failed write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=False, allow_nan=True) + "\n")


#: Fields every result row must have, with their type.
ROW_FIELDS: tuple[tuple[str, type], ...] = (
    ("backend", str),
    ("case", str),
    ("mode", str),
    ("status", str),
    ("dtype", str),
    ("model", str),
    ("shape", dict),
)
SHAPE_FIELDS: tuple[str, ...] = ("batch", "seq", "dim", "hidden")


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _row_problem(r: Any) -> str | None:
    """What is wrong with one result row, or None. Only what the report, the diff and the plots rely on."""
    if not isinstance(r, dict):
        return f"is a {type(r).__name__}, not an object"
    missing = [f for f, _ in ROW_FIELDS if f not in r]
    if missing:
        return f"lacks {', '.join(missing)}"
    wrong = [f"{f} (not a {t.__name__})" for f, t in ROW_FIELDS if not isinstance(r[f], t)]
    if wrong:
        return f"has a bad {', '.join(wrong)}"
    if r["status"] not in STATUSES:
        return f"has an unknown status {r['status']!r} (known: {', '.join(STATUSES)})"
    bad = [
        k
        for k in SHAPE_FIELDS
        if not isinstance(r["shape"].get(k), int) or isinstance(r["shape"].get(k), bool) or r["shape"][k] <= 0
    ]
    if bad:
        return f"has a shape without positive integer {', '.join(bad)}"
    t = r.get("timing")
    if t is not None:
        if not isinstance(t, dict):
            return "has a timing that is not an object"
        if "median_s" not in t:
            return "has a timing without median_s"
        if not _number(t["median_s"]) or t["median_s"] <= 0:
            return f"has a timing median_s that is not a finite positive number ({t['median_s']!r})"
        if "iqr_s" not in t:
            return "has a timing without iqr_s"
        if not _number(t["iqr_s"]) or t["iqr_s"] < 0:
            return f"has a timing iqr_s that is not a finite non-negative number ({t['iqr_s']!r})"
        samples = t.get("samples_s")
        if samples is not None and (not isinstance(samples, list) or not all(_number(x) and x > 0 for x in samples)):
            return "has timing samples_s that are not a list of finite positive numbers"
    p = r.get("parity")
    if p is not None and not (isinstance(p, dict) and isinstance(p.get("tensors"), list)):
        return "has a parity without a 'tensors' list"
    return None


def validate(doc: Any, source: str) -> dict[str, Any]:
    """Return ``doc`` if it is a well-formed results document; else raise :class:`InputError` naming ``source``,
    the row (index and backend) and the missing or bad field."""
    if not isinstance(doc, dict) or "results" not in doc or "environment" not in doc:
        raise InputError(f"results file {source} lacks 'environment' and 'results': not a fusion-compare results file")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        found = (
            "no schema_version (an older fusion-compare wrote it)" if version is None else f"schema_version {version!r}"
        )
        raise InputError(
            f"results file {source} has {found}; this fusion-compare reads schema_version {SCHEMA_VERSION}: "
            f"rerun `python -m compare run` to measure it again"
        )
    if not isinstance(doc["results"], list):
        raise InputError(f"results file {source}: 'results' is not a list")
    if not isinstance(doc["environment"], dict):
        raise InputError(f"results file {source}: 'environment' is not an object")
    for i, r in enumerate(doc["results"]):
        problem = _row_problem(r)
        if problem:
            who = f" ({r['backend']})" if isinstance(r, dict) and isinstance(r.get("backend"), str) else ""
            raise InputError(f"results file {source}: result #{i}{who} {problem}")
    return doc


def read_json(path: Path) -> dict[str, Any]:
    """Read and :func:`validate` a ``results.json`` (UTF-8); any problem is an :class:`InputError` naming the file."""
    if not path.is_file():
        raise InputError(f"results file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"results file {path} cannot be read: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"results file {path} is not valid JSON: {exc}") from exc
    return validate(doc, str(path))
