"""``python -m compare``: a thin command line over typed functions (list, run, report)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compare.backends.registry import BACKENDS, spec
from compare.backends.tp import LAUNCHES
from compare.cost.comm import check_world_size
from compare.formats.atomic import write_text_atomic
from compare.gpu_build import command as gpu_build
from compare.problem.cases import (
    DTYPES,
    MODEL_ABOUT,
    MODELS,
    MODES,
    PRESETS,
    Case,
    InputError,
    check_finite,
    check_name,
    check_seed,
    check_unique,
    preset,
    resolve_shape,
)
from compare.problem.shape_cases import case_for_tokens
from compare.report import diff
from compare.report import render as report
from compare.results import document as results
from compare.results import gpu_build as gpu_build_layout
from compare.results import load as machine_load
from compare.results.memory import parse_size
from compare.run import exitcodes, harness, parity_cache, preflight, shape_sweep, stop, tp_hosts
from compare.run.budget import Budget, budget_phase
from compare.run.options import add_grid_args, check_grid_args, check_inputs, out_arg
from compare.run.progress import Display, progress_level
from compare.run.store import CELLS, RunStore, cell_key, is_older_run, is_store, never_fewer, read_store
from compare.run.tp_launch import Job
from compare.run.tp_worker import Cell
from compare.sweep import command as sweep
from compare.sweep import store as sweep_store
from compare.timing import nvml
from compare.timing.significance import ALPHA, NOISE_K, THRESHOLD


def cmd_list(_: argparse.Namespace) -> int:
    print("models:")
    for m in MODELS:
        print(f"  {m:12s} {MODEL_ABOUT[m]}")
    print("presets:")
    for p in PRESETS.values():
        print(f"  {p.name:12s} {p.model:8s} {p.shape.label():22s} {p.dist:10s} {p.about}")
    print("backends:")
    for s in BACKENDS.values():
        a = s.availability()
        interp = "" if a.timed else " (interpreted: parity only, not timed)"
        state = ("available" + interp) if a.ok else "unavailable"
        reason = f": {a.reason}" if a.reason else ""
        print(f"  {s.name:20s} {state}{reason}  [{s.about}; models: {', '.join(s.models)}]")
    return 0


def cases_from_args(a: argparse.Namespace) -> list[Case]:
    base = preset(a.preset) if a.preset else None
    model = check_name("model", a.model, MODELS) if a.model else (base.model if base else None)
    if model is None:
        raise InputError(f"give --preset or --model; known models: {', '.join(MODELS)}")
    shape = resolve_shape(base.shape if base else None, a.batch, a.seq, a.dim, a.hidden)
    dist = base.dist if base else "normal"
    dtypes = check_unique("dtype", [check_name("dtype", d, DTYPES) for d in a.dtype])
    return [Case(model, shape, d, dist, check_seed(a.seed)) for d in dtypes]


def cmd_run(a: argparse.Namespace) -> int:
    """Check every argument, the memory the cases need, the golden files and the output folder; then measure and
    write results.json and REPORT.md (atomically). Interrupted (Ctrl-C, SIGTERM), it saves what finished: 130."""
    check_grid_args(a)
    check_inputs(a, cases_from_args(a))
    cases = cases_from_args(a)
    specs = [spec(b) for b in a.backend]
    modes = [check_name("mode", m, MODES) for m in a.mode]
    world_sizes = [int(w) for w in check_unique("--world-size", [str(w) for w in a.world_size])]
    for w in world_sizes:
        for c in cases:
            if w > 1 or any(s.runtime for s in specs):
                check_world_size(c, w)
    if a.tp_launch is not None:
        check_name("--tp-launch", a.tp_launch, list(LAUNCHES))
    sweep_cases: list[Case] = []
    if a.shape_sweep:
        for t in a.shape_sweep:
            if t <= 0:
                raise InputError(f"--shape-sweep token counts must be positive integers, got {t}")
        check_unique("--shape-sweep token count", [str(t) for t in a.shape_sweep])
        sweep_cases = [case_for_tokens(c, t) for c in cases for t in a.shape_sweep]
    preflight.check_memory([*cases, *sweep_cases])
    preflight.check_golden(cases)
    out = preflight.prepare_out_dir(Path(a.out))
    cfg = harness.TimingConfig(budget_s=a.budget)
    config = {
        "command": "python -m compare " + shlex.join(a.argv),
        "preset": a.preset,
        "backends": a.backend,
        "dtypes": a.dtype,
        "modes": modes,
        "world_sizes": world_sizes,
    }
    with preflight.lock_folder(out, shlex.join(a.argv)), stop.on_signals():
        return _run_locked(a, _Plan(cases, specs, modes, cfg, config, out))


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What ``run`` measures, every part of it checked: the cases, backends and modes, the timer's settings, the
    config the results document records, and the (locked) output folder."""

    cases: list[Case]
    specs: list[Any]
    modes: list[str]
    cfg: harness.TimingConfig
    config: dict[str, Any]
    out: Path


