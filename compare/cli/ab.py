"""``python -m compare ab``: its arguments, checked into the two sides (interpreter, environment variables,
checkout) and one :class:`~compare.run.ab.Plan` (``--workers`` processes a side, sharing the side's ``--budget``);
then the A/B run (``compare.run.ab.run_ab``), ``ab.json`` and ``AB.md`` written into ``--out`` and the summary
printed. Exit 1 on a finding (``compare.report.ab.findings``)."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from compare.backends.registry import spec
from compare.cli import history as history_command
from compare.cli.args import (
    add_case_args,
    add_cell_args,
    cases_from_args,
    check_cases,
    check_cell_args,
    check_inputs,
    sub,
)
from compare.formats.atomic import write_text_atomic
from compare.problem.cases import MODES, InputError, check_name
from compare.report import ab as ab_report
from compare.results import ab as ab_results
from compare.results import environment, history
from compare.results.ab import Side
from compare.run import exitcodes, preflight, stop
from compare.run.ab import WORKERS, Plan, run_ab, side_env
from compare.run.ab_worker import ROOT
from compare.run.store import CELLS, JSONL
from compare.timing.timer import TimingConfig

#: A run's files in a folder: where one is, ``report FOLDER`` renders the run, not an ``ab.json`` beside it.
RUN_FILES = ("results.json", CELLS, JSONL)
#: What an environment variable's name may be (``--a-env NAME=VALUE``).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def side_from_args(a: argparse.Namespace, name: str) -> Side:
    """Side ``name`` (``a`` or ``b``) of the arguments, checked: an interpreter that exists (a path or a command on
    ``PATH``; default: this one), ``NAME=VALUE`` variables, a checkout that holds the A/B worker (default: this one).
    Bad input raises :class:`InputError` naming the option."""
    python = getattr(a, name) or sys.executable
    found = shutil.which(python)
    if found is None:
        raise InputError(
            f"--{name} {python!r}: no such Python interpreter (give its path, e.g. .venv/bin/python, or a command on "
            "PATH)"
        )
    env: dict[str, str] = {}
    for item in getattr(a, f"{name}_env") or []:
        key, eq, value = item.partition("=")
        if not eq or not ENV_NAME.fullmatch(key):
            raise InputError(f"--{name}-env {item!r} is not NAME=VALUE (e.g. OMP_NUM_THREADS=1)")
        env[key] = value
    given = getattr(a, f"{name}_path")
    path = Path(given or ROOT).resolve()
    if not (path / "compare" / "run" / "ab_worker.py").is_file():
        raise InputError(
            f"--{name}-path {given} is not a checkout of fusion-compare that has `ab` (no compare/run/ab_worker.py in "
            "it): give a clone of this project"
        )
    # absolute, not resolved: a virtual environment's python is a link, and the link is the environment
    return Side(name.upper(), str(Path(found).absolute()), str(path), side_env(env))


def cmd_ab(a: argparse.Namespace) -> int:
    """Check every argument, then run both sides and write ``ab.json`` and ``AB.md``; print the summary."""
    check_cell_args(a)
    cases = cases_from_args(a)
    check_inputs(a, cases)
    specs = [spec(b) for b in a.backend]
    parallel = [s.name for s in specs if s.runtime]
    if parallel:
        raise InputError(f"ab compares single-device backends; not the tensor-parallel {', '.join(parallel)}")
    modes = [check_name("mode", m, MODES) for m in a.mode]
    sides = side_from_args(a, "a"), side_from_args(a, "b")
    preflight.check_memory(cases)
    check_cases(a, cases)
    preflight.check_golden(cases)
    out = preflight.prepare_out_dir(Path(a.out))
    keep = history_command.target(a)
    command = "python -m compare " + shlex.join(a.argv)
    if a.workers < 1:
        raise InputError(f"--workers {a.workers}: a side needs one worker at least ({WORKERS} by default)")
    # --budget is a side's: its workers share it, so K workers a side take the timed seconds one did
    plan = Plan(
        tuple(cases), tuple(specs), tuple(modes), TimingConfig(budget_s=a.budget / a.workers), not a.no_profile,
        not a.no_profile, command, a.workers,
    )  # fmt: skip
    with preflight.lock_folder(out, shlex.join(a.argv)), stop.on_signals():
        doc = run_ab(*sides, plan)
    try:
        ab_results.write_json(out / "ab.json", doc)
        write_text_atomic(out / "AB.md", ab_report.render(doc))
    except OSError as exc:
        raise exitcodes.WriteFailed(f"cannot write ab.json and AB.md in {out}: {exc.strerror or exc}") from exc
    for line in ab_report.summary_lines(doc):
        print(line)
    print(f"wrote {out / 'ab.json'} and {out / 'AB.md'}")
    if keep is not None:  # side B, with A as its baseline
        env = environment.current({}, {})
        history_command.record_entry(keep, history.ab_entry(doc, env, ab_report.paired_verdicts(doc)))
    return exitcodes.FINDING if ab_report.findings(doc) else exitcodes.OK


def ab_file(path: Path) -> Path | None:
    """The ``ab.json`` that ``python -m compare report PATH`` renders (an ``ab.json``, or a folder holding one and no
    run's files), or None: PATH is a run's."""
    if path.name == "ab.json":
        return path
    if path.is_dir() and (path / "ab.json").is_file() and not any((path / n).exists() for n in RUN_FILES):
        return path / "ab.json"
    return None


def rebuild(path: Path, out: Path | None) -> int:
    """``AB.md`` again from ``ab.json`` (by this version's rules; measures nothing), beside it or at ``out``."""
    doc = ab_results.read_json(path)
    target = out or path.parent / "AB.md"
    try:
        write_text_atomic(target, ab_report.render(doc))
    except OSError as exc:
        raise exitcodes.WriteFailed(f"cannot write {target}: {exc.strerror or exc}") from exc
    print(f"wrote {target} (from {path})")
    return exitcodes.OK


def add_parser(subs: Any) -> None:
    """``ab``'s parser (``python -m compare ab --help``)."""
    p = sub(
        subs,
        "ab",
        help="time and check the same backends under two interpreters, environments or checkouts, interleaved",
        description="Worker processes (--workers a side), each side's with its own interpreter, environment variables "
        "and checkout (two virtual environments with other torch or jax versions, or two clones of this project at "
        "other commits), all on the same case and golden data; their timing rounds interleaved, each side judged by "
        "the parity gate, B called different only beyond the spread between processes of one side. Writes ab.json "
        "and AB.md into --out; exit 1 when B is slower beyond noise, loses parity, or a side errs.",
    )
    add_case_args(p)
    add_cell_args(p, budget_help="seconds of timed samples per backend and side")
    for name in ("a", "b"):
        side = name.upper()
        p.add_argument(f"--{name}", metavar="PYTHON", help=f"side {side}'s interpreter (default: this one)")
        p.add_argument(
            f"--{name}-env",
            action="extend",
            nargs="+",
            metavar="NAME=VALUE",
            help=f"environment variables of side {side}'s worker, over this one's (e.g. OMP_NUM_THREADS=1)",
        )
        p.add_argument(
            f"--{name}-path",
            metavar="DIR",
            help=f"side {side}'s checkout of fusion-compare: its worker runs there, on its code (default: this one)",
        )
    p.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        metavar="K",
        help=f"worker processes a side, all timed interleaved; a difference is called only beyond the spread between "
        f"one side's processes (default: {WORKERS}; 1 measures no such spread, and nothing within the between-process "
        "floor is called)",
    )
    p.add_argument("--out", default="out/ab", help="output folder (default: out/ab)")
    history_command.add_history_arg(p)
    p.add_argument(
        "--no-profile",
        action="store_true",
        help="leave out the kernel counts and the memory record of each step (faster)",
    )
    p.set_defaults(fn=cmd_ab)
