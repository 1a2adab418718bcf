"""A history of runs (``run``/``profile``/``sweep --history DIR``): one JSON file per run, appended, never rewritten,
in a folder per machine; ``python -m compare history DIR`` (``compare.report.history``) reads them back.

An :class:`Entry` is the run's results document as written (``results.json``'s :class:`~compare.results.document.
Results`) with what identifies it: the :class:`Machine` it ran on (CPU model, instruction sets, logical cores and GPU,
from the document's environment; :attr:`Machine.key`, a 12-hex-digit hash of them, names the machine and its
folder), the :class:`Source` of the code (the project's git commit and whether tracked files differed from it, when
the package runs from a checkout; the package version), the package versions, the run id, its kind and the time it
was recorded. ``paired`` is for an A/B entry (``kind`` ``ab``: ``ab --history``, side B recorded with A as its
baseline): a verdict per cell of two builds timed interleaved in one window, which the history shows in place of its
own rule.

The layout: ``DIR/<machine key>/<recorded, UTC to the microsecond>-<8 random hex digits>.json``, written atomically
without replacing anything (``compare.formats.atomic.write_bytes_new``; a name taken is drawn again), so two runs,
also at the same moment, on one machine or on two sharing the folder, never collide and no entry is ever rewritten.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from compare.formats.atomic import write_bytes_new
from compare.formats.codec import LATER, FieldError, from_json, to_json
from compare.problem.cases import InputError
from compare.results import document
from compare.results.ab import ABResults
from compare.results.document import Results
from compare.results.environment import Environment, Node

#: The layout of an entry file, stored as its ``history_schema`` (what marks a JSON file as an entry).
HISTORY_SCHEMA = 1
#: What appended an entry: ``run`` (``run`` and ``profile``), ``sweep``, and ``ab`` (whose entries carry ``paired``
#: verdicts).
KINDS: tuple[str, ...] = ("run", "sweep", "ab")
#: This package's distribution name (``importlib.metadata``).
DISTRIBUTION = "fusion-compare"
#: Seconds a ``git`` call may take before the commit is recorded as unknown.
GIT_TIMEOUT_S = 10.0
#: Environment variables that would point ``git`` at another repository than the checkout it is run in.
GIT_REDIRECTS: tuple[str, ...] = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


def gpu_model(gpu: str | None) -> str | None:
    """The GPU as hardware: the environment's GPU name without its `` (CUDA x.y)`` suffix (the CUDA of the torch
    build is software, a version; a new one is not another machine)."""
    return None if gpu is None else re.sub(r"\s*\(CUDA [^)]*\)$", "", gpu)


@dataclass(frozen=True)
class Machine:
    """The hardware a timing depends on: CPU model, its instruction sets (``compare.results.environment.ISA_FLAGS``;
    None: unknown), logical cores and GPU (:func:`gpu_model`; None: none seen). :attr:`key` names it."""

    cpu: str
    cpu_isa: tuple[str, ...] | None
    cpu_count: int | None
    gpu: str | None
    #: written after the fields, checked on reading (``compare.formats.codec``)
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("key",)

    @property
    def key(self) -> str:
        """The first 12 hex digits of the SHA-256 of the four fields as sorted JSON: stable across runs, Python
        versions and machines (no ``hash()``, which is salted per process)."""
        fields = {"cpu": self.cpu, "cpu_isa": self.cpu_isa, "cpu_count": self.cpu_count, "gpu": self.gpu}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        """``Intel(R) Xeon(R) ... (avx2, fma, ...), 2 cores; no GPU``."""
        isa = "ISA unknown" if self.cpu_isa is None else ", ".join(self.cpu_isa) or "no listed ISA extension"
        cores = "? cores" if self.cpu_count is None else f"{self.cpu_count} cores"
        return f"{self.cpu or 'unknown CPU'} ({isa}), {cores}; {self.gpu or 'no GPU'}"

    def measured(self, node: Node | None) -> bool:
        """Whether a result row measured on ``node`` (a sweep row's; None: the run's own machine) ran on this
        machine's hardware: the same CPU model and instruction sets, and the same GPU where the node saw one (a node
        reports no core count, and no GPU from a process that never loaded torch, such as an isolated JAX cell's)."""
        if node is None:
            return True
        gpu = gpu_model(node.gpu)
        return (node.cpu, node.cpu_isa) == (self.cpu, self.cpu_isa) and (gpu is None or gpu == self.gpu)