def _run_locked(a: argparse.Namespace, plan: _Plan) -> int:
    """``cmd_run`` once the folder is locked and the signals set a flag: measure into the store (``cells.jsonl``),
    then write results.json and REPORT.md from the document, never replacing an earlier run's results.json with
    fewer cells when interrupted (the interrupted run's document then goes to ``results.interrupted.json``)."""
    out = plan.out
    try:
        store = RunStore(out, plan.config)
    except OSError as exc:
        raise InputError(f"cannot write the store {out / CELLS}: {exc.strerror or exc}") from exc
    with store:
        try:
            doc = _measure(a, plan, store)
        except OSError as exc:  # the store could not take a cell: the disk is full (or gone)
            raise exitcodes.WriteFailed(
                f"cannot append to {store.path} ({exc.strerror or exc}): its {store.cells} finished cells are kept; "
                f"free space and run `python -m compare report {out}`: it rebuilds results.json and REPORT.md from "
                f"this run's store (run {store.run_id}), not from an older run's results.json there"
            ) from exc
        doc = dataclasses.replace(doc, run_id=store.run_id)
        with contextlib.suppress(OSError):  # the load and the end mark only tell a rebuild more
            if doc.load is not None:
                store.load(doc.load)
            if not doc.interrupted:
                store.end()
    build = _gpu_build_table(Path(a.gpu_build)) if a.gpu_build else None
    if build is not None:
        doc = dataclasses.replace(doc, gpu_build=build)
    interrupted = doc.interrupted
    target, report_path = out / "results.json", out / "REPORT.md"
    if interrupted and never_fewer(target, doc) is None:
        target, report_path = out / "results.interrupted.json", out / "REPORT.interrupted.md"
        print(f"kept the earlier run's {out / 'results.json'}: it holds cells this interrupted run did not reach",
              file=sys.stderr)  # fmt: skip
    try:
        if not a.no_plots and not interrupted:
            from compare.report.plots import render_plots

            plots = render_plots(doc, out / "plots")
            doc = dataclasses.replace(doc, plots=tuple(p.relative_to(out).as_posix() for p in plots))
        results.write_json(target, doc)
        write_text_atomic(report_path, report.render(doc))
    except OSError as exc:
        raise exitcodes.WriteFailed(
            f"cannot write {target.name} and {report_path.name} in {out} ({exc.strerror or exc}): the "
            f"{store.cells} finished cells are in {store.path}; free space and run `python -m compare report {out}`: "
            f"it rebuilds them from this run's store (run {store.run_id}), not from an older run's results.json there"
        ) from exc
    if interrupted:
        print(
            f"interrupted: saved {len(doc.results)} finished cells to {target} and {report_path} "
            f"({stop.requested() or 'Ctrl-C'}; the store {store.path} holds {store.cells})",
            file=sys.stderr,
        )
        return exitcodes.INTERRUPTED
    print(f"wrote {target} and {report_path} ({doc.summary()})")
    return exitcodes.of_statuses((r.status for r in doc.results), a.strict)


