"""``python -m compare run`` and ``profile``: their arguments, checked into the cases, backends, modes and one
:class:`~compare.run.options.RunOptions`, then the run (``compare.run.harness.run``, and the compile-cost sweep
``compare.run.shape_sweep``), every finished cell in the store (``compare.run.store``) as it finishes."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from compare.backends.registry import spec
from compare.backends.tp import LAUNCHES
from compare.cli import cache as cache_command
from compare.cli import history as history_command
from compare.cli.args import (
    add_case_args,
    add_grid_args,
    cases_from_args,
    check_cases,
    check_grid_args,
    check_inputs,
    progress_level,
)
from compare.cli.outputs import write_outputs
from compare.cost.comm import check_world_size
from compare.problem.cases import MODES, Case, InputError, check_name, check_unique
from compare.problem.shape_cases import case_for_tokens
from compare.results import document
from compare.results import gpu_build as gpu_build_layout
from compare.results import load as machine_load
from compare.run import exitcodes, harness, preflight, shape_sweep, stop
from compare.run.budget import Budget, budget_phase
from compare.run.options import RunOptions
from compare.run.progress import Display
from compare.run.store import CELLS, Store, open_run, set_aside
from compare.timing import llc, nvml


def cmd_run(a: argparse.Namespace) -> int:
    """Check every argument, the memory the cases need, the golden files and the output folder; then measure and
    write results.json and REPORT.md (atomically). Interrupted (Ctrl-C, SIGTERM), it saves what finished: 130."""
    check_grid_args(a)
    cases = cases_from_args(a)  # once: a --weights file is read and hashed here
    check_inputs(a, cases)
    specs = [spec(b) for b in a.backend]
    modes = [check_name("mode", m, MODES) for m in a.mode]
    world_sizes = [int(w) for w in check_unique("--world-size", [str(w) for w in a.world_size])]
    for w in world_sizes:
        for c in cases:
            if w > 1 or any(s.runtime for s in specs):
                check_world_size(c, w)
    if a.tp_launch is not None:
        check_name("--tp-launch", a.tp_launch, list(LAUNCHES))
    shape_sweep_cases: list[Case] = []
    if a.shape_sweep:
        for t in a.shape_sweep:
            if t <= 0:
                raise InputError(f"--shape-sweep token counts must be positive integers, got {t}")
        check_unique("--shape-sweep token count", [str(t) for t in a.shape_sweep])
        shape_sweep_cases = [case_for_tokens(c, t) for c in cases for t in a.shape_sweep]
    flush = llc.flush_bytes(llc.cpu_last_level()) if a.cache != "warm" else 0  # a host buffer (a GPU's: on it)
    preflight.check_memory(cases, specs, any(m != "fwd" for m in modes), flush=flush)
    preflight.check_memory(shape_sweep_cases)
    check_cases(a, cases)  # a module is built at its size: after the memory check
    preflight.check_golden(cases)
    out = preflight.prepare_out_dir(Path(a.out))
    history = history_command.target(a)
    config = {
        "command": "python -m compare " + shlex.join(a.argv),
        "preset": a.preset,
        "backends": a.backend,
        "dtypes": a.dtype,
        "modes": modes,
        "world_sizes": world_sizes,
        "planned": len(cases) * len(modes) * len(a.backend) * len(world_sizes),
    }
    options = RunOptions(
        cfg=harness.TimingConfig(budget_s=a.budget),
        config=config,
        profile=a.profile or a.trace,
        trace_dir=out / "traces" if a.trace else None,
        memory=a.memory or a.profile or a.trace,
        ceilings=not a.no_ceilings,
        world_sizes=tuple(world_sizes),
        tp_launch=a.tp_launch,
        tp_logs=out / "tp-logs",
        cache_mode=a.cache,
        reuse_parity=not a.no_parity_cache,
        cuda_graphs=a.cuda_graphs,
    )
    plan = _Plan(
        cases, specs, modes, options, out, tuple(a.shape_sweep or ()), a.time_budget,
        Path(a.gpu_build) if a.gpu_build else None, not a.no_plots, a.strict, progress_level(a), history,
    )  # fmt: skip
    with preflight.lock_folder(out, shlex.join(a.argv)), stop.on_signals():
        return _run_locked(plan)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What ``run`` measures, every part of it checked: the cases, backends and modes, how (``options``), the
    (locked) output folder, the compile-cost sweep's token counts, the whole command's time budget (seconds; None:
    none), the gpu-build folder whose table the report includes, whether to plot, ``--strict``, how much to
    print (``compare.run.progress.LEVELS``) and the history a finished run appends itself to (None: none)."""

    cases: list[Case]
    specs: list[Any]
    modes: list[str]
    options: RunOptions
    out: Path
    shape_sweep: tuple[int, ...]
    time_budget: float | None
    gpu_build: Path | None
    plots: bool
    strict: bool
    level: str
    history: history_command.Target | None = None


