"""``python -m compare``: a thin command line over typed functions (list, run, report)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compare.backends.registry import BACKENDS, spec
from compare.cli import ab as ab_command
from compare.cli import cache as cache_command
from compare.cli import gpu_build
from compare.cli import history as history_command
from compare.cli import run as run_command
from compare.cli import sweep as sweep_command
from compare.cli.args import (
    add_case_args,
    add_grid_args,
    cases_from_args,
    check_cases,
    check_grid_args,
    check_inputs,
    out_arg,
    sub,
)
from compare.cli.outputs import write_outputs
from compare.cost.comm import check_world_size
from compare.formats.atomic import write_text_atomic
from compare.problem.cases import (
    DTYPES,
    MODEL_ABOUT,
    MODELS,
    MODES,
    MODULE_MODEL,
    MOE_MODELS,
    PRESETS,
    InputError,
    check_finite,
    check_name,
    check_unique,
)
from compare.report import diff, export
from compare.results import document
from compare.results.memory import parse_size
from compare.run import exitcodes, harness, parity_cache, preflight, stop, tp_hosts
from compare.run.options import RunOptions
from compare.run.store import CELLS, JSONL, cell_key, is_older_run, is_store, load_sweep, read_store
from compare.run.tp_launch import Job
from compare.run.tp_worker import Cell
from compare.timing.significance import ALPHA, NOISE_K, THRESHOLD


def cmd_list(_: argparse.Namespace) -> int:
    print("models:")
    for m in MODELS + MOE_MODELS:
        print(f"  {m:12s} {MODEL_ABOUT[m]}")
    print(f"  {MODULE_MODEL:12s} your own MLP: run --module FILE.py (torch_module and jax_function; see README)")
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

    from compare.problem import datacache
    from compare.run.cell import plain_reference

    cases = cases_from_args(a)
    modes = check_unique("mode", [check_name("mode", m, MODES) for m in a.mode])
    if datacache.folder() is None:
        raise InputError(
            f"the data cache is off (${datacache.ENV}=off): there is nowhere to keep what prepare computes"
        )
    preflight.check_memory(cases)
    check_cases(a, cases)
    backward = any(m != "fwd" for m in modes)
    for case in cases:
        stop.check()
        t0 = time.monotonic()
        plain = plain_reference(case, backward=backward)
        harness.case_resolution(case, plain, modes)
        print(f"prepared {case.name} ({', '.join(modes)}) in {time.monotonic() - t0:.1f} s", flush=True)
    if a.parity:
        _prepare_parity(cases, modes)
    print(cache_command.use_line(cache_command.use_record()) or f"data cache: {datacache.folder()}")
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
    doc = harness.run(cases, specs, modes, RunOptions(profile=True, memory=True, reuse_parity=True))
    for r in doc.results:
        how = "found in the cache" if "parity_cache" in r.extras else "judged now"
        kept = "" if r.status in parity_cache.KEPT else f", not kept: {r.reason}"
        print(f"interpreted parity: {r.backend} {r.case} {r.mode}: {r.status} ({how}{kept})", flush=True)
    print(f"interpreted parity of {', '.join(s.name for s in specs)} in {time.monotonic() - t0:.1f} s")


def cmd_report(a: argparse.Namespace) -> int:
    """Rebuild REPORT.md and DETAILS.md from a results.json, a sweep's results.jsonl, a run's cells.jsonl or a folder
    holding them (AB.md from an ab.json, or a folder with one and none of those); measures nothing. A folder's
    report comes from the newest run there: its store's (``cells.jsonl`` is emptied when a run starts). Its
    results.json is rendered only when it is that run's own summary (the same run id, every stored cell); otherwise
    (a run or sweep killed before it wrote its summary, a full disk, a results.json of an older run) results.json is
    rebuilt from the store and the output line says so; an earlier run's results.json holding cells the store lacks
    is kept, and the store's document goes to results.interrupted.json with REPORT.interrupted.md."""
    path = Path(a.results)
    folder = path if path.is_dir() else path.parent
    out = Path(a.out) if a.out else None
    if not path.exists():  # before any folder or lock file is made for it
        raise InputError(f"results file {path} does not exist")
    ab = ab_command.ab_file(path)
    if ab is not None:
        return ab_command.rebuild(ab, out)
    preflight.check_file_writable(out or folder / "REPORT.md")
    with preflight.lock_folder(out.parent if out else folder, shlex.join(a.argv)):
        doc, rebuild, why = _report_source(path)
        if a.device_memory:  # the report's fit against this device memory
            size = parse_size(a.device_memory, "--device-memory")
            doc = dataclasses.replace(doc, config=dataclasses.replace(doc.config, device_memory=size))
        written = write_outputs(folder, doc, results=rebuild, keep_fuller=True, report_path=out)
    if written.results is not None:
        print(f"wrote {written.results} ({why}: {doc.summary()})")
    print(f"wrote {written.report}" + (f" ({why})" if why else ""))
    return exitcodes.OK