def _measure(a: argparse.Namespace, plan: _Plan, store: RunStore) -> results.Results:
    """The measurements of ``run``: the harness, then the shape sweep unless the harness was interrupted; every
    finished cell goes into ``store`` as it finishes.

    ``harness.run`` returns the finished results with ``interrupted`` set when interrupted; an interrupt
    during the shape sweep keeps the harness's results and drops the sweep's.
    """
    cases, out = plan.cases, plan.out
    cells = len(cases) * len(plan.modes) * len(plan.specs) * len(a.world_size)
    budget = Budget(a.time_budget) if a.time_budget is not None else None
    deadline = budget.deadline() if budget is not None else None
    device = nvml.open_device()  # GPU telemetry over every timed window, where NVML sees a GPU
    if isinstance(device, nvml.Unavailable):
        watch, telemetry = None, f"no GPU telemetry: {device.reason}"
    else:
        opened = device
        watch, telemetry = (lambda: nvml.NvmlWatch(opened)), f"NVML on {device.name()}"
    with Display(cells, progress_level(a), title="run", deadline=deadline) as display:
        sampler = machine_load.start()  # the machine's load over the measurements (compare.results.load)
        if not any(s.runtime for s in plan.specs):  # one group per case and mode (tensor-parallel jobs are not)
            left = budget
            display.plan(
                len(cases) * len(plan.modes),
                (lambda: left.part("shape_sweep")) if left is not None and a.shape_sweep else None,
            )
        doc = harness.run(
            cases,
            plan.specs,
            plan.modes,
            plan.cfg,
            plan.config,
            progress=display,
            profile=a.profile or a.trace,
            trace_dir=out / "traces" if a.trace else None,
            ceilings=not a.no_ceilings,
            world_sizes=[int(w) for w in a.world_size],
            tp_launch=a.tp_launch,
            tp_logs=out / "tp-logs",
            store=store,
            cache=a.cache,
            budget=budget,
            reuse_parity=not a.no_parity_cache,
            watch=watch,
            cuda_graphs=a.cuda_graphs,
            memory=a.memory or a.profile or a.trace,
        )
        doc = dataclasses.replace(doc, telemetry=telemetry, load=sampler.stop())
        if a.shape_sweep and not doc.interrupted:
            swept, tokens, per_shape, deadline = cases, list(a.shape_sweep), a.budget, None
            if budget is not None:
                swept, tokens, per_shape, share = shape_sweep.budgeted_sweep(cases, tokens, a.budget, budget)
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


def cmd_prepare(a: argparse.Namespace) -> int:
    """Compute, and keep in the disk cache of data that is a pure function of the case (``compare.problem.datacache``),
    what a run computes first for each case: the golden reference, the plain computation and the gate's resolution,
    for the modes given (the same functions and cache entries as ``run``'s). Deterministic, the same bits on every
    machine; it measures nothing. On ``cpu-mlp`` each dtype takes tens of seconds on a 2-core CPU: ``make setup`` runs
    it for the default report's cases, so that ``make report`` spends its time measuring.

    With ``--parity`` it also judges the backends this machine runs interpreted (parity only: Triton under
    ``TRITON_INTERPRET=1``, Pallas with ``interpret=True``) on the cases and modes, as ``run --profile`` does (first
    call, fresh inputs, profile, memory), and keeps their verdicts in ``compare.run.parity_cache``: a later run on
    the same code, case, versions and CPU reuses them and its report says so. A verdict already there is kept."""
    import time

    from compare.problem import datacache
    from compare.run.cell import plain_reference

    cases = cases_from_args(a)
    modes = check_unique("mode", [check_name("mode", m, MODES) for m in a.mode])
    if datacache.folder() is None:
        raise InputError(
            f"the data cache is off (${datacache.ENV}=off): there is nowhere to keep what prepare computes"
        )
    preflight.check_memory(cases)
    backward = any(m != "fwd" for m in modes)
    for case in cases:
        stop.check()
        t0 = time.monotonic()
        plain = plain_reference(case, backward=backward)
        harness.case_resolution(case, plain, modes)
        print(f"prepared {case.name} ({', '.join(modes)}) in {time.monotonic() - t0:.1f} s", flush=True)
    if a.parity:
        _prepare_parity(cases, modes)
    print(f"data cache: {datacache.folder()}")
    return exitcodes.OK


