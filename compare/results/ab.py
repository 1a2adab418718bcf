"""The A/B document (``ab.json``, ``python -m compare ab``): the two sides (interpreter, checkout, environment
variables, and what each worker said of itself) and, per backend, case and mode, each side's result; the timings of a
pair share one interleaved group, so ``compare.timing.significance.compare_timing`` pairs them by round. The report
(``compare.report.ab``) is a pure function of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from compare.formats.atomic import write_text_atomic
from compare.formats.codec import FieldError, from_json, to_json
from compare.problem.cases import InputError
from compare.results.document import Result
from compare.results.load import Load
from compare.timing.timer import TimingConfig

#: The layout of ``ab.json``; a file of another is refused on load.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Side:
    """One side as asked for (``name`` A or B; its interpreter, checkout and environment variables over the
    coordinator's) and as its worker said it is (its handshake, ``compare.run.ab_worker.handshake``: the checkout it
    imported ``compare`` from, the commit, ``+modified`` when tracked files differ; Python's and the packages'
    versions). ``problem``: why no worker of this side answered ("" when one did)."""

    name: str
    python: str
    path: str
    env: dict[str, str] = field(default_factory=dict)
    commit: str = ""
    python_version: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)
    problem: str = ""


@dataclass(frozen=True)
class Pair:
    """One backend on one case and mode, on both sides; ``framework``: the package whose version tells the sides
    apart (the backend's registry line)."""

    framework: str
    a: Result
    b: Result


@dataclass(frozen=True)
class ABResults:
    """``ab.json``: when and how it was made, the timer's settings, the two sides, every pair in run order, and the
    machine's load over the whole run, both workers' own CPU time left out (``compare.results.load``; None: not
    recorded)."""

    schema_version: int = SCHEMA_VERSION
    created: str = ""
    command: str = ""
    timing: TimingConfig = field(default_factory=TimingConfig)
    a: Side = field(default_factory=lambda: Side("A", "", ""))
    b: Side = field(default_factory=lambda: Side("B", "", ""))
    pairs: tuple[Pair, ...] = ()
    load: Load | None = None


def write_json(path: Path, doc: ABResults) -> None:
    """Write ``ab.json`` atomically."""
    write_text_atomic(path, json.dumps(to_json(doc), indent=1, allow_nan=True) + "\n")


def read_json(path: Path) -> ABResults:
    """Read and type an ``ab.json``; any problem is an :class:`InputError` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"A/B file {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"A/B file {path} is not an ab.json of schema_version {SCHEMA_VERSION}")
    try:
        return from_json(ABResults, data)
    except FieldError as exc:
        raise InputError(f"A/B file {path}: {exc}") from None
