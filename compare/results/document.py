"""Results are data: one :class:`Result` per (backend, case, mode), plus the environment and the rest of a run, in a
:class:`Results` document stored as ``results.json`` (``compare.formats.codec`` writes and reads it;
:func:`read_json` validates and types a file)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare.cost.records import Ceilings, Cost
from compare.formats.atomic import write_text_atomic
from compare.formats.codec import LATER, FieldError, Setting, from_json, to_json
from compare.gate.parity_record import ParityRecord
from compare.gate.resolution import ResolutionRow
from compare.kernels.summary import Kernels
from compare.problem.cases import Case, InputError, ModuleFile, Shape, Weights
from compare.results.environment import Environment, Node
from compare.results.load import Load
from compare.results.memory import Memory
from compare.results.tp import TPInfo
from compare.timing.budget_record import BudgetRecord
from compare.timing.llc import ColdSetup
from compare.timing.timer import Timing, TimingConfig

#: The version of the results document's layout, stored as its ``schema_version``. 2: the statistical parity gate
#: (every check per tensor), the resolution table and the implausible flag. A file of another version is refused
#: on load with a clear error (rerun, or rebuild the report with the fusion-compare that wrote it). Fields added
#: since without changing what the others mean (a result's ``world_size`` and ``tp``, a parity's ``processes``)
#: are optional: a reader of version 2 that does not know them ignores them.
#: 3: the graded verdict (a tensor's and a result's ``tier``: pass, deviates, fail; the fail lines; the cause)
#: and the ``deviates`` status; bounds from the machine-independent plain computation.
#: 4: the ``implausible`` status, the verdict on fresh inputs (``parity.fresh``), interleaved timing (a timing's
#: ``rounds`` and ``group``).
#: A result's ``memory`` (``compare.results.memory``, issue 19) is optional and leaves the other fields as they were.
SCHEMA_VERSION = 4
#: ``ok``: every tensor passes; ``deviates``: a real, measured difference that an honest implementation can have (no
#: tensor fails); ``parity-fail``: a tensor fails (a different function), on the golden or on fresh inputs;
#: ``implausible``: it passes or deviates, but its median call beats the machine's measured matmul ceiling (it
#: cannot have done its FLOPs); ``error``; ``skipped``.
STATUSES: tuple[str, ...] = ("ok", "deviates", "parity-fail", "implausible", "error", "skipped")


@dataclass(frozen=True)
class Result:
    """What happened to one backend on one case and mode. ``parity``/``timing`` are None where not measured;
    ``kernels`` where not profiled; ``cost`` where the backend is not in the cost model.

    ``threads`` are the thread settings the backend reported (free-form, merged into the environment); ``extras``
    what else it or the harness recorded (free-form: ``traceback`` and ``profile_error`` from the harness, a
    crashed sweep worker's ``exit_code``, ``signal`` and ``stderr_tail``, a backend's own notes). ``implausible``
    says why the timing cannot be right ("" when it can). A tensor-parallel result has ``world_size`` > 1 and its
    ``tp`` details."""

    backend: str
    model: str
    dtype: str
    shape: Shape
    case: str
    mode: str
    status: str
    reason: str = ""
    note: str = ""
    device: str = ""
    parity: ParityRecord | None = None
    timing: Timing | None = None
    #: the cold-cache timing (``compare.timing.timer.measure_cold``), None where not measured
    cold: Timing | None = field(default=None, metadata=LATER)
    threads: dict[str, Setting] = field(default_factory=dict)
    kernels: Kernels | None = None
    cost: Cost | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    implausible: str = field(default="", metadata=LATER)
    world_size: int = field(default=1, metadata=LATER)
    tp: TPInfo | None = field(default=None, metadata=LATER)
    #: The machine that measured it (``compare.results.environment.Node``): set on a sweep's rows, None elsewhere.
    node: Node | None = field(default=None, metadata=LATER)
    #: what the step held in memory (``compare.results.memory``): None where memory was not asked for
    memory: Memory | None = field(default=None, metadata=LATER)
    #: the checkpoint the case's parameters were read from (path, sha256, prefix; ``compare.problem.checkpoint``):
    #: None where they were drawn from the seed (and in older documents)
    weights: Weights | None = field(default=None, metadata=LATER)
    #: the user's own MLP file the case computes (``--module``: path, sha256, parameters, output width): None for a
    #: built-in model (and in older documents)
    module: ModuleFile | None = field(default=None, metadata=LATER)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; known: {', '.join(STATUSES)}")

    @staticmethod
    def for_case(backend: str, case: Case, mode: str, status: str, **kw: Any) -> Result:
        return Result(
            backend,
            case.model,
            case.dtype,
            case.shape,
            case.name,
            mode,
            status,
            weights=case.weights,
            module=case.module,
            **kw,
        )

    @property
    def label(self) -> str:
        """The backend as tables show it: its name, with ``x<world size>`` for a tensor-parallel run."""
        return self.backend if self.world_size == 1 else f"{self.backend} x{self.world_size}"


@dataclass(frozen=True)
class Progress:
    """A sweep's progress: grid cells, those done, and the sessions (starts) that wrote its file."""

    cells: int
    done: int
    sessions: int