def _prepare_parity(cases: Sequence[Any], modes: list[str]) -> None:
    """``prepare --parity``: the interpreted backends' verdicts on ``cases`` into the interpreted-parity cache, each
    printed with whether it was judged now or found there. An error is printed and not kept (a run judges it again)."""
    found = [(s, s.availability()) for s in BACKENDS.values() if not s.runtime]
    specs = [s for s, av in found if av.ok and not av.timed]
    if not specs:
        print("interpreted parity: no backend runs interpreted here (each is timed, so each run judges it)")
        return
    t0 = time.monotonic()
    doc = harness.run(cases, specs, modes, profile=True, memory=True, reuse_parity=True)
    for r in doc.results:
        how = "found in the cache" if "parity_cache" in r.extras else "judged now"
        kept = "" if r.status in parity_cache.KEPT else f", not kept: {r.reason}"
        print(f"interpreted parity: {r.backend} {r.case} {r.mode}: {r.status} ({how}{kept})", flush=True)
    print(f"interpreted parity of {', '.join(s.name for s in specs)} in {time.monotonic() - t0:.1f} s")


def cmd_report(a: argparse.Namespace) -> int:
    """Rebuild REPORT.md from a results.json, a sweep's results.jsonl, a run's cells.jsonl or a folder holding
    them; measures nothing. A folder's report comes from the newest run there: its store's (``cells.jsonl`` is
    emptied when a run starts). Its results.json is rendered only when it is that run's own summary (the same run id,
    every stored cell); otherwise (a run or sweep killed before it wrote its summary, a full disk, a results.json of
    an older run) results.json is rebuilt from the store and the output line says so; an earlier run's
    results.json holding cells the store lacks is kept, and the store's document goes to results.interrupted.json
    with REPORT.interrupted.md."""
    path = Path(a.results)
    folder = path if path.is_dir() else path.parent
    default_out = folder / "REPORT.md"
    out = Path(a.out) if a.out else default_out
    preflight.check_file_writable(out)
    with preflight.lock_folder(out.parent, shlex.join(a.argv)):
        doc, rebuilt, why = _report_source(path)
        if rebuilt is not None:
            results.write_json(rebuilt, doc)
            print(f"wrote {rebuilt} ({why}: {doc.summary()})")
            if rebuilt.name == "results.interrupted.json" and not a.out:
                out = folder / "REPORT.interrupted.md"
        if a.device_memory:  # the report's fit against this device memory (results.json is left as it is)
            size = parse_size(a.device_memory, "--device-memory")
            doc = dataclasses.replace(doc, config=dataclasses.replace(doc.config, device_memory=size))
        write_text_atomic(out, report.render(doc))
    print(f"wrote {out}" + (f" ({why})" if why else ""))
    return exitcodes.OK


def _report_source(path: Path) -> tuple[results.Results, Path | None, str]:
    """The document ``report`` renders, the results file to rebuild from a store first (None: none), and where the
    document came from when that is not the file asked for ("": it is)."""
    if path.is_dir():
        if (path / sweep_store.JSONL).is_file():
            doc = sweep_store.load_sweep(path)
            why = f"rebuilt from the sweep's store {path / sweep_store.JSONL}"
            return doc, path / "results.json" if never_fewer(path / "results.json", doc) is doc else None, why
        if (path / CELLS).is_file() and is_store(path / CELLS):
            stored = read_store(path / CELLS)
            target = path / "results.json"
            why = f"rebuilt from the store {path / CELLS}, run {stored.run_id or '(no id)'}"
            if target.is_file():
                old = results.read_json(target)
                mine, theirs = {cell_key(r) for r in stored.results}, {cell_key(r) for r in old.results}
                older = is_older_run(old, stored)
                if not older and not mine - theirs:
                    return old, None, ""  # the same run, every stored cell: the run's own summary
                if older:  # the store's run started after it: never render the older document silently
                    why += f"; {target} was an older run's ({old.run_id or 'no run id'}, created {old.created or '?'})"
                if theirs - mine:  # an earlier run's cells the store lacks: never replaced by fewer (never_fewer)
                    return stored, path / "results.interrupted.json", why + ", kept: it holds cells this run lacks"
            return stored, target, why
        return results.read_json(path / "results.json"), None, ""
    if path.suffix == ".jsonl":
        return (read_store(path), None, "") if is_store(path) else (sweep_store.load_sweep(path), None, "")
    return results.read_json(path), None, ""


