"""Results are data: one record per (backend, case, mode), plus the environment; stored as ``results.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compare.cases import Case

SCHEMA_VERSION = 1
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False, allow_nan=True) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    from compare.cases import InputError

    if not path.is_file():
        raise InputError(f"results file {path} does not exist")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"results file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or "results" not in doc or "environment" not in doc:
        raise InputError(f"results file {path} lacks 'environment' and 'results': not a fusion-compare results file")
    return doc
