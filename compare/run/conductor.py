"""The one conductor of every measurement (``run``, ``profile``, ``sweep``): :func:`conduct` drives cells
(``compare.run.grid.Cell``) through executors, in one stage order.

First this machine's matmul FLOP/s and copy bandwidth per dtype (:func:`measure_ceilings`, under the budget's
``ceilings`` share), before any backend runs, told to ``begin`` (a run stores them as a line, a sweep in its header);
then each executor runs its cells and reports each finished one (:class:`Finished`), which is held to the ceilings
(:func:`hold`: ``implausible`` when its fastest sample beats the matmul ceiling), stored (``compare.run.store``) the
moment it is known and told to the progress display. A stop (Ctrl-C, SIGTERM: ``compare.run.stop``) ends it between
cells, keeping what is done (``Conducted.interrupted``). An executor asks ``may_start`` before a cell it may leave
for a rerun: no once the budget is spent (the cut said).

The executors (:class:`Executor`): the run's in-process groups (``compare.run.harness.Groups``: the cells of one case
and mode timed together, interleaved) and tensor-parallel worker groups (``compare.run.harness.TpGroups``); a
sweep's local engine (``compare.sweep.run.LocalRunner``: a cell at a time, here or in a worker process of its own)
and Ray's (``compare.cluster.ray_engine``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from compare.backends.registry import BackendSpec, probe
from compare.cost.records import Ceilings
from compare.formats.codec import from_json
from compare.problem.cases import Case
from compare.results import environment
from compare.results.document import Result
from compare.run import stop
from compare.run.budget import Budget, budget_phase
from compare.run.cell import against_ceilings, min_flops
from compare.run.grid import Cell
from compare.run.progress import Display
from compare.run.store import Store
from compare.timing.timer import TimingConfig


@dataclass(frozen=True)
class Finished:
    """One outcome of a cell: its result, what its backend reported (``meta``: ``precision``, ``gpu``), the seconds
    it took as the driver saw them, and whether it is the cell's last attempt (``final``: False for a lost worker's
    error row that is retried; every attempt is stored)."""

    cell: Cell
    result: Result
    meta: dict[str, Any]
    wall_s: float
    final: bool = True


class Executor(Protocol):
    """Where cells run."""

    def run(
        self,
        todo: list[Cell],
        specs: dict[str, BackendSpec],
        cfg: TimingConfig,
        may_start: Callable[[int], bool],
        starting: Callable[[Cell], None],
        done: Callable[[Finished], None],
    ) -> None:
        """Run ``todo``, telling ``done`` each outcome as it is known; ``may_start(left)`` is asked before a cell
        the executor may leave for a rerun (False: start no more; ``left`` cells were not started) and ``starting``
        told of each start."""
        ...


#: The ceiling probes (``compare.backends.registry.PROBES``), each a library's own GEMMs, in the order they are measured
#: (XLA's first: torch's OpenMP threads spin for a while after its GEMMs and would slow a probe that follows them); the
#: ceiling is the higher of them, on torch's record where there is one (it holds the 16-bit routes).
CEILING_PROBES: tuple[str, ...] = ("ceilings-xla", "ceilings")


def measure_ceilings(dtypes: Iterable[str], budget_s: float | None = None) -> Ceilings | None:
    """This machine's matmul FLOP/s and copy bandwidth per dtype: every probe of :data:`CEILING_PROBES` whose
    framework imports (XLA's, torch's on the device the torch backends use), per dtype the higher of them
    (``Ceiling.merged``; ``budget_s`` per dtype and probe, None: each probe's default); None where none imports."""
    dtypes = list(dtypes)
    got: dict[str, Ceilings] = {}
    for name in CEILING_PROBES:
        try:
            module = probe(name)
        except ImportError:
            continue
        got[name] = from_json(Ceilings, module.measure_all(dtypes, budget_s))
    if not got:
        return None
    base = got.pop("ceilings", None) or got.pop(next(iter(got)))
    for other in got.values():
        base = base.peak(other)
    return base


def hold(r: Result, case: Case, ceil: Ceilings) -> Result:
    """``compare.run.cell.against_ceilings`` for a row of ``case``: a single-device row against one device's
    ceiling; a tensor-parallel row's whole step (every rank's FLOPs together) against the ceiling times its hosts
    (its ranks share a host's cores)."""
    return against_ceilings(r, ceil, min_flops(case, r.mode), 1 if r.tp is None else max(1, len(r.tp.hosts)))


@dataclass
class Conducted:
    """What :func:`conduct` ended with: every final result as stored (held to ``ceilings``) and as measured, with
    its case; the precision settings and thread counts the backends reported; whether a stop ended it."""

    results: list[Result] = field(default_factory=list)
    raw: list[tuple[Result, Case]] = field(default_factory=list)
    ceilings: Ceilings | None = None
    precision: dict[str, Any] = field(default_factory=dict)
    threads: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False

    def rechecked(self, progress: Display | None, budget: Budget | None) -> list[Result]:
        """The results, where one beat the ceilings held to them measured again (each dtype's higher ceiling): a
        probe that ran while other work held the cores reads low, and real steps timed later would look faster
        than the machine."""
        ceil = self.ceilings
        if ceil is None or self.interrupted or all(r.status != "implausible" for r in self.results):
            return self.results
        if progress:
            progress.message("a step beat the ceilings: measuring them again", important=True)
        with budget_phase(budget, "ceilings"):
            again = measure_ceilings(dict.fromkeys(case.dtype for _, case in self.raw))
        self.ceilings = ceil = ceil if again is None else ceil.peak(again)
        return [hold(r, case, ceil) for r, case in self.raw]


def conduct(
    plan: Sequence[tuple[Executor, list[Cell]]],
    specs: dict[str, BackendSpec],
    cfg: TimingConfig,
    store: Store | None,
    *,
    dtypes: Sequence[str] = (),
    begin: Callable[[Ceilings | None], None] = lambda ceil: None,
    keyed: bool = False,
    budget: Budget | None = None,
    progress: Display | None = None,
) -> Conducted:
    """Run every executor of ``plan`` on its cells, in the stage order of the module docstring. ``dtypes``: those
    whose ceilings are measured first (none: no ceilings, no row held); ``begin`` is told them before the first
    cell. ``keyed``: a sweep's store, each line keyed by its cell with what its worker reported and its seconds (a
    run's line holds the precision settings reported so far). A failed write raises ``OSError``."""
    out = Conducted()
    total = sum(len(cells) for _, cells in plan)
    here: list[str] = []  # this machine's type, read at the first row measured elsewhere

    def may_start(left: int) -> bool:
        stop.check()  # a signal asked to stop: the cells in flight were the last
        if budget is not None and budget.left() <= 0:
            budget.cut(
                f"sweep: {left} of {total} cells not started, the {budget.total_s:g} s budget being spent; rerun "
                "the same command to resume them"
            )
            if progress:
                progress.message(budget.cuts[-1], important=True)
            return False
        return True

    def starting(cell: Cell) -> None:
        if progress:
            progress.starting(cell.label())

    def done(f: Finished) -> None:
        r, ceil = f.result, out.ceilings
        out.threads.update(r.threads)
        out.precision.update(f.meta.get("precision") or {})
        if ceil is not None and r.node is not None and not here:
            here.append(environment.node().machine_type())
        if ceil is not None and (r.node is None or r.node.machine_type() == here[0]):  # this machine's row
            r = hold(r, f.cell.case, ceil)
        fields: dict[str, Any] = {"key": f.cell.key, **f.meta, "wall_s": f.wall_s} if keyed else {}
        if store is not None:
            store.cell(r, fields.pop("precision", out.precision), **fields, **({} if f.final else {"retrying": True}))
        if not f.final:
            if progress:
                progress.message(f"{f.cell.label()}: {r.reason}; running it again", important=True)
            return
        out.raw.append((f.result, f.cell.case))
        out.results.append(r)
        if progress:
            x = f" x{r.world_size}" if r.tp is not None else ""
            label = f"{f.cell.label()} ({f.wall_s:.1f}s)" if keyed else f"{r.backend} {r.case} {r.mode}{x}"
            progress.cell(label, r.status, r.reason)

    try:
        if dtypes and total:  # before any backend runs
            if progress:
                progress.message("measuring ceilings (matmul FLOP/s, copy bandwidth)", important=True)
            probe_s = None
            if budget is not None:  # each dtype and probe its part of the ceilings' share
                probe_s = budget.part("ceilings", len(dtypes) * len(CEILING_PROBES))
                budget.cut(f"ceilings: {probe_s:.2g} s per dtype and probe (the probes' own default when unbudgeted)")
            with budget_phase(budget, "ceilings"):
                out.ceilings = measure_ceilings(dtypes, probe_s)
        begin(out.ceilings)
        for executor, cells in plan:
            if cells:
                executor.run(cells, specs, cfg, may_start, starting, done)
    except KeyboardInterrupt:  # keep what is done; the caller writes it and says so
        out.interrupted = True
    return out
