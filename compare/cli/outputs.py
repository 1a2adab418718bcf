"""The one ending of every command that writes a results document (``run``, ``profile``, ``sweep``, ``report``,
``tp-collect``): plots, ``results.json`` and the report (``REPORT.md`` and ``DETAILS.md``), each written
atomically, here only (:func:`write_outputs`). An interrupted run never replaces an earlier run's ``results.json``
that holds cells it lacks (``compare.run.store.never_fewer``): its document then goes to
``results.interrupted.json``, ``REPORT.interrupted.md`` and ``DETAILS.interrupted.md`` beside it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from compare.formats.atomic import write_text_atomic
from compare.report import render
from compare.results import document
from compare.results.document import Results
from compare.run.store import never_fewer


@dataclasses.dataclass(frozen=True)
class Written:
    """What :func:`write_outputs` wrote: the document as written (its ``plots`` set when plotted), the results file
    (None: not asked for) and the report, and whether an earlier ``results.json`` was kept (the document then went to
    ``results.interrupted.json``)."""

    doc: Results
    results: Path | None
    report: Path
    kept: bool


def write_outputs(
    out: Path,
    doc: Results,
    *,
    plots: bool = False,
    results: bool = True,
    keep_fuller: bool | None = None,
    report_path: Path | None = None,
) -> Written:
    """Write, in the folder ``out``, the plots (``plots``: PNGs under ``out/plots``, their paths relative to ``out``
    in the document; a plot that fails is a warning, never lost results), ``results.json`` (``results``) and
    ``REPORT.md`` with ``DETAILS.md`` beside it (or the report at ``report_path``, its details beside it).
    ``keep_fuller`` (default: the document is ``interrupted``): an existing ``results.json`` holding cells ``doc``
    lacks is kept, and ``doc`` goes to ``results.interrupted.json`` with ``REPORT.interrupted.md``. A failed write
    raises ``OSError`` (the caller says what is kept where)."""
    target, md = out / "results.json", out / "REPORT.md"
    fuller = doc.interrupted if keep_fuller is None else keep_fuller
    kept = results and fuller and never_fewer(target, doc) is None
    if kept:
        target, md = out / "results.interrupted.json", out / "REPORT.interrupted.md"
    if plots:
        from compare.report.plots import render_plots

        try:
            paths = render_plots(doc, out / "plots")
        except Exception as exc:  # plots are a convenience: never lose the results over them
            print(f"warning: no plots: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            doc = dataclasses.replace(doc, plots=tuple(p.relative_to(out).as_posix() for p in paths))
    if results:
        document.write_json(target, doc)
    md = report_path or md
    details = md.with_name(md.name.replace("REPORT", "DETAILS") if "REPORT" in md.name else f"{md.stem}.details.md")
    for name, text in render.files(doc, md.name, details.name).items():  # the one page, and the rest beside it
        write_text_atomic(md.with_name(name), text)
    return Written(doc, target if results else None, md, kept)