def _run_locked(plan: _Plan) -> int:
    """``cmd_run`` once the folder is locked and the signals set a flag: measure into the store (``cells.jsonl``),
    then write results.json and REPORT.md from the document, never replacing an earlier run's results.json with
    fewer cells when interrupted (the interrupted run's document then goes to ``results.interrupted.json``)."""
    out = plan.out
    try:
        aside = set_aside(out)
        if aside is not None:
            print(f"kept a cut-short run's store: {out / CELLS} is now {aside}", file=sys.stderr)
        store = open_run(out, plan.options.config)
    except OSError as exc:
        raise InputError(f"cannot write the store {out / CELLS}: {exc.strerror or exc}") from exc
    with store:
        try:
            doc = _measure(plan, store)
        except OSError as exc:  # the store could not take a cell: the disk is full (or gone)
            raise exitcodes.WriteFailed(
                f"cannot append to {store.path} ({exc.strerror or exc}): its {store.cells} finished cells are kept; "
                f"free space and run `python -m compare report {out}`: it rebuilds results.json and REPORT.md from "
                f"this run's store (run {store.run_id}), not from an older run's results.json there"
            ) from exc
        stopped_by = (stop.requested() or "Ctrl-C") if doc.interrupted else ""
        doc = dataclasses.replace(doc, run_id=store.run_id, stopped_by=stopped_by)
        with contextlib.suppress(OSError):  # the load and the end mark only tell a rebuild more
            if doc.load is not None:
                store.load(doc.load)
            store.end(stopped_by)
    build = _gpu_build_table(plan.gpu_build) if plan.gpu_build else None
    if build is not None:
        doc = dataclasses.replace(doc, gpu_build=build)
    doc = cache_command.with_use(doc)
    try:
        written = write_outputs(out, doc, plots=plan.plots and not doc.interrupted)
    except OSError as exc:
        raise exitcodes.WriteFailed(
            f"cannot write the results and the report in {out} ({exc.strerror or exc}): the "
            f"{store.cells} finished cells are in {store.path}; free space and run `python -m compare report {out}`: "
            f"it rebuilds them from this run's store (run {store.run_id}), not from an older run's results.json there"
        ) from exc
    doc, target, report_path = written.doc, written.results, written.report
    if written.kept:
        print(f"kept the earlier run's {out / 'results.json'}: it holds cells this interrupted run did not reach",
              file=sys.stderr)  # fmt: skip
    if doc.interrupted:
        print(
            f"interrupted: saved {len(doc.results)} finished cells to {target} and {report_path} "
            f"({stopped_by}; the store {store.path} holds {store.cells})",
            file=sys.stderr,
        )
        return exitcodes.INTERRUPTED
    print(f"wrote {target} and {report_path} ({doc.summary()})")
    history_command.record(plan.history, doc, "run")
    return exitcodes.of_statuses((r.status for r in doc.results), plan.strict)