def cmd_tp_job(a: argparse.Namespace) -> int:
    """Write a multi-host tensor-parallel job (``compare.run.tp_hosts``) and print the command for each host."""
    check_grid_args(a)
    check_inputs(a, cases_from_args(a))
    cases = cases_from_args(a)
    specs = [spec(b) for b in a.backend]
    plain = [s.name for s in specs if not s.runtime]
    if plain or len({s.runtime for s in specs}) != 1:
        tp = [n for n, s in BACKENDS.items() if s.runtime]
        raise InputError(
            f"a multi-host job is one worker group: tensor-parallel backends of one framework (known: {', '.join(tp)})"
            + (f"; not {', '.join(plain)}" if plain else "")
        )
    for c in cases:
        check_world_size(c, a.world_size)
    modes = [check_name("mode", m, MODES) for m in a.mode]
    cells = tuple(
        Cell(i, s.name, c, m)
        for i, (c, m, s) in enumerate((c, m, s) for c in cases for m in modes for s in specs if c.model in s.models)
    )
    job = Job(
        specs[0].runtime,
        "processes",
        a.world_size,
        cells,
        tuple(specs),
        harness.TimingConfig(budget_s=a.budget),
        threads_total=a.threads * a.world_size,
    )
    folder = preflight.prepare_out_dir(Path(a.out))
    with preflight.lock_folder(folder, shlex.join(a.argv)):
        lines = tp_hosts.write_job(job, folder, a.addr, a.port)
    for line in lines:
        print(line)
    return exitcodes.OK


def cmd_tp_collect(a: argparse.Namespace) -> int:
    """results.json and REPORT.md of a multi-host job, from process 0's events."""
    folder = Path(a.folder)
    out = preflight.prepare_out_dir(Path(a.out) if a.out else folder)
    with preflight.lock_folder(folder, shlex.join(a.argv)), contextlib.ExitStack() as locks:
        if out.resolve() != folder.resolve():
            locks.enter_context(preflight.lock_folder(out, shlex.join(a.argv)))
        doc = results.load(tp_hosts.collect(folder), str(folder / "rank0.jsonl"))
        results.write_json(out / "results.json", doc)
        write_text_atomic(out / "REPORT.md", report.render(doc))
    print(f"wrote {out / 'results.json'} and {out / 'REPORT.md'} ({doc.summary()})")
    return exitcodes.of_statuses(r.status for r in doc.results)


#: The exit status of ``diff``, after the rules of :mod:`compare.report.diff` in its help.
DIFF_EXIT = """\
Exit status: 0 with no regression (an ambiguous slowdown is listed, not counted), 1 with a performance, parity or
memory regression, 2 on bad input (a missing, unreadable or invalid results file, a bad option, two documents that
share no cell: nothing to compare), 3 on an internal error.
"""


def cmd_diff(a: argparse.Namespace) -> int:
    """Print (or write) the diff; 1 if it found a regression, else 0. Missing or bad files raise InputError."""
    check_finite("--threshold", a.threshold, zero_ok=True)
    check_finite("--k", a.k)
    check_finite("--alpha", a.alpha, at_most=1.0)
    if a.out:
        preflight.check_file_writable(Path(a.out))
    old_doc, new_doc = results.read_json(Path(a.old)), results.read_json(Path(a.new))
    diff.check_shared(old_doc, new_doc, a.old, a.new)
    check_finite("--peak-tolerance", a.peak_tolerance, zero_ok=True)
    tolerance = parse_size(a.memory_tolerance, "--memory-tolerance")
    md, regression = diff.diff(old_doc, new_doc, a.threshold, a.k, a.alpha, tolerance, a.peak_tolerance)
    if a.out:
        write_text_atomic(a.out, md)
        print(f"wrote {a.out}: {'regression' if regression else 'no regression'}")
    else:
        print(md, end="")
    return exitcodes.FINDING if regression else exitcodes.OK


def _add_case_args(r: argparse.ArgumentParser) -> None:
    """The case options: a preset, its model and sizes."""
    r.add_argument("--preset", help=f"one of: {', '.join(PRESETS)}")
    r.add_argument("--model", help=f"one of: {', '.join(MODELS)} (default: the preset's)")
    for dim in ("batch", "seq", "dim", "hidden"):
        r.add_argument(f"--{dim}", type=int, help=f"override the preset's {dim}")


def _add_run_args(r: argparse.ArgumentParser) -> None:
    """The options shared by ``run`` and ``profile``."""
    _add_case_args(r)
    add_grid_args(r, budget_help="seconds of timed samples per backend and mode")
    r.add_argument("--out", default="out", help="output folder (default: out)")
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


