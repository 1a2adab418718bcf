"""The one conductor of every measurement (``run``, ``profile``, ``sweep``), :meth:`Conductor.conduct`, and its stage
order: this machine's ceilings per dtype first (:func:`measure_ceilings`, under the budget's ``ceilings`` share)
and each case's GEMM FLOPs (``compare.run.cell.min_flops``: a module case's counted, outside any timed window);
then each executor (:class:`Executor`: the run's ``compare.run.harness.Groups`` and ``TpGroups``, a sweep's
``compare.run.sweep.LocalRunner`` and ``compare.cluster.ray_engine``) runs its cells, each finished one
(:class:`Finished`) held to the ceilings (:func:`hold`), stored (``compare.run.store``) and said. A stop
(``compare.run.stop``) ends it between cells; no cell an executor may leave for a rerun starts once the budget is
spent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
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
from compare.run.progress import Display, short
from compare.run.store import Store
from compare.timing.timer import TimingConfig


@dataclass(frozen=True)
class Finished:
    """One outcome of a cell: its result, what its backend reported (``meta``: ``precision``, ``gpu``), its seconds
    as the driver saw them, and whether it is its last attempt (not: a lost worker's row, stored, then retried)."""

    cell: Cell
    result: Result
    meta: dict[str, Any]
    wall_s: float
    final: bool = True


class Executor(Protocol):
    def run(self, todo: list[Cell], to: Conductor) -> None:
        """Run ``todo`` (specs ``to.specs``, timer ``to.cfg``), telling ``to.done`` each outcome as it is known;
        ``to.may_start(left)`` is asked before a cell it may leave for a rerun, ``to.starting`` told of each start."""
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
    """``compare.run.cell.against_ceilings`` for a row of ``case``: a tensor-parallel row's whole step (every rank's
    FLOPs) against the ceiling times its hosts (its ranks share a host's cores)."""
    return against_ceilings(r, ceil, min_flops(case, r.mode), 1 if r.tp is None else max(1, len(r.tp.hosts)))


class Conductor:
    """The conductor of one run or sweep session, what its executors are given (``keyed``: a sweep's store, each line
    keyed by its cell with its worker's report and seconds; a run's holds the precision settings reported so far).
    After :meth:`conduct`: every final result as stored and as measured (``raw``, with its case), the precision
    settings and thread counts reported, and whether a stop ended it."""

    def __init__(
        self, specs: dict[str, BackendSpec], cfg: TimingConfig, store: Store | None, *, keyed: bool = False,
        budget: Budget | None = None, progress: Display | None = None,
    ) -> None:  # fmt: skip
        self.specs, self.cfg, self.store, self.keyed = specs, cfg, store, keyed
        self.budget, self.progress, self.total, self.here = budget, progress, 0, ""  # here: this machine's type
        self.results: list[Result] = []
        self.raw: list[tuple[Result, Case]] = []
        self.ceilings: Ceilings | None = None
        self.precision: dict[str, Any] = {}
        self.threads: dict[str, Any] = {}
        self.interrupted = False

    def may_start(self, left: int) -> bool:
        stop.check()  # a signal asked to stop: the cells in flight were the last
        budget = self.budget
        if budget is not None and budget.left() <= 0:
            budget.cut(
                f"sweep: {left} of {self.total} cells not started, the {budget.total_s:g} s budget being spent; rerun "
                "the same command to resume them"
            )
            if self.progress:
                self.progress.message(budget.cuts[-1], important=True)
            return False
        return True

    def starting(self, cell: Cell) -> None:
        if self.progress:
            self.progress.starting(cell.label())

    def done(self, f: Finished) -> None:
        """Hold ``f`` to the ceilings where it was measured on this machine type, store it, say it."""
        r, ceil, progress = f.result, self.ceilings, self.progress
        self.threads.update(r.threads)
        self.precision.update(f.meta.get("precision") or {})
        if ceil is not None and r.node is not None and not self.here:
            self.here = environment.node().machine_type()
        if ceil is not None and (r.node is None or r.node.machine_type() == self.here):
            r = hold(r, f.cell.case, ceil)
        fields: dict[str, Any] = {"key": f.cell.key, **f.meta, "wall_s": f.wall_s} if self.keyed else {}
        if self.store is not None:
            more = {} if f.final else {"retrying": True}
            self.store.cell(r, fields.pop("precision") if self.keyed else self.precision, **fields, **more)
        if not f.final:
            if progress:
                progress.message(f"{f.cell.label()}: {short(r.reason)}; running it again", important=True)
            return
        self.raw.append((f.result, f.cell.case))
        self.results.append(r)
        if progress:
            x = f" x{r.world_size}" if r.tp is not None else ""
            label = f"{f.cell.label()} ({f.wall_s:.1f}s)" if self.keyed else f"{r.backend} {r.case} {r.mode}{x}"
            progress.cell(label, r.status, r.reason)

    def error(self, cell: Cell, reason: str, wall_s: float = 0.0, final: bool = True, **extras: Any) -> None:
        """:meth:`done` with ``cell`` an ``error`` row that no backend reported (refused, lost, ended, unjudgeable)."""
        r = Result.for_case(cell.backend, cell.case, cell.mode, "error", reason=reason, extras=extras)
        self.done(Finished(cell, replace(r, world_size=cell.world_size), {"precision": {}, "gpu": None}, wall_s, final))

    def rechecked(self) -> list[Result]:
        """The results, held to the ceilings measured again (each dtype's higher) where one beat them: a probe that
        ran while other work held the cores reads low."""
        ceil = self.ceilings
        if ceil is None or self.interrupted or all(r.status != "implausible" for r in self.results):
            return self.results
        if self.progress:
            self.progress.message("a step beat the ceilings: measuring them again", important=True)
        with budget_phase(self.budget, "ceilings"):
            again = measure_ceilings(dict.fromkeys(case.dtype for _, case in self.raw))
        self.ceilings = ceil = ceil if again is None else ceil.peak(again)
        return [hold(r, case, ceil) for r, case in self.raw]

    def conduct(
        self,
        plan: Sequence[tuple[Executor, list[Cell]]],
        dtypes: Sequence[str] = (),
        begin: Callable[[Ceilings | None], None] | None = None,
    ) -> Conductor:
        """Run every executor of ``plan`` on its cells, in the stage order of the module docstring: the ceilings of
        ``dtypes`` first (none: no row held), told to ``begin`` before any cell. A failed write raises ``OSError``."""
        self.total, budget, progress = sum(len(cells) for _, cells in plan), self.budget, self.progress
        try:
            if dtypes and self.total:  # before any backend runs
                if progress:
                    progress.message("measuring ceilings (matmul FLOP/s, copy bandwidth)", important=True)
                probe_s = None
                if budget is not None:  # each dtype and probe its part of the ceilings' share
                    probe_s = budget.part("ceilings", len(dtypes) * len(CEILING_PROBES))
                    own = "the probes' own default when unbudgeted"
                    budget.cut(f"ceilings: {probe_s:.2g} s per dtype and probe ({own})")
                with budget_phase(budget, "ceilings"):
                    self.ceilings = measure_ceilings(dtypes, probe_s)
            if self.ceilings is not None:  # each case's FLOPs before any step runs (a module case's are counted)
                for case, mode in dict.fromkeys((c.case, c.mode) for _, cells in plan for c in cells):
                    min_flops(case, mode)
            if begin is not None:
                begin(self.ceilings)
            for executor, cells in plan:
                if cells:
                    executor.run(cells, self)
        except KeyboardInterrupt:  # keep what is done; the caller writes it and says so
            self.interrupted = True
        return self