def _measure(plan: _Plan, store: Store) -> document.Results:
    """The measurements of ``run``: the harness, then the shape sweep unless the harness was interrupted; every
    finished cell goes into ``store`` as it finishes.

    ``harness.run`` returns the finished results with ``interrupted`` set when interrupted; an interrupt
    during the shape sweep keeps the harness's results and drops the sweep's.
    """
    cases = plan.cases
    cells = len(cases) * len(plan.modes) * len(plan.specs) * len(plan.options.world_sizes)
    budget = Budget(plan.time_budget) if plan.time_budget is not None else None
    deadline = budget.deadline() if budget is not None else None
    device = nvml.open_device()  # GPU telemetry over every timed window, where NVML sees a GPU
    if isinstance(device, nvml.Unavailable):
        watch, telemetry = None, f"no GPU telemetry: {device.reason}"
    else:
        opened = device
        watch, telemetry = (lambda: nvml.NvmlWatch(opened)), f"NVML on {device.name()}"
    with Display(cells, plan.level, title="run", deadline=deadline) as display:
        sampler = machine_load.start()  # the machine's load over the measurements (compare.results.load)
        if budget is not None and plan.shape_sweep:  # the compile-cost sweep's part follows the cells
            left = budget
            display.after(lambda: left.part("shape_sweep"))
        doc = harness.run(
            cases, plan.specs, plan.modes, plan.options, progress=display, store=store, budget=budget, watch=watch
        )
        doc = dataclasses.replace(doc, telemetry=telemetry, load=sampler.stop())
        if plan.shape_sweep and not doc.interrupted:
            swept, tokens, per_shape, deadline = cases, list(plan.shape_sweep), plan.options.cfg.budget_s, None
            if budget is not None:
                swept, tokens, per_shape, share = shape_sweep.budgeted_sweep(cases, tokens, per_shape, budget)
                deadline = time.monotonic() + share
            try:
                with budget_phase(budget, "shape_sweep"):
                    rows = shape_sweep.run_shape_sweep(
                        swept,
                        tokens,
                        per_shape,
                        lambda s: display.message(s, important=True),
                        deadline=deadline,
                        cut=budget.cut if budget is not None else None,
                    )
                doc = dataclasses.replace(doc, shape_sweep=tuple(rows))
                store.shape_sweep(rows)
            except KeyboardInterrupt:
                doc = dataclasses.replace(doc, interrupted=True)
        if budget is not None:
            doc = dataclasses.replace(doc, budget=budget.record())
    return doc


def _gpu_build_table(folder: Path) -> dict[str, Any] | None:
    """``folder/gpu_build.json`` (``python -m compare gpu-build``), to be included in the report; None if absent."""
    path = folder / "gpu_build.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"--gpu-build: {path} is not valid JSON ({exc}); rebuild it with `make gpu-build`") from exc
    if not isinstance(data, dict) or data.get("schema") != gpu_build_layout.SCHEMA_VERSION:
        raise InputError(f"--gpu-build: {path} is not a gpu-build table of schema {gpu_build_layout.SCHEMA_VERSION}")
    return data


def add_run_args(r: argparse.ArgumentParser) -> None:
    """The options shared by ``run`` and ``profile``."""
    add_case_args(r)
    add_grid_args(r, budget_help="seconds of timed samples per backend and mode")
    r.add_argument("--out", default="out", help="output folder (default: out)")
    cache_command.add_data_cache_arg(r)
    history_command.add_history_arg(r)
    r.add_argument(
        "--no-ceilings",
        action="store_true",
        help="skip measuring this machine's matmul FLOP/s and copy bandwidth (roofline columns)",
    )
    r.add_argument(
        "--shape-sweep",
        nargs="+",
        type=int,
        metavar="TOKENS",
        help="also sweep these token counts through one compiled function per backend (compile cost)",
    )
    r.add_argument("--no-plots", action="store_true", help="do not render PNG plots (matplotlib)")
    r.add_argument(
        "--gpu-build",
        default="reports/gpu-build",
        metavar="DIR",
        help="include DIR/gpu_build.json (`python -m compare gpu-build`) in the report when it exists "
        "(default: %(default)s; '' to leave it out)",
    )
    r.add_argument(
        "--world-size",
        nargs="+",
        type=int,
        default=[1],
        help="tensor-parallel world sizes (each must divide hidden; default 1); single-device backends run at 1 only",
    )
    r.add_argument(
        "--tp-launch",
        help=f"how tensor-parallel ranks start where a backend supports it: {' or '.join(LAUNCHES)} "
        "(default: each backend's first; JAX: devices, N CPU devices in one process)",
    )
    r.add_argument(
        "--profile",
        action="store_true",
        help="count kernels and fusions per step (profiler / HLO); implies --memory",
    )
    r.add_argument(
        "--memory",
        action="store_true",
        help="measure what each step holds in memory: the tensors saved for the backward (against the cost model, "
        "byte for byte) and the peak above inputs and weights, each with its source",
    )
    r.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay torch steps on CUDA from a CUDA graph (launch overhead out; each row says whether it was "
        "captured); JAX steps keep XLA's own command buffers",
    )
    r.add_argument(
        "--trace", action="store_true", help="also write a Chrome/Perfetto trace per backend (implies --profile)"
    )