def _sub(sub: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, epilog=exitcodes.EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
    )
    return p


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    _sub(sub, "list", help="presets and backends, with whether each can run here").set_defaults(fn=cmd_list)
    r = _sub(sub, "run", help="run backends on a case; write results.json and REPORT.md")
    _add_run_args(r)
    r.set_defaults(fn=cmd_run)
    prof = _sub(sub, "profile", help="like run, plus kernel counts and a Chrome/Perfetto trace per backend")
    _add_run_args(prof)
    prof.set_defaults(fn=cmd_run, trace=True, profile=True)
    prep = _sub(
        sub,
        "prepare",
        help="compute and cache the golden reference, plain computation and gate resolution (measures nothing)",
    )
    _add_case_args(prep)
    prep.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    prep.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    prep.add_argument("--seed", type=int, default=0, help="seed of the golden data (a non-negative integer)")
    prep.add_argument(
        "--parity",
        action="store_true",
        help="also judge the backends this machine runs interpreted (parity only) and keep their verdicts in the "
        "interpreted-parity cache, which later runs reuse",
    )
    prep.set_defaults(fn=cmd_prepare)
    rep = _sub(sub, "report", help="rebuild REPORT.md from a results.json (measures nothing)")
    rep.add_argument("results")
    rep.add_argument("--out", type=out_arg, help="where to write (default: REPORT.md beside the results)")
    rep.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="fit each backend's measured memory against this device memory (e.g. 80GiB): the largest token count "
        "that fits (default: the sweep's own --device-memory, if it had one)",
    )
    rep.set_defaults(fn=cmd_report)
    job = _sub(sub, "tp-job", help="write a tensor-parallel job to run across hosts; print each host's command")
    _add_case_args(job)
    add_grid_args(job, budget_help="seconds of timed samples per backend and mode")
    job.add_argument("--world-size", type=int, required=True, help="processes, one per host (must divide hidden)")
    job.add_argument("--addr", required=True, help="the rendezvous host (process 0's address, reachable by all)")
    job.add_argument("--port", type=int, default=29400, help="the rendezvous port (default: %(default)s)")
    job.add_argument("--threads", type=int, default=1, help="compute threads per process (default: 1)")
    job.add_argument("--out", required=True, help="the job folder (the same path on every host)")
    job.set_defaults(fn=cmd_tp_job)
    col = _sub(sub, "tp-collect", help="results.json and REPORT.md of a tp-job, on process 0's host")
    col.add_argument("folder", help="the job folder")
    col.add_argument("--out", type=out_arg, help="where to write (default: the job folder)")
    col.set_defaults(fn=cmd_tp_collect)
    sweep.add_parser(sub)
    dif = _sub(
        sub,
        "diff",
        help="compare two results.json; exit 1 on a performance, parity or memory regression",
        description=f"{diff.__doc__}\n{DIFF_EXIT}",
    )
    dif.add_argument("old", help="the baseline results.json")
    dif.add_argument("new", help="the results.json to judge")
    dif.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="smallest relative change that counts (finite, >= 0)"
    )
    dif.add_argument(
        "--k", type=float, default=NOISE_K, help="noise band in units of the combined relative IQR (finite, > 0)"
    )
    dif.add_argument("--alpha", type=float, default=ALPHA, help="significance level of the rank test, in (0, 1]")
    dif.add_argument(
        "--memory-tolerance",
        default=str(diff.MEMORY_TOLERANCE_BYTES),
        help="saved-for-backward bytes more than the old run that still pass (a size: 0, 4096, 1MiB; default 0)",
    )
    dif.add_argument(
        "--peak-tolerance",
        type=float,
        default=diff.PEAK_TOLERANCE,
        help=f"relative peak-memory increase that still passes (finite, >= 0; default {diff.PEAK_TOLERANCE:g})",
    )
    dif.add_argument("--out", help="write the markdown here instead of printing it")
    dif.set_defaults(fn=cmd_diff)
    gpu_build.add_parser(sub)  # python -m compare gpu-build --arch sm_90 sm_80 [--out DIR]
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compare``: the exit status is one of :mod:`compare.run.exitcodes` (see ``--help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    a.argv = argv
    return exitcodes.exit_status(lambda: a.fn(a))