def _report_source(path: Path) -> tuple[document.Results, bool, str]:
    """The document ``report`` renders, whether to rebuild the folder's results file from a store first, and where
    the document came from when that is not the file asked for ("": it is). A rebuilt document goes to
    results.interrupted.json where the folder's results.json holds cells it lacks (``write_outputs``)."""
    if path.is_dir():
        if (path / JSONL).is_file():
            doc = load_sweep(path)
            return doc, True, f"rebuilt from the sweep's store {path / JSONL}"
        if (path / CELLS).is_file() and is_store(path / CELLS):
            stored = read_store(path / CELLS)
            target = path / "results.json"
            why = f"rebuilt from the store {path / CELLS}, run {stored.run_id or '(no id)'}"
            if target.is_file():
                old = document.read_json(target)
                mine, theirs = {cell_key(r) for r in stored.results}, {cell_key(r) for r in old.results}
                older = is_older_run(old, stored)
                if not older and not mine - theirs:
                    return old, False, ""  # the same run, every stored cell: the run's own summary
                if older:  # the store's run started after it: never render the older document silently
                    why += f"; {target} was an older run's ({old.run_id or 'no run id'}, created {old.created or '?'})"
                if theirs - mine:  # an earlier run's cells the store lacks: never replaced by fewer
                    why += ", kept: it holds cells this run lacks"
            return stored, True, why
        return document.read_json(path / "results.json"), False, ""
    if path.suffix == ".jsonl":
        return (read_store(path), False, "") if is_store(path) else (load_sweep(path), False, "")
    return document.read_json(path), False, ""


def cmd_tp_job(a: argparse.Namespace) -> int:
    """Write a multi-host tensor-parallel job (``compare.run.tp_hosts``) and print the command for each host."""
    check_grid_args(a)
    cases = cases_from_args(a)  # once: a --weights file is read and hashed here
    check_inputs(a, cases)
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
    check_cases(a, cases)
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
        doc = document.load(tp_hosts.collect(folder), str(folder / "rank0.jsonl"))
        written = write_outputs(out, doc)
    print(f"wrote {written.results} and {written.report} ({doc.summary()})")
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
    # a results.json, a run's or sweep's folder or store: the document ``report`` would render
    old_doc, new_doc = _report_source(Path(a.old))[0], _report_source(Path(a.new))[0]
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