def machine_of(env: Environment) -> Machine:
    """The :class:`Machine` of a results document's environment."""
    return Machine(env.cpu, env.cpu_isa, env.cpu_count, gpu_model(env.gpu))


@dataclass(frozen=True)
class Source:
    """The code that ran: ``commit``, the full hash of the project checkout's ``HEAD`` (None: the package did not run
    from a git checkout, or git could not say), ``dirty``, whether tracked files differed from it (None: unknown;
    untracked files are not looked at), and ``version``, the installed distribution's version (None: not installed,
    run from a checkout on ``PYTHONPATH``)."""

    commit: str | None
    dirty: bool | None
    version: str | None

    def short(self) -> str:
        """``1a2b3c4``, ``1a2b3c4+dirty``, ``v0.1.0`` without a commit, ``?`` with neither."""
        if self.commit:
            return self.commit[:7] + ("+dirty" if self.dirty else "")
        return f"v{self.version}" if self.version else "?"


def checkout() -> Path | None:
    """The project checkout this package runs from: the folder above ``compare/`` when it holds a ``.git`` (a folder,
    or a worktree's file); None for an installed package."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".git").exists() and (root / "compare").is_dir() else None


def _git(root: Path, *args: str) -> str | None:
    """``git -C root args`` (its output, stripped), or None when git is missing, fails or times out."""
    env = {k: v for k, v in os.environ.items() if k not in GIT_REDIRECTS}
    try:
        p = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def source(root: Path | None = None) -> Source:
    """This code's :class:`Source`: ``git rev-parse HEAD`` and ``git status --porcelain --untracked-files=no`` in
    ``root`` (default: :func:`checkout`; none: no commit), and the distribution's version."""
    root = checkout() if root is None else root
    commit = dirty = None
    if root is not None:
        head = _git(root, "rev-parse", "HEAD")
        if head and re.fullmatch(r"[0-9a-f]{40,64}", head):
            commit = head
            status = _git(root, "status", "--porcelain", "--untracked-files=no")
            dirty = None if status is None else bool(status)
    try:
        version: str | None = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    return Source(commit, dirty, version)


@dataclass(frozen=True)
class PairedVerdict:
    """An A/B entry's verdict on one cell (``kind`` ``ab``): this entry's build (B) against ``baseline`` (A: its
    commit or label), both timed interleaved in one window, so the paired rule of ``compare.timing.significance``
    decided it. ``verdict`` is the A/B report's word (``compare.report.ab``: ``slower``, ``faster``, ``same``,
    ``ambiguous`` where the machine's load explains the difference); only ``slower`` and ``faster`` flag a point.
    ``ratio`` B's median over A's, ``p`` the one-sided p-value of the ratio's direction (None: not tested)."""

    backend: str
    case: str
    mode: str
    world_size: int
    baseline: str
    verdict: str
    ratio: float
    p: float | None = None


@dataclass(frozen=True)
class Entry:
    """One run in the history (module docstring): the layout's version, what appended it (:data:`KINDS`), the run
    id (``""``: none), when it was recorded (ISO 8601, UTC, microseconds: the history's time order), the machine, the
    code, the package versions (the environment's), the results document as written, and, for an A/B entry, its
    paired verdicts."""

    history_schema: int
    kind: str
    run_id: str
    recorded: str
    machine: Machine
    source: Source
    versions: dict[str, str | None]
    results: Results
    paired: tuple[PairedVerdict, ...] = field(default=(), metadata=LATER)
    #: the environment variables the recorded build ran with beyond this machine's (an A/B entry's side B's)
    variables: dict[str, str] = field(default_factory=dict, metadata=LATER)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}; known: {', '.join(KINDS)}")

    def when(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.recorded)


def entry(doc: Results, kind: str, src: Source, recorded: datetime.datetime | None = None) -> Entry:
    """The :class:`Entry` of a written results document (``recorded``: now, UTC)."""
    now = recorded or datetime.datetime.now(datetime.UTC)
    env = doc.environment
    return Entry(
        HISTORY_SCHEMA,
        kind,
        doc.run_id,
        now.isoformat(timespec="microseconds"),
        machine_of(env),
        src,
        dict(env.versions),
        doc,
    )


