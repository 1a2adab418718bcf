"""``--history DIR`` on ``run``, ``profile`` and ``sweep`` (a finished run appends itself: ``compare.results.history``)
and ``python -m compare history DIR``, which shows one machine's cells over the entries with the regressions flagged
(``compare.report.history``, whose docstring states the rule)."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare.cli.args import check_out, out_arg, sub
from compare.formats.atomic import write_bytes_atomic, write_text_atomic
from compare.problem.cases import InputError
from compare.report import history as view
from compare.results import history
from compare.results.document import Results
from compare.run import exitcodes, preflight

#: The name of the table and of the plot in the ``--out`` folder.
TABLE, PLOT = "HISTORY.md", "history.png"

#: The exit status of ``history``, in its help.
HISTORY_EXIT = """\
Exit status: 0 when no cell's newest point is flagged slower, 1 when one is (as `diff` exits on a regression), 2 on
bad input (no such folder, no entry in it, an unknown --machine: the known ones are listed), 3 on an internal error.
"""


@dataclass(frozen=True)
class Target:
    """Where a run appends itself (``--history``), its folder checked before anything is measured, and the code that
    runs (its commit, collected then)."""

    folder: Path
    source: history.Source


def add_history_arg(p: argparse.ArgumentParser) -> None:
    """``--history DIR`` on a command that writes a results document."""
    p.add_argument(
        "--history",
        metavar="DIR",
        help="append the finished run (its results.json, the machine, the commit, the package versions) to the history "
        "folder DIR; `python -m compare history DIR` shows it (an interrupted run appends nothing)",
    )


def target(a: argparse.Namespace) -> Target | None:
    """The checked ``--history`` of parsed arguments (None: not asked for); a folder that cannot take an entry is an
    :class:`InputError` (exit 2), before anything is measured."""
    if getattr(a, "history", None) is None:
        return None
    folder = preflight.check_history(Path(check_out(a.history, "--history")))
    return Target(folder, history.source())


def record(t: Target | None, doc: Results, kind: str) -> None:
    """Append the written, finished document ``doc`` to the history (nothing without a target): :func:`record_entry`."""
    if t is not None:
        record_entry(t, history.entry(doc, kind, t.source))


def record_entry(t: Target, e: history.Entry) -> None:
    """Append ``e`` to the history; a failed write is :class:`~compare.run.exitcodes.WriteFailed` (exit 4): the run's
    own files are written by then."""
    try:
        path = history.write(t.folder, e)
    except OSError as exc:
        raise exitcodes.WriteFailed(
            f"cannot append the run to the history {t.folder} ({exc.strerror or exc}): its results and report are "
            "written; free space and run it again to record it"
        ) from exc
    print(f"appended to the history: {path}")


def cmd_history(a: argparse.Namespace) -> int:
    """Read the entries of ``a.folder`` (a file that is not one is named on stderr and skipped), pick the machine,
    write ``HISTORY.md`` and ``history.png`` into ``--out`` (default: ``<folder>/report``) and print the table's
    path; 1 when a cell's newest point is flagged slower, else 0."""
    folder = Path(a.folder)
    if not folder.is_dir():
        raise InputError(f"history folder {folder} does not exist or is not a folder")
    read = history.read(folder)
    for _, why in read.skipped:
        print(f"skipped {why}", file=sys.stderr)
    entries = [e for _, e in read.entries]
    found = view.machines(entries)
    if not found:
        raise InputError(
            f"no history entries in {folder}: `python -m compare run --history {folder}` appends one per run"
        )
    machine = view.pick(found, a.machine)
    for m, n in found:
        mark = "  <- shown" if m.key == machine.key else ""
        print(f"machine {m.key}: {view.count(n, 'entry', 'entries')} ({m.label()}){mark}")
    h = view.build(entries, machine)
    out = preflight.prepare_out_dir(Path(a.out) if a.out else folder / "report")
    with preflight.lock_folder(out, shlex.join(a.argv)):
        try:
            png = view.plot_png(h)
        except Exception as exc:  # a plot is a convenience: never lose the table over it
            print(f"warning: no plot: {type(exc).__name__}: {exc}", file=sys.stderr)
            png = None
        if png is not None:
            write_bytes_atomic(out / PLOT, png)
        text = view.markdown(h, found, PLOT if png is not None else None, [why for _, why in read.skipped])
        write_text_atomic(out / TABLE, text)
    bad = h.regressions
    sizes = f"{view.count(len(h.entries), 'entry', 'entries')}, {view.count(len(h.cells), 'cell', 'cells')}"
    print(f"wrote {out / TABLE}: {sizes}, {len(bad)} with the newest point flagged slower")
    for c in bad:
        print(f"  slower: {c.title()} at entry #{c.newest.entry + 1} ({h.entries[c.newest.entry].source.short()})")
    return exitcodes.FINDING if bad else exitcodes.OK


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``history`` on an ``argparse`` subparsers object."""
    p = sub(
        subparsers,
        "history",
        help="one machine's cells over the runs appended by --history, regressions flagged; exit 1 on a new one",
        description=f"{view.__doc__}\n{HISTORY_EXIT}",
    )
    p.add_argument("folder", help="the history folder (what --history DIR appended to)")
    p.add_argument(
        "--machine",
        metavar="KEY",
        help="the machine to show, by its key or a prefix of it (default: the one with most entries; each is listed)",
    )
    p.add_argument("--out", type=out_arg, help="where to write HISTORY.md and history.png (default: FOLDER/report)")
    p.set_defaults(fn=cmd_history)
    return p