@dataclass(frozen=True)
class Config:
    """What a run was asked to do: the ``command`` line, the ``preset`` (None: none), the backends, dtypes and
    modes, the world sizes of a tensor-parallel run (empty: 1), the shared timer's settings; for a sweep also its
    ``grid`` (``compare.run.grid.grid_config``'s object:
    model, dim, hidden, seq, tokens, dist, seed) and its ``progress``."""

    command: str = ""
    preset: str | None = None
    grid: dict[str, Any] | None = field(default=None, metadata=LATER)
    backends: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    world_sizes: tuple[int, ...] = field(default=(), metadata=LATER)
    timing: TimingConfig | None = None
    progress: Progress | None = field(default=None, metadata=LATER)
    #: the device memory the report fits the measured memory against (``--device-memory``, bytes; 0: none given)
    device_memory: int = field(default=0, metadata=LATER)
    #: the cells the run planned: every case, mode, backend and world size (0: not recorded, an older document)
    planned: int = field(default=0, metadata=LATER)


@dataclass(frozen=True)
class Results:
    """A results document (``results.json``): when it was created, the run's config and environment, one
    :class:`Result` per (backend, case, mode), the gate's resolution per case and tensor, this machine's measured
    ceilings (None: not measured), and what a run may add: ``interrupted`` (Ctrl-C: only the finished cells),
    ``shape_sweep`` (the compile-cost rows, schema in ``compare.timing.compile_sweep``), ``gpu_build`` (the GPU
    build table, ``gpu_build.json``'s object, its layout in ``compare.results.gpu_build``) and ``plots`` (PNG paths
    relative to the report)."""

    schema_version: int = SCHEMA_VERSION
    created: str = ""
    config: Config = field(default_factory=Config)
    environment: Environment = field(default_factory=Environment)
    results: tuple[Result, ...] = ()
    resolution: tuple[ResolutionRow, ...] = ()
    ceilings: Ceilings | None = field(default=None, metadata=LATER)
    interrupted: bool = field(default=False, metadata=LATER)
    shape_sweep: tuple[dict[str, Any], ...] = field(default=(), metadata=LATER)
    gpu_build: dict[str, Any] | None = field(default=None, metadata=LATER)
    plots: tuple[str, ...] = field(default=(), metadata=LATER)
    #: the time budget the run kept and what it cut (None: no budget)
    budget: BudgetRecord | None = field(default=None, metadata=LATER)
    #: how cold timings were made: the last-level cache sized, the flush (None: warm only)
    cold: ColdSetup | None = field(default=None, metadata=LATER)
    #: device telemetry over the timed windows: the device NVML watched, or why none was ("": not asked)
    telemetry: str = field(default="", metadata=LATER)
    #: the machine's load over the run's measurements (``compare.results.load``; None: not recorded, an older run)
    load: Load | None = field(default=None, metadata=LATER)
    #: the run's id, also in its store's lines: which run wrote this document ("": an older run, or none recorded)
    run_id: str = field(default="", metadata=LATER)
    #: what cut an ``interrupted`` run short: the signal's name; "": it ended without saying (killed, or its disk
    #: full: a store without its end line)
    stopped_by: str = field(default="", metadata=LATER)

    def summary(self) -> str:
        """Counts by status, e.g. ``3 ok, 1 skipped``."""
        counts = Counter(r.status for r in self.results)
        return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

    def cut_short(self) -> str:
        """How an ``interrupted`` run ended and how many of its planned cells it holds, e.g. ``interrupted by SIGINT:
        3 of 12 planned cells``; "" for a run that finished."""
        if not self.interrupted:
            return ""
        how = f"interrupted by {self.stopped_by}" if self.stopped_by else "cut short (killed, or its disk full)"
        n = len(self.results)
        of = f"{n} of {self.config.planned} planned cells" if self.config.planned else f"{n} cell{'s' * (n != 1)}"
        return f"{how}: {of}"


def write_json(path: Path, doc: Results) -> None:
    """Write a results document atomically (the previous file survives a failed write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(to_json(doc), indent=1, sort_keys=False, allow_nan=True) + "\n")


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


def load(doc: Any, source: str) -> Results:
    """The typed document of parsed JSON ``doc``: :func:`validate` first, then the codec (``compare.formats.codec``);
    any problem is an :class:`InputError` naming ``source`` and the field's path (``results[3].timing.n``)."""
    try:
        return from_json(Results, validate(doc, source))
    except FieldError as exc:
        raise InputError(f"results file {source}: {exc}") from None


def read_json(path: Path) -> Results:
    """Read, :func:`validate` and type a ``results.json`` (UTF-8); any problem is an :class:`InputError` naming the
    file."""
    if not path.is_file():
        raise InputError(f"results file {path} does not exist")
    try:
        text_ = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"results file {path} cannot be read: {exc}") from exc
    try:
        doc = json.loads(text_)
    except json.JSONDecodeError as exc:
        raise InputError(f"results file {path} is not valid JSON: {exc}") from exc
    return load(doc, str(path))