def source_of(commit: str) -> Source:
    """The :class:`Source` of an A/B side as its worker said it (``compare.run.ab_worker.handshake``: the hash,
    ``+modified`` when tracked files differed; "" outside git). Its distribution version is not said."""
    head, modified, _ = commit.partition("+modified")
    return Source(head or None, bool(modified) if head else None, None)


def ab_entry(doc: ABResults, env: Environment, paired: tuple[PairedVerdict, ...]) -> Entry:
    """The :class:`Entry` of an A/B run (``ab --history``): side B is the build recorded (its results, commit and
    package versions, on the machine of ``env``, this one's environment), A its baseline, named in ``paired``."""
    results = Results(
        created=doc.created,
        environment=dataclasses.replace(env, versions=dict(doc.b.versions)),
        results=tuple(p.b for p in doc.pairs),
        load=doc.load,
    )
    return dataclasses.replace(entry(results, "ab", source_of(doc.b.commit)), paired=paired, variables=dict(doc.b.env))


def write(folder: Path, e: Entry) -> Path:
    """Add ``e`` to the history ``folder`` (its machine's subfolder, made here) under a new name; return its path.
    ``OSError`` when it cannot be written."""
    sub = folder / e.machine.key
    sub.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(to_json(e), indent=1, allow_nan=True) + "\n").encode("utf-8")
    stamp = f"{e.when().astimezone(datetime.UTC):%Y%m%dT%H%M%S%fZ}"
    while True:
        path = sub / f"{stamp}-{secrets.token_hex(4)}.json"
        try:
            write_bytes_new(path, data)
        except FileExistsError:  # 2^-32 at the same microsecond: draw another name
            continue
        return path


def append(folder: Path, doc: Results, kind: str, src: Source) -> Path:
    """Append the written results document ``doc`` to the history ``folder`` (:func:`entry`, :func:`write`)."""
    return write(folder, entry(doc, kind, src))


@dataclass(frozen=True)
class Read:
    """What :func:`read` found in a history folder: the entries with their files, in time order, and every JSON file
    that is not a readable entry, with why (a line naming the file)."""

    entries: tuple[tuple[Path, Entry], ...]
    skipped: tuple[tuple[Path, str], ...]


def load(data: Any, source_: str) -> Entry:
    """The :class:`Entry` of parsed JSON ``data``; an :class:`InputError` naming ``source_`` and what is wrong (not an
    entry, another layout, a results document this version cannot read, a bad field)."""
    if not isinstance(data, dict) or "history_schema" not in data:
        raise InputError(f"{source_} is not a fusion-compare history entry (no history_schema)")
    if data["history_schema"] != HISTORY_SCHEMA:
        raise InputError(
            f"{source_} has history_schema {data['history_schema']!r}; this fusion-compare reads {HISTORY_SCHEMA}"
        )
    document.validate(data.get("results"), f"{source_} (its results)")
    try:
        return from_json(Entry, data)
    except FieldError as exc:
        raise InputError(f"{source_}: {exc}") from None


def read(folder: Path) -> Read:
    """Every ``*.json`` in ``folder`` and its machine folders (one level down): the entries, in time order (recorded,
    then file name), and the files that are not readable entries, each with the reason (never fatal)."""
    entries: list[tuple[Path, Entry]] = []
    skipped: list[tuple[Path, str]] = []
    for path in sorted({*folder.glob("*.json"), *folder.glob("*/*.json")}):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            skipped.append((path, f"{path} cannot be read as JSON: {exc}"))
            continue
        try:
            e = load(data, str(path))
            e.when()  # a recorded time that is not ISO 8601 is a bad entry, not a crash when sorting
        except InputError as exc:
            skipped.append((path, str(exc)))
            continue
        except ValueError as exc:
            skipped.append((path, f"{path}: recorded is not an ISO 8601 time ({exc})"))
            continue
        entries.append((path, e))

    def order(pe: tuple[Path, Entry]) -> tuple[datetime.datetime, str]:
        when = pe[1].when()
        return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)), pe[0].name

    return Read(tuple(sorted(entries, key=order)), tuple(skipped))
