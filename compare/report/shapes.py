"""The compile-cost sweep's section of the report: ``doc.shape_sweep``'s rows (measured by ``compare.run.shape_sweep``;
schema and payback in ``compare.timing.compile_sweep``) as markdown."""

from __future__ import annotations

import math

from compare.formats.markdown import fmt_s, table
from compare.results.document import Results
from compare.timing.compile_sweep import Row, with_payback
from compare.timing.significance import FASTER, SLOWER, WITHIN_NOISE


def _dynamic(r: Row) -> str:
    d = r.get("dynamic")
    return "-" if d is None else str(d)


def _payback(r: Row) -> str:
    if r.get("generic"):
        return "(shape-generic)"
    if r.get("compile_s") is None or r.get("baseline") is None:
        return "-"
    p = r.get("payback_calls")
    if p == 0:
        return "nothing to pay back"
    verdict = r.get("payback_verdict")
    if p is None or verdict != FASTER:
        if verdict == SLOWER:
            return f"never (slower than {r['baseline']})"
        if verdict == WITHIN_NOISE:
            return f"never (not faster beyond noise than {r['baseline']})"
        return f"never (not faster than {r['baseline']})"
    return f"{math.ceil(p):,} calls vs {r['baseline']}"


def shapes_section(doc: Results) -> str:
    """Markdown for the document's ``shape_sweep``: per backend and shape, compiles, first call, steady state,
    payback."""
    rows = list(doc.shape_sweep)
    if not rows:
        return ""
    if any("payback_verdict" not in r for r in rows):  # older documents: judge the payback here, by the same rule
        rows = with_payback(rows)
    body = []
    for r in rows:
        size = f"{r.get('dim')}->{r.get('hidden')}" if r.get("dim") else ""
        body.append(
            [
                r["backend"],
                _dynamic(r),
                str(r["tokens"]),
                size,
                str(r.get("dtype", "")),
                str(r.get("mode", "")),
                "-" if r.get("error") else str(r.get("compiles", "-")),
                fmt_s(r.get("first_call_s")),
                fmt_s(r.get("median_s")),
                "none" if r.get("compile_s") == 0 else fmt_s(r.get("compile_s")),
                _payback(r),
                (r.get("error") or r.get("note") or "").replace("|", "\\|"),
            ]
        )
    head = [
        "backend",
        "dynamic",
        "tokens",
        "dim->hidden",
        "dtype",
        "mode",
        "compiles",
        "first call",
        "median",
        "compile cost",
        "paid back after",
        "notes",
    ]
    totals = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["backend"], _dynamic(r)), []).append(r)
    for (backend, dyn), rs in groups.items():
        n = sum(r.get("compiles") or 0 for r in rs)
        timed = [r["first_call_s"] for r in rs if r.get("first_call_s") is not None]
        first = f"first calls {fmt_s(sum(timed))} in all" if timed else "first calls not timed"
        totals.append(
            f"- {backend}"
            + (f" (dynamic={dyn})" if dyn != "-" else "")
            + f": {n} compile(s) over {len(rs)} shape(s), {first}"
        )
    counters = list(
        dict.fromkeys(f"- {r['backend']}: {r['compile_counter']}" for r in rows if r.get("compile_counter"))
    )
    intro = (
        "One compiled function called on inputs of each token count in turn, in the order shown. Compiles: "
        "the (re)compilations that shape caused, read from the framework's own counter (below), never "
        "inferred from time; a timed loop that recompiles is an error. Compile cost = first call - median. "
        "Paid back after: that cost over the per-call saving against the fastest shape-generic backend at "
        "the same shape (one that compiles nothing per shape), only where the compiled step is faster beyond "
        "both medians' IQRs (the rule of `compare diff`); otherwise it never pays back."
    )
    return (
        "## Compile cost and shape generality\n\n"
        + intro
        + "\n\n"
        + table(head, body)
        + "\n\n"
        + "\n".join(totals)
        + ("\n\nCounters:\n\n" + "\n".join(counters) if counters else "")
    )
