"""``python -m compare sweep``: its arguments, checked into the sweep's config and options, and the command that runs
(or resumes) the sweep (``compare.run.sweep``, whose docstring tells the store's protocol) and writes its summary."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from compare.backends.registry import spec
from compare.cli import cache as cache_command
from compare.cli import history as history_command
from compare.cli.args import (
    add_grid_args,
    add_module_args,
    add_weights_args,
    check_grid_args,
    check_inputs,
    module_from_args,
    progress_level,
    resolve_case,
    weights_from_args,
)
from compare.cli.outputs import write_outputs
from compare.problem.cases import MODELS, PRESETS, InputError, check_finite
from compare.results.memory import parse_size
from compare.run import child, exitcodes, preflight, stop
from compare.run import sweep as sweep_run
from compare.run.budget import Budget
from compare.run.engines import DEFAULT_ENGINE, ENGINES, EngineOptions, Runner, check_address, engine, open_runner
from compare.run.grid import DEFAULT_TOKENS, cells_from_config, grid_config
from compare.run.options import RunOptions
from compare.run.progress import Display
from compare.run.store import JSONL, load_sweep
from compare.timing.timer import TimingConfig


def config_from_args(a: argparse.Namespace) -> dict[str, Any]:
    """The sweep config (grid, backends, dtypes, modes, timing) from parsed arguments; bad input raises, and so
    does a grid whose largest case does not fit in memory."""

    check_grid_args(a)
    model, shape, dist = resolve_case(a, own_sizes=False)
    module = module_from_args(a, dataclasses.replace(shape, seq=a.seq))  # its forward run once on 1 x seq tokens
    weights = weights_from_args(a, model, module)  # one per layer with --layers
    grid = grid_config(model, shape.dim, shape.hidden, a.tokens, a.seq, dist, a.seed, weights, module)
    timing = dataclasses.asdict(TimingConfig(budget_s=a.budget))
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
    preflight.check_cases((c.case for c in cells_from_config(config)), backward=any(m != "fwd" for m in a.mode))
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
    history = history_command.target(a)
    with preflight.lock_folder(out, shlex.join(getattr(a, "argv", None) or ["sweep"])), stop.on_signals():
        return _sweep_locked(a, config, out, options, history)


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


def _sweep_locked(
    a: argparse.Namespace,
    config: dict[str, Any],
    out: Path,
    engine_opts: EngineOptions,
    history: history_command.Target | None = None,
) -> int:
    """``cmd_sweep`` once the folder is locked and the signals set a flag; a sweep that ran to its end appends its
    document to ``history``."""
    specs = {b: spec(b) for b in config["backends"]}
    budget = Budget(a.time_budget) if a.time_budget is not None else None
    interrupted = False
    e = engine(a.engine)
    runner: Runner | None = None
    try:
        with Display(0, progress_level(a), title="sweep") as display:
            if e.name != "local":
                display.message(
                    f"starting the {e.name} engine ({engine_opts.address or 'a local instance'})", important=True
                )
                runner = open_runner(e, engine_opts)
            options = RunOptions(
                isolate=a.isolate,
                cell_timeout_s=a.cell_timeout,
                retry_errors=a.retry_errors,
                ceilings=not a.no_ceilings,
            )
            doc = sweep_run.run_sweep(config, out, specs, options, progress=display, budget=budget, runner=runner)
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
    doc = cache_command.with_use(doc)
    try:
        doc = write_outputs(out, doc, plots=not a.no_plots).doc
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
    history_command.record(history, doc, "sweep")
    return exitcodes.of_statuses((r.status for r in doc.results), a.strict)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sweep`` subcommand on an ``argparse`` subparsers object."""

    p: argparse.ArgumentParser = subparsers.add_parser(
        "sweep",
        help="run a grid of token counts x dtypes x modes x backends; resumable (results.jsonl)",
        description=sweep_run.__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", help=f"dim, hidden, model and distribution from: {', '.join(PRESETS)}")
    p.add_argument("--model", help=f"one of: {', '.join(MODELS)} (default: the preset's)")
    p.add_argument("--dim", type=int, help="override the preset's dim")
    p.add_argument("--hidden", type=int, help="override the preset's hidden")
    add_module_args(p)
    add_weights_args(p)
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
    cache_command.add_data_cache_arg(p)
    history_command.add_history_arg(p)
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
