"""The A/B document (``ab.json``, ``python -m compare ab``): the two sides (interpreter, checkout, environment
variables, and what each worker said of itself) and, per backend, case and mode, each side's result and each of its
worker processes' timing (``--workers K`` a side, all in one interleaved group): the process is the unit of
replication (``compare.timing.significance.compare_processes``). The report (``compare.report.ab``) is a pure
function of it.

Schema 2 added the per-process timings (:class:`Process`, ``Pair.a_processes``/``b_processes``) and ``workers``;
a schema-1 document (one worker a side) still reads, its pairs without them: its verdict is the paired test of its
one pair of processes beyond the between-process floor."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from compare.formats.atomic import write_text_atomic
from compare.formats.codec import LATER, FieldError, from_json, to_json
from compare.problem.cases import InputError
from compare.results.document import Result
from compare.results.load import Load
from compare.timing.timer import Timing, TimingConfig

#: The layout of ``ab.json`` written; :data:`READABLE` are read, a file of another is refused on load (exit 2).
SCHEMA_VERSION = 2
READABLE = (1, 2)
#: What every ``ab.json`` holds (their defaults are for building one, not for reading one that lacks them).
REQUIRED = ("created", "command", "timing", "a", "b", "pairs")


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
class Process:
    """One worker process of a side on one pair: its process id, its row's status and its timing (None: not timed,
    the row says why)."""

    pid: int
    status: str
    timing: Timing | None = None


@dataclass(frozen=True)
class Pair:
    """One backend on one case and mode, on both sides; ``framework``: the package whose version tells the sides
    apart (the backend's registry line). ``a`` and ``b``: each side's row (its first worker's; an error row where
    any worker of the side erred); ``a_processes``/``b_processes``: every worker of the side, in start order (empty
    in a schema-1 document)."""

    framework: str
    a: Result
    b: Result
    a_processes: tuple[Process, ...] = field(default=(), metadata=LATER)
    b_processes: tuple[Process, ...] = field(default=(), metadata=LATER)


@dataclass(frozen=True)
class ABResults:
    """``ab.json``: when and how it was made, the timer's settings, the two sides, every pair in run order, and the
    machine's load over the whole run, the workers' own CPU time left out (``compare.results.load``; None: not
    recorded)."""

    schema_version: int = SCHEMA_VERSION
    created: str = ""
    command: str = ""
    timing: TimingConfig = field(default_factory=TimingConfig)
    a: Side = field(default_factory=lambda: Side("A", "", ""))
    b: Side = field(default_factory=lambda: Side("B", "", ""))
    pairs: tuple[Pair, ...] = ()
    load: Load | None = None
    #: worker processes a side (``--workers``); 1 in a schema-1 document
    workers: int = field(default=1, metadata=LATER)


def write_json(path: Path, doc: ABResults) -> None:
    """Write ``ab.json`` atomically."""
    write_text_atomic(path, json.dumps(to_json(doc), indent=1, allow_nan=True) + "\n")


def read_json(path: Path) -> ABResults:
    """Read and type an ``ab.json``; any problem is an :class:`InputError` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"A/B file {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema_version") not in READABLE:
        got = data.get("schema_version") if isinstance(data, dict) else None
        raise InputError(
            f"A/B file {path} is not an ab.json this version reads (schema_version {got!r}; it reads "
            f"{', '.join(map(str, READABLE))})"
        )
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise InputError(
            f"A/B file {path} lacks {', '.join(missing)}: not an ab.json that `python -m compare ab` wrote"
        )
    try:
        return from_json(ABResults, data)
    except FieldError as exc:
        raise InputError(f"A/B file {path}: {exc}") from None