def cmd_export(a: argparse.Namespace) -> int:
    """Write the cells of a results.json, a store or a folder (as ``report`` reads them) as CSV, one row per cell
    (``compare.report.export``), to ``--out`` or standard output; measures nothing and writes nothing else."""
    if a.out:
        preflight.check_file_writable(Path(a.out))
    doc, _, _ = _report_source(Path(a.results))
    text = export.to_csv(doc)
    if a.out:
        write_text_atomic(a.out, text)
        print(f"wrote {a.out} ({len(doc.results)} rows)")
    else:
        print(text, end="")
    return exitcodes.OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = p.add_subparsers(dest="command", required=True)
    sub(subs, "list", help="presets and backends, with whether each can run here").set_defaults(fn=cmd_list)
    r = sub(subs, "run", help="run backends on a case; write results.json and REPORT.md")
    run_command.add_run_args(r)
    r.set_defaults(fn=run_command.cmd_run)
    prof = sub(subs, "profile", help="like run, plus kernel counts and a Chrome/Perfetto trace per backend")
    run_command.add_run_args(prof)
    prof.set_defaults(fn=run_command.cmd_run, trace=True, profile=True)
    prep = sub(
        subs,
        "prepare",
        help="compute and cache the golden reference, plain computation and gate resolution (measures nothing)",
    )
    add_case_args(prep)
    prep.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    prep.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    prep.add_argument("--seed", type=int, default=0, help="seed of the golden data (a non-negative integer)")
    prep.add_argument(
        "--parity",
        action="store_true",
        help="also judge the backends this machine runs interpreted (parity only) and keep their verdicts in the "
        "interpreted-parity cache, which later runs reuse",
    )
    cache_command.add_data_cache_arg(prep)
    prep.set_defaults(fn=cmd_prepare)
    rep = sub(
        subs,
        "report",
        help="rebuild REPORT.md and DETAILS.md from a results.json, a run's store or its folder, or AB.md from an "
        "ab.json (measures nothing)",
    )
    rep.add_argument("results")
    rep.add_argument(
        "--out", type=out_arg, help="where to write (default: REPORT.md and DETAILS.md beside the results)"
    )
    rep.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="fit each backend's measured memory against this device memory (e.g. 80GiB): the largest token count "
        "that fits (default: the sweep's own --device-memory, if it had one)",
    )
    rep.set_defaults(fn=cmd_report)
    job = sub(subs, "tp-job", help="write a tensor-parallel job to run across hosts; print each host's command")
    add_case_args(job)
    add_grid_args(job, budget_help="seconds of timed samples per backend and mode")
    job.add_argument("--world-size", type=int, required=True, help="processes, one per host (must divide hidden)")
    job.add_argument("--addr", required=True, help="the rendezvous host (process 0's address, reachable by all)")
    job.add_argument("--port", type=int, default=29400, help="the rendezvous port (default: %(default)s)")
    job.add_argument("--threads", type=int, default=1, help="compute threads per process (default: 1)")
    job.add_argument("--out", required=True, help="the job folder (the same path on every host)")
    job.set_defaults(fn=cmd_tp_job)
    col = sub(subs, "tp-collect", help="results.json and REPORT.md of a tp-job, on process 0's host")
    col.add_argument("folder", help="the job folder")
    col.add_argument("--out", type=out_arg, help="where to write (default: the job folder)")
    col.set_defaults(fn=cmd_tp_collect)
    sweep_command.add_parser(subs)
    dif = sub(
        subs,
        "diff",
        help="compare two results.json; exit 1 on a performance, parity or memory regression",
        description=f"{diff.__doc__}\n{DIFF_EXIT}",
    )
    dif.add_argument("old", help="the baseline: a results.json, a run's or sweep's store, or its folder")
    dif.add_argument("new", help="the results to judge: a results.json, a store, or a folder")
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
    exp = sub(subs, "export", help="the cells of a results.json (or a run's folder) as flat rows, for spreadsheets")
    exp.add_argument("results", help="a results.json, a run's or sweep's store, or its folder")
    exp.add_argument("--csv", action="store_true", help="CSV, one row per cell: the one format, so the default")
    exp.add_argument("--out", help="write here instead of standard output")
    exp.set_defaults(fn=cmd_export)
    history_command.add_parser(subs)  # python -m compare history DIR [--machine KEY] [--out FOLDER]
    ab_command.add_parser(subs)  # python -m compare ab --a PYTHON --b PYTHON ...
    gpu_build.add_parser(subs)  # python -m compare gpu-build --arch sm_90 sm_80 [--out DIR]
    cache_command.add_parser(subs)  # python -m compare cache [--trim | --clear]
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compare``: the exit status is one of :mod:`compare.run.exitcodes` (see ``--help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    # the command as recorded (lock, results, history): bytes that are not UTF-8 as \xff escapes; a path or an
    # environment value keeps its bytes where it is used (Python's surrogateescape)
    a.argv = [os.fsencode(x).decode("utf-8", "backslashreplace") for x in argv]
    for stream in (sys.stdout, sys.stderr):  # a message naming such a path prints it escaped, never raises
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    return exitcodes.exit_status(lambda: cache_command.run_in_scope(a))
