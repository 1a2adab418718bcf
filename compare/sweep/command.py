"""``python -m compare sweep``: run a grid of cells, one JSON line per finished cell, resumable after a crash.

The grid is ``tokens x dtypes x modes x backends`` at a fixed model, ``dim`` and ``hidden`` (from ``--preset`` or
``--model/--dim/--hidden``). Each token count ``T`` becomes the shape ``batch = T / seq, seq`` (``--seq``, default
1, so ``batch = T``); ``T`` must be a multiple of ``--seq``. A *cell* is ``(backend, case, mode)`` and its key is
``"backend|case name|mode"`` (the case name holds model, shape, dtype, distribution and seed).

``<out>/results.jsonl`` is append-only. Every start of the sweep appends a ``header`` line (its own run id, schema,
time, config, environment); every finished cell is appended as one ``cell`` line (that run id, the result record, the
precision settings its backend reported and the GPU it saw), written with a single ``write`` and flushed to disk
(``fsync``) before the next cell starts. A restart with the same ``--out`` and the same grid skips every cell
already in the file, so killing the sweep loses at most the cell in flight; a torn last line (the process died
inside the write) is dropped. A different grid in the same folder is refused (bad input): one file holds one
sweep. An exclusive lock on the file keeps a second sweep from writing it at the same time.

:func:`load_sweep` turns the file, at any time, into a regular results document (the shape of
``compare.run.harness.run``'s); at the end the sweep writes it as ``<out>/results.json`` with ``<out>/REPORT.md`` and
plots under ``<out>/plots/``. Every cell records what its step holds in memory (``compare.results.memory``): the
report plots it against tokens and, with ``--device-memory SIZE``, states the largest token count that fits.

Before the first cell, each start measures this machine's matmul and copy ceilings for the swept dtypes (in this
process, stored in its header line and as the document's ``ceilings``: the first session's that measured them) and
every single-device row is held to them as it is stored: a step whose fastest sample beats the matmul ceiling is
``implausible`` (``compare.run.cell.against_ceilings``). ``--no-ceilings`` skips both.

A backend that raises on a cell is an ``error`` result and the sweep goes on (``harness.run_one``). With
``--isolate`` each cell runs in its own worker process (``python -m compare.sweep.command --worker CELL RESULT``), so a
hard crash (segfault, the OOM killer, an abort) is recorded as an ``error`` naming the exit status or signal,
and ``--cell-timeout`` turns a hang into an error too. The workers' scratch files live under ``<out>/.cells/``,
removed when the sweep ends (however it ends) and, if a killed sweep left one, when the next one starts.
``--retry-errors`` runs again, on a restart, the cells whose stored result is an ``error`` (the new line wins).

``--engine ray`` (``compare.sweep.engines``; ``compare.cluster.ray_engine``) runs each cell as a Ray task on a cluster
(``--address HOST:PORT`` or ``auto``; none: a local Ray instance, shut down at the end) and appends each outcome to
the same file as it arrives; a lost worker or node is an attempt stored as an ``error`` line marked ``retrying`` (not
counted as done) before the cell runs again, up to ``--retries`` times. Every cell line's result carries the node that
measured it (``node``), on either engine.

Ctrl-C or SIGTERM stops the sweep: the worker in flight and everything it started are killed, what is done is
written to ``results.json`` and ``REPORT.md``, and the exit status is 130 (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec, spec
from compare.formats.atomic import write_text_atomic
from compare.formats.codec import to_json
from compare.formats.jsonl import Appender
from compare.problem.cases import (
    MODELS,
    PRESETS,
    InputError,
    check_finite,
    check_name,
    preset,
)
from compare.report import render as report
from compare.results import document as results
from compare.results import environment
from compare.results.document import Results
from compare.results.memory import parse_size
from compare.run import child, exitcodes, harness, preflight, stop
from compare.run.budget import Budget
from compare.run.cell import against_ceilings, min_flops
from compare.run.options import add_grid_args, check_grid_args, check_inputs
from compare.run.progress import Display, progress_level
from compare.run.store import new_run_id
from compare.sweep.engines import (
    DEFAULT_ENGINE,
    ENGINES,
    EngineOptions,
    Finished,
    Runner,
    check_address,
    engine,
    open_runner,
)
from compare.sweep.grid import (
    DEFAULT_TOKENS,
    Cell,
    cells_from_config,
    grid_config,
)
from compare.sweep.store import JSONL, check_same_grid, done_keys, load_sweep
from compare.sweep.worker import run_cell_inprocess, run_cell_isolated, worker_main

#: The workers' scratch folder under a sweep's output folder.
SCRATCH = ".cells"


class LocalRunner:
    """The local engine: each cell here (``run_cell_inprocess``), or in its own worker process with ``isolate``
    (``run_cell_isolated``, scratch files under ``scratch``, a hang ended after ``cell_timeout_s``); every row
    labelled with this machine (``compare.results.environment.node``)."""

    def __init__(self, isolate: bool = False, scratch: Path | None = None, cell_timeout_s: float | None = None):
        self.isolate, self.scratch, self.cell_timeout_s = isolate, scratch, cell_timeout_s

    def describe(self) -> dict[str, Any]:
        return {"name": "local", "isolate": self.isolate}

    def cells(
        self,
        todo: list[Cell],
        specs: dict[str, BackendSpec],
        cfg: harness.TimingConfig,
        may_start: Callable[[int], bool],
        starting: Callable[[Cell], None],
    ) -> Iterator[Finished]:
        plain_cache: dict[str, Any] = {}
        for i, cell in enumerate(todo):
            if not may_start(len(todo) - i):
                return
            t0 = time.perf_counter()
            starting(cell)
            if self.isolate:
                assert self.scratch is not None
                r, meta = run_cell_isolated(specs[cell.backend], cell, cfg, self.scratch, self.cell_timeout_s)
            else:
                r, meta = run_cell_inprocess(specs[cell.backend], cell, cfg, plain_cache)
            yield Finished(cell, dataclasses.replace(r, node=environment.node()), meta, time.perf_counter() - t0)

    def close(self) -> None:
        """Nothing to end: every worker process ended with its cell."""


def run_sweep(
    config: dict[str, Any],
    out: Path,
    specs: dict[str, BackendSpec],
    *,
    isolate: bool = False,
    cell_timeout_s: float | None = None,
    progress: Display | None = None,
    retry_errors: bool = False,
    ceilings: bool = False,
    budget: Budget | None = None,
    runner: Runner | None = None,
) -> Results:
    """Run every cell of ``config`` not yet in ``out/results.jsonl``, appending each as it finishes.

    ``specs`` maps each backend name in the config to its spec; ``retry_errors`` runs stored ``error`` cells again.
    ``runner`` is the engine that runs the cells (``compare.sweep.engines``; opened and closed by the caller); None:
    the local engine, with ``isolate`` and ``cell_timeout_s``. Every attempt the engine reports is stored (a lost
    worker's error row, marked ``retrying``, before the cell's next attempt; a reader takes the last attempt that is
    not marked, and a cell whose only lines are marked is not done).
    ``ceilings``: measure this machine's matmul and copy ceilings for the swept dtypes once, here, before any cell
    (``harness.measure_ceilings``; they go into this session's header line) and hold every single-device row
    measured on this machine type to them as it is stored (``compare.run.cell.against_ceilings``: its roofline
    numbers, and ``implausible`` where its fastest sample beats the matmul ceiling; a row from another machine type
    is not held to this one's); off, as ``compare run --no-ceilings``, the rows are stored as they come.
    ``budget`` (``compare.run.budget``): no cell starts once it is spent; the cells left are said as its cut and
    wait for a rerun of the same command (it resumes them). Returns :func:`load_sweep` of the file. The workers'
    scratch folder ``out/.cells`` is removed on the way out,
    and a stale one (a killed sweep's) on the way in, once this sweep holds the file's lock.
    """
    path = out / JSONL
    cfg = harness.TimingConfig(**config["timing"])
    env = environment.collect({}, {})
    here = environment.node().machine_type()
    cells = cells_from_config(config)
    if runner is None:
        runner = LocalRunner(isolate, out / SCRATCH, cell_timeout_s)
    with Appender(path) as w:
        check_same_grid(path, config, env)
        _remove_scratch(out)
        try:
            done = done_keys(path, retry_errors)
            todo = [c for c in cells if c.key not in done]
            ceil = None
            if ceilings and todo:  # before any backend runs, as `compare run` does
                if progress:
                    progress.message("measuring ceilings (matmul FLOP/s, copy bandwidth)", important=True)
                ceil = harness.measure_ceilings(config["dtypes"])
            run_id = new_run_id()  # this session's: its header and its cell lines carry it
            w.append(
                {
                    "type": "header",
                    "run_id": run_id,
                    "schema_version": results.SCHEMA_VERSION,
                    "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "config": config,
                    "environment": env,
                    "isolate": isolate,
                    "engine": runner.describe(),
                    **({"ceilings": to_json(ceil)} if ceil is not None else {}),
                }
            )
            n_done = len(cells) - len(todo)
            n_before = n_done
            if progress:
                progress.resume(n_done, len(cells))
            if progress and n_done:
                progress.message(f"resuming {path}: {n_done}/{len(cells)} cells already done", important=True)
            if progress and retry_errors:
                progress.message(
                    f"retrying {len(done_keys(path)) - len(done)} cell(s) whose stored result is an error",
                    important=True,
                )

            def may_start(left: int) -> bool:
                stop.check()  # a signal asked to stop: the cells in flight were the last
                if budget is not None and budget.left() <= 0:
                    budget.cut(
                        f"sweep: {left} of {len(cells)} cells not started, the {budget.total_s:g} s budget "
                        "being spent; rerun the same command to resume them"
                    )
                    if progress:
                        progress.message(budget.cuts[-1], important=True)
                    return False
                return True

            def starting(cell: Cell) -> None:
                if progress:
                    progress.starting(cell.label())

            for f in runner.cells(todo, specs, cfg, may_start, starting):
                r = f.result
                same_machine = r.node is None or r.node.machine_type() == here
                if ceil is not None and r.tp is None and same_machine:  # a single-device row: can its timing be right?
                    r = against_ceilings(r, ceil, min_flops(f.cell.case, f.cell.mode))
                line = {"type": "cell", "run_id": run_id, "key": f.cell.key, "result": to_json(r), **f.meta}
                line["wall_s"] = f.wall_s
                try:
                    w.append(line if f.final else {**line, "retrying": True})
                except OSError as exc:
                    raise exitcodes.WriteFailed(
                        f"cannot append to {path} ({exc.strerror or exc}): the {n_done - n_before} "
                        f"cells of this session before it are stored; free space and rerun the same command to resume"
                    ) from exc
                if not f.final:
                    if progress:
                        progress.message(f"{f.cell.label()}: {r.reason}; running it again", important=True)
                    continue
                n_done += 1
                if progress:
                    progress.cell(f"{f.cell.label()} ({f.wall_s:.1f}s)", r.status, r.reason)
        finally:
            _remove_scratch(out)
    return load_sweep(path)


def _remove_scratch(out: Path) -> None:
    """Remove the workers' scratch folder ``out/.cells`` if there is one."""
    with contextlib.suppress(FileNotFoundError):  # none: nothing to clean
        shutil.rmtree(out / SCRATCH)


def finish(out: Path, doc: Results, plots: bool = True) -> Results:
    """Write ``results.json``, plots (the document's ``plots``, paths relative to ``out``) and ``REPORT.md``."""
    if plots:
        from compare.report.plots import render_plots

        try:
            paths = render_plots(doc, out / "plots")
        except Exception as exc:  # plots are a convenience: never lose the results over them
            print(f"sweep: warning: no plots: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            doc = dataclasses.replace(doc, plots=tuple(p.relative_to(out).as_posix() for p in paths))
    results.write_json(out / "results.json", doc)
    write_text_atomic(out / "REPORT.md", report.render(doc))
    return doc


# --- command line ---------------------------------------------------------------------------------------------


def config_from_args(a: argparse.Namespace) -> dict[str, Any]:
    """The sweep config (grid, backends, dtypes, modes, timing) from parsed arguments; bad input raises, and so
    does a grid whose largest case does not fit in memory."""

    check_grid_args(a)
    base = preset(a.preset) if a.preset else None
    model = check_name("model", a.model, MODELS) if a.model else (base.model if base else None)
    if model is None:
        raise InputError(f"give --preset or --model; known models: {', '.join(MODELS)}")
    dim = a.dim if a.dim is not None else (base.shape.dim if base else None)
    hidden = a.hidden if a.hidden is not None else (base.shape.hidden if base else None)
    missing = [n for n, v in (("--dim", dim), ("--hidden", hidden)) if v is None]
    if dim is None or hidden is None:
        raise InputError(f"without --preset, give every dimension; missing: {', '.join(missing)}")
    grid = grid_config(model, dim, hidden, a.tokens, a.seq, base.dist if base else "normal", a.seed)
    timing = asdict(dataclasses.replace(harness.TimingConfig(), budget_s=a.budget))
    config = {
        "command": "python -m compare " + shlex.join(getattr(a, "argv", None) or ["sweep"]),
        "preset": a.preset,
        "grid": grid,
        "backends": list(a.backend),
        "dtypes": list(a.dtype),
        "modes": list(a.mode),
        "timing": timing,
        "device_memory": parse_size(a.device_memory, "--device-memory") if a.device_memory else 0,
    }
    check_inputs(a, dict.fromkeys(c.case for c in cells_from_config(config)))
    preflight.check_memory(dict.fromkeys(c.case for c in cells_from_config(config)))
    return config


def cmd_sweep(a: argparse.Namespace) -> int:
    """Run (or resume) a sweep; write results.json, REPORT.md and plots. 0 if every cell is ok or skipped.

    Everything is checked before the first cell: the arguments, the memory the largest case needs, the golden
    files, the output folder. Ctrl-C or SIGTERM: the cell in flight is dropped, the rest written, status 130.
    """
    config = config_from_args(a)
    if a.cache != "warm":
        raise InputError(
            f"--cache {a.cache}: a sweep times warm caches only (each cell on its own); cold samples are "
            "`python -m compare run --cache cold` or `both`"
        )
    options = engine_options(a)
    preflight.check_golden(dict.fromkeys(c.case for c in cells_from_config(config)))
    out = preflight.prepare_out_dir(Path(a.out))
    with preflight.lock_folder(out, shlex.join(getattr(a, "argv", None) or ["sweep"])), stop.on_signals():
        return _sweep_locked(a, config, out, options)


#: The environment variables that travel with the cells to another engine's workers (the tool's own settings: the
#: data cache, the Triton choice, ...), by prefix; the parent-death marker of ``compare.run.child`` stays here.
TRAVELS = "FUSION_COMPARE_"


def engine_options(a: argparse.Namespace) -> EngineOptions:
    """The engine's options from parsed arguments, checked (bad input raises InputError naming what is allowed):
    ``--engine`` is a registered one, ``--address``, ``--retries`` and ``--cpus-per-cell`` belong to an engine
    that runs elsewhere, ``--isolate`` to the local one, ``--cell-timeout`` to a worker process."""
    e = engine(a.engine)
    if a.cell_timeout is not None:
        check_finite("--cell-timeout", a.cell_timeout)
        if e.name == "local" and not a.isolate:
            raise InputError("--cell-timeout needs --isolate (only a worker process can be stopped) or --engine ray")
    if e.name == "local":
        given = [
            n
            for n, v in (("--address", a.address), ("--retries", a.retries), ("--cpus-per-cell", a.cpus_per_cell))
            if v is not None
        ]
        if given:
            raise InputError(f"{', '.join(given)}: only with --engine ray (the local engine runs the cells here)")
        return EngineOptions(cell_timeout_s=a.cell_timeout)
    if a.isolate:
        raise InputError(
            f"--isolate is the local engine's: --engine {e.name} runs every cell in a worker process of its own"
        )
    if a.retries is not None and a.retries < 0:
        raise InputError(f"--retries must be 0 or more (attempts after a lost worker or node), got {a.retries}")
    cpus = 1.0 if a.cpus_per_cell is None else a.cpus_per_cell
    check_finite("--cpus-per-cell", cpus)
    return EngineOptions(
        address=None if a.address is None else check_address(a.address),
        retries=1 if a.retries is None else a.retries,
        cell_timeout_s=a.cell_timeout,
        cpus_per_cell=cpus,
        env={k: v for k, v in os.environ.items() if k.startswith(TRAVELS) and k != child.PARENT_ENV},
    )


def _sweep_locked(a: argparse.Namespace, config: dict[str, Any], out: Path, options: EngineOptions) -> int:
    """``cmd_sweep`` once the folder is locked and the signals set a flag."""
    specs = {b: spec(b) for b in config["backends"]}
    budget = Budget(a.time_budget) if a.time_budget is not None else None
    interrupted = False
    e = engine(a.engine)
    runner: Runner | None = None
    try:
        with Display(0, progress_level(a), title="sweep") as display:
            if e.name != "local":
                display.message(
                    f"starting the {e.name} engine ({options.address or 'a local instance'})", important=True
                )
                runner = open_runner(e, options)
            doc = run_sweep(
                config,
                out,
                specs,
                isolate=a.isolate,
                cell_timeout_s=a.cell_timeout,
                progress=display,
                retry_errors=a.retry_errors,
                ceilings=not a.no_ceilings,
                budget=budget,
                runner=runner,
            )
        if budget is not None:
            doc = dataclasses.replace(doc, budget=budget.record())
    except KeyboardInterrupt:
        interrupted = True
        why = stop.requested() or "an interrupt"
        print(f"sweep: stopped by {why}; writing what is done (rerun the same command to resume)", file=sys.stderr)
        doc = load_sweep(out / JSONL)
    finally:
        if runner is not None:
            runner.close()
    if config["device_memory"]:  # this session's --device-memory, over the first session's
        doc = dataclasses.replace(doc, config=dataclasses.replace(doc.config, device_memory=config["device_memory"]))
    try:
        finish(out, doc, plots=not a.no_plots)
    except OSError as exc:
        raise exitcodes.WriteFailed(
            f"cannot write the summary in {out} ({exc.strerror or exc}): every finished cell is in {out / JSONL}; "
            f"free space and run `python -m compare report {out}`"
        ) from exc
    prog = doc.config.progress
    done = f"{prog.done}/{prog.cells} cells" if prog else "no cells"
    print(f"wrote {out / 'results.json'} and {out / 'REPORT.md'}: {done} ({doc.summary()})")
    if interrupted:
        return exitcodes.INTERRUPTED
    return exitcodes.of_statuses((r.status for r in doc.results), a.strict)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sweep`` subcommand on an ``argparse`` subparsers object."""

    p: argparse.ArgumentParser = subparsers.add_parser(
        "sweep",
        help="run a grid of token counts x dtypes x modes x backends; resumable (results.jsonl)",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", help=f"dim, hidden, model and distribution from: {', '.join(PRESETS)}")
    p.add_argument("--model", help=f"one of: {', '.join(MODELS)} (default: the preset's)")
    p.add_argument("--dim", type=int, help="override the preset's dim")
    p.add_argument("--hidden", type=int, help="override the preset's hidden")
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=list(DEFAULT_TOKENS),
        help="token counts (default: %(default)s); each is batch x seq with batch = tokens / seq",
    )
    p.add_argument("--seq", type=int, default=1, help="sequence length of every case (default: 1, batch = tokens)")
    add_grid_args(p, budget_help="seconds of timed samples per cell", cache_default="warm")
    p.add_argument("--out", default="out/sweep", help="output folder; rerun with the same one to resume")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run each cell in a worker process: a segfault or OOM kill is recorded, not fatal",
    )
    p.add_argument(
        "--cell-timeout", type=float, help="with --isolate or --engine ray: seconds before a cell is ended (an error)"
    )
    p.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        help="where the cells run: "
        + "; ".join(f"{e.name}: {e.about}" for e in ENGINES.values())
        + f" (default: {DEFAULT_ENGINE}; ray needs the cluster extra, {ENGINES['ray'].install})",
    )
    p.add_argument(
        "--address",
        help="with --engine ray: the cluster's head, HOST:PORT (e.g. head-node:6379), or auto (the cluster `ray start` "
        "started on this machine); none: a local Ray instance on this machine, shut down at the end",
    )
    p.add_argument(
        "--retries",
        type=int,
        help="with --engine ray: times a cell whose worker process or node was lost runs again (default: 1); every "
        "attempt is stored",
    )
    p.add_argument("--cpus-per-cell", type=float, help="with --engine ray: CPUs each CPU cell asks for (default: 1)")
    p.add_argument(
        "--retry-errors", action="store_true", help="on a restart, run again the cells whose stored result is an error"
    )
    p.add_argument("--no-plots", action="store_true", help="do not write plots")
    p.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="the device memory (e.g. 80GiB, 512MiB) the report fits each backend's measured memory against: the "
        "largest token count that fits, from a line through the measured points",
    )
    p.add_argument(
        "--no-ceilings",
        action="store_true",
        help="skip measuring this machine's matmul FLOP/s and copy bandwidth (roofline columns, implausible rows)",
    )
    p.set_defaults(fn=cmd_sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compare.sweep.command [sweep options]`` (same as ``python -m compare sweep``), or the worker."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        if len(argv) != 3:
            print("usage: python -m compare.sweep.command --worker CELL.json RESULT.json", file=sys.stderr)
            return 2
        return worker_main(Path(argv[1]), Path(argv[2]))
    top = argparse.ArgumentParser(prog="python -m compare.sweep.command")
    sub = top.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = top.parse_args(["sweep", *argv])
    a.argv = ["sweep", *argv]  # as `python -m compare` sets it: the subcommand and its arguments
    return exitcodes.exit_status(lambda: a.fn(a))


if __name__ == "__main__":
    raise SystemExit(main())
