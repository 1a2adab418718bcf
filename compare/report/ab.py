"""``AB.md`` and the verdicts of ``python -m compare ab``: a pure function of the A/B document
(``compare.results.ab``). It measures nothing.

Per pair (a backend on a case and mode, on both sides): each side's version of the backend's framework, its parity
tier and worst statistic, each worker's median, the B/A ratio with its verdict (below), and what differs in kernels
per step, in the ops each fused kernel absorbed, in the bytes saved for the backward and in the first call (compile +
run). A finding (:func:`findings`, exit status 1, as ``compare diff``):
B slower beyond noise, B losing parity where A was ``ok`` (``compare.report.diff.BAD_STATUSES``), or an ``error`` row
on either side (a worker that died, a backend that raised).

**Timing** (``compare.timing.significance``, "Between processes"). With K worker processes a side (``--workers``,
``Pair.a_processes``), the process is the unit: the ratio of the sides' geometric means of per-process medians,
called only where the t-test on the log medians says so at p < 0.01 and beyond the band ``max(5%, the largest range
of one side's per-process medians)``; the median shown for a side is the median of its processes' medians. With one
worker a side (``--workers 1``, a schema-1 ``ab.json``), the exact signed-rank test over the rounds of its one pair
of processes, and nothing within the between-process floor (``BETWEEN_FLOOR``: a spread not measured) is called.

**Load.** As ``compare diff`` does, a difference no larger than the machine's recorded load explains
(``compare.results.load.Load.explained_ratio``: any, when others took more than a tenth of the cores) is
*ambiguous*, not a finding. Two processes take turns here, so unlike the backends of one run they do not share their
thread pools: with one core busy, a side's pool can keep one thread on that core for a whole trial while the other's
does not (A/A with two OpenBLAS threads a side, one core busy: 5 of 20 trials called different; one thread a side: 0
of 20), and the paired test cannot see that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from compare.formats.markdown import case_label, fmt_s, table
from compare.kernels.summary import Kernels
from compare.report.cells import changes, mib, signed_s
from compare.report.diff import BAD_STATUSES
from compare.report.memory import saved_bytes
from compare.report.render import load_note
from compare.report.summary import parity_cell, untimed_reason
from compare.results.ab import ABResults, Pair, Process, Side
from compare.results.document import Result
from compare.results.history import PairedVerdict
from compare.results.load import Load
from compare.timing.significance import (
    BETWEEN_FLOOR,
    FASTER,
    NOT_TESTED,
    PROCESSES,
    SLOWER,
    TimingVerdict,
    compare_processes,
    not_tested,
)
from compare.timing.timer import Timing

#: What the paired test's "within noise" reads as between two sides, and a difference the machine's load explains.
SAME, AMBIGUOUS = "same", "ambiguous"


@dataclass(frozen=True)
class Verdict:
    """One pair judged: the paired test's words (``test``: ``faster``, ``slower``, ``same``, ``not tested ...``),
    what the report says (``timing``: the test's words, or ``ambiguous`` where the machine's load explains the
    difference), the B/A cell, whether B is slower beyond noise and the load, and whether B lost parity where A was
    ``ok``."""

    test: str
    timing: str
    ratio_cell: str
    slower: bool
    parity_lost: bool
    ratio: float | None = None  # B's median over A's (None: a side not timed)
    p: float | None = None  # the one-sided p-value of the ratio's direction (None: the test did not run)
    #: the rule's verdict (None: a side not timed): the sides' medians (of per-process medians) and the band
    timing_verdict: TimingVerdict | None = None


def _not_timed(side: str, r: Result) -> str:
    """Why a side has no timing: an error (its reason is under the table), why it was skipped, or why not timed."""
    why = {"error": "error", "skipped": r.reason}.get(r.status) or untimed_reason(r)
    return f"{side} not timed: {why}"


def timed(processes: tuple[Process, ...], row: Result) -> list[Timing]:
    """A side's timings, one per worker process that timed the pair; the side's row's alone in a schema-1
    document (none: the row is not timed)."""
    got = [x.timing for x in processes if x.timing is not None]
    return got or ([row.timing] if row.timing is not None else [])


def _how(v: TimingVerdict, p_value: float | None) -> str:
    """What decided: the test's p-value, its replicates (processes a side, or rounds of one pair) and the band."""
    if p_value is None:
        return v.design
    if v.design == PROCESSES:
        return f"p {p_value:.2g}, {len(v.old.samples)}+{len(v.new.samples)} processes, band +/-{v.tol:.0%}"
    return f"p {p_value:.2g}, {v.pairs} rounds, band +/-{v.tol:.0%}; {v.between_words()}"


def verdict(p: Pair, load: Load | None = None) -> Verdict:
    """The pair's :class:`Verdict` (module docstring), a difference the machine's ``load`` explains ambiguous."""
    lost = p.a.status == "ok" and p.b.status in BAD_STATUSES
    if p.a.timing is None or p.b.timing is None:
        why = "; ".join(_not_timed(s, r) for s, r in (("A", p.a), ("B", p.b)) if r.timing is None)
        return Verdict(f"{NOT_TESTED}: {why}", f"{NOT_TESTED}: {why}", "-", False, lost)
    v = compare_processes(timed(p.a_processes, p.a), timed(p.b_processes, p.b))
    if v.verdict == NOT_TESTED:
        return Verdict(not_tested(v.pairs), not_tested(v.pairs), "-", False, lost)
    word = {SLOWER: SLOWER, FASTER: FASTER}.get(v.verdict, SAME)
    p_value = v.p_slower if v.ratio >= 1 else v.p_faster
    how = _how(v, p_value)
    if not v.significant:
        return Verdict(word, word, f"{word}: within noise ({how})", False, lost, v.ratio, p_value, v)
    explained = load.explained_ratio() if load is not None else 1.0
    if max(v.ratio, 1 / v.ratio) <= explained:
        says = "any change (a busy machine)" if math.isinf(explained) else f"up to {explained:.2f}x"
        return Verdict(word, AMBIGUOUS, f"{v.ratio:.2f}x: {AMBIGUOUS} ({word}, {how}; the load explains {says})",
                       False, lost, v.ratio, p_value, v)  # fmt: skip
    return Verdict(word, word, f"{v.ratio:.2f}x: {word} ({how})", v.verdict == SLOWER, lost, v.ratio, p_value, v)


def paired_verdicts(doc: ABResults) -> tuple[PairedVerdict, ...]:
    """Each timed pair's :class:`Verdict` as the history keeps it (``ab --history``): B's cell against A, named by
    A's commit and the backend's framework version there; ``verdict`` the report's word (``slower``, ``faster``,
    ``same``, ``ambiguous``), so the history flags what ``ab`` called, no more."""
    out = []
    for p in doc.pairs:
        v = verdict(p, doc.load)
        if v.ratio is None:  # a side not timed, or too few rounds to test
            continue
        baseline = f"{doc.a.commit[:7] or 'A'} ({_version(doc.a, p.framework)})"
        out.append(PairedVerdict(p.b.backend, p.b.case, p.b.mode, p.b.world_size, baseline, v.timing, v.ratio, v.p))
    return tuple(out)


def findings(doc: ABResults) -> list[str]:
    """What makes ``ab`` exit 1, one line each: B slower beyond noise, B losing parity, an error row."""
    out = []
    for p in doc.pairs:
        v, label = verdict(p, doc.load), f"{p.b.backend} {p.b.case} {p.b.mode}"
        if v.slower:
            out.append(f"{label}: B slower than A ({v.ratio_cell})")
        if v.parity_lost and p.b.status != "error":  # an error is said once, below
            out.append(f"{label}: B loses parity ({p.a.status} in A, {p.b.status} in B: {p.b.reason})")
        out += [f"{label}: error in {s}: {r.reason}" for s, r in (("A", p.a), ("B", p.b)) if r.status == "error"]
    return out


def _version(side: Side, framework: str) -> str:
    return f"{framework} {side.versions.get(framework) or '?'}"


def _two(a: str, b: str) -> str:
    """``a`` and ``b`` as one cell: the value once when they agree."""
    return f"{a} (both)" if a == b else f"{a} / {b}"


def _count(k: Kernels | None) -> int | None:
    return k.kernels_per_step if k is not None else None


def _fused(k: Kernels | None) -> str:
    """The ops each fused kernel absorbed (its short name where it lists none), e.g. ``gelu+mul``."""
    if k is None:
        return "-"
    fused = ["+".join(e.absorbed) or e.short for e in k.kernels if e.kind == "fused"]
    return ", ".join(f"`{f}`" for f in fused) or "none"


def _pair(a: float | None, b: float | None, show: Callable[[float], str], signed: Callable[[float], str]) -> str:
    """``A / B (B - A)``; ``-`` for a side without the figure (and no difference then)."""
    if a is None and b is None:
        return "-"
    if a is None or b is None:
        return f"{'-' if a is None else show(a)} / {'-' if b is None else show(b)}"
    return f"{show(a)} / {show(b)} ({signed(b - a)})"


def _signed_mib(n: float) -> str:
    return ("-" if n < 0 else "+") + mib(int(abs(n)))


def _medians(processes: tuple[Process, ...]) -> str:
    """Each worker's median, in start order (``-``: one not timed; ``-`` for a schema-1 pair)."""
    return ", ".join(fmt_s(x.timing.median_s) if x.timing is not None else "-" for x in processes) or "-"


def _row(doc: ABResults, p: Pair) -> list[str]:
    a, b, v = p.a, p.b, verdict(p, doc.load)
    ka, kb = a.kernels, b.kernels
    fa = a.timing.first_call_s if a.timing is not None else None
    fb = b.timing.first_call_s if b.timing is not None else None
    tv = v.timing_verdict
    return [
        b.backend,
        f"{case_label(b)} {b.dtype} {b.mode}",
        _two(_version(doc.a, p.framework), _version(doc.b, p.framework)),
        parity_cell(a),
        parity_cell(b),
        fmt_s(tv.old.median) if tv is not None else fmt_s(a.timing.median_s) if a.timing is not None else "-",
        fmt_s(tv.new.median) if tv is not None else fmt_s(b.timing.median_s) if b.timing is not None else "-",
        f"{_medians(p.a_processes)} / {_medians(p.b_processes)}",
        v.ratio_cell if v.ratio_cell != "-" else v.timing,
        _pair(_count(ka), _count(kb), lambda n: f"{n:g}", lambda n: f"{n:+g}"),
        _two(_fused(ka), _fused(kb)) if ka is not None or kb is not None else "-",
        _pair(saved_bytes(a), saved_bytes(b), lambda n: mib(int(n)), _signed_mib),
        _pair(fa, fb, fmt_s, lambda s: "+" * (s >= 0) + signed_s(s)) + _first(a, b),
    ]


def _first(a: Result, b: Result) -> str:
    """Which side made its first calls first, where both did (``compare.run.ab``: drawn per case and mode)."""
    if a.timing is None or b.timing is None:
        return ""
    return "; A first" if a.extras.get("ab_staged") == "first" else "; B first" if b.extras.get("ab_staged") else ""


def differences(doc: ABResults) -> tuple[str, ...]:
    """What sets side B apart from A as recorded: checkout, commit, interpreter, Python, package versions and the
    variables set (``$FOO - -> 1``); empty where nothing recorded differs."""
    a, b = doc.a, doc.b
    said = {"checkout": (a.path, b.path), "commit": (a.commit, b.commit), "interpreter": (a.python, b.python)}
    said["Python"] = (a.python_version, b.python_version)
    of_a = {k: x for k, (x, _) in said.items()} | a.versions | {f"${k}": v for k, v in a.env.items()}
    of_b = {k: y for k, (_, y) in said.items()} | b.versions | {f"${k}": v for k, v in b.env.items()}
    return changes(of_a, of_b)


def _differ_line(doc: ABResults) -> str:
    found = differences(doc)
    return "B differs from A in: " + ("; ".join(found) if found else "nothing recorded (the same build and settings)")


def _side_line(s: Side) -> str:
    if s.problem:
        return f"**{s.name}**: `{s.python}` in `{s.path}`: no worker answered ({s.problem})"
    versions = ", ".join(f"{k} {v}" for k, v in s.versions.items() if v and k != "python")
    env = ", ".join(f"`{k}={v}`" for k, v in s.env.items()) or "none"
    return (
        f"**{s.name}**: `{s.python}` in `{s.path}` (commit {s.commit or 'unknown: not a git checkout'}); Python "
        f"{s.python_version}, {versions}; variables set: {env}"
    )


def summary_lines(doc: ABResults) -> list[str]:
    """What ``ab`` prints: one line per pair (its timing verdict and the sides' statuses), then the findings."""
    lines = []
    for p in doc.pairs:
        v = verdict(p, doc.load)
        lines.append(
            f"{p.b.backend} {p.b.case} {p.b.mode}: B/A {v.ratio_cell if v.ratio_cell != '-' else v.timing}; "
            f"A {p.a.status}, B {p.b.status}"
        )
    found = findings(doc)
    lines.append(_differ_line(doc))
    return lines + ([f"finding: {f}" for f in found] or ["no finding: B is not slower beyond noise and keeps parity"])


def render(doc: ABResults) -> str:
    """``AB.md``: the sides, the verdict, one row per pair, then every error row's reason."""
    found = findings(doc)
    head = [
        "backend",
        "case",
        "version A / B",
        "parity A",
        "parity B",
        "median A",
        "median B",
        "per-process medians A / B",
        "B/A (between processes)",
        "kernels/step A / B",
        "fused (absorbed ops) A / B",
        "saved for backward A / B",
        "first call A / B",
    ]
    ambiguous = sum(verdict(p, doc.load).timing == AMBIGUOUS for p in doc.pairs)
    verdict_line = (
        "**Finding**: " + "; ".join(found) + "."
        if found
        else "**No finding**: B is not slower than A beyond noise on any pair and loses no parity."
    ) + (
        f" {ambiguous} pair(s) differ by no more than the machine's load explains: ambiguous, not counted; rerun on "
        "a quiet machine (or with one thread a side) to tell."
        if ambiguous
        else ""
    )
    method = (
        f"{doc.workers} worker process(es) a side; every worker's steps were timed in one interleaved group: every "
        "round runs one block of each, in an order drawn for the round, each block timed inside its own worker. With "
        "two or more workers a side, the process is the unit: B/A is the ratio of the sides' geometric means of "
        "per-process medians (a side's median: the median of its processes'), a number only where the t-test on the "
        "log per-process medians says so at p < 0.01 and the ratio is beyond the band (5%, or the largest range of "
        "one side's per-process medians: what differs between two processes of one build). With one worker a side, "
        "the exact signed-rank test over the rounds' paired log ratios at p < 0.01, beyond the noise band (5%, or the "
        f"spread of the rounds' log ratios) and beyond the between-process floor ({BETWEEN_FLOOR:.0%}: the spread "
        "between processes is not measured then). 'same' is a test that found no difference; "
        "'ambiguous' a difference no larger than the machine's load explains (any, when others took over 10% of the "
        "cores: two processes' thread pools do not share a busy core alike), as `compare diff` says. Parity: each "
        "side's gate against the same golden data. Differences read B minus A. The sides' first calls (compile + run) "
        "ran one after the other, in an order drawn per case and mode and shown in the row: with the same versions, "
        "the second may find what the first compiled in the on-disk caches (Inductor's, Triton's, JAX's)."
    )
    errors = [
        f"- {s} {r.backend} {r.case} {r.mode}: {r.reason}"
        for p in doc.pairs
        for s, r in (("A", p.a), ("B", p.b))
        if r.status == "error"
    ]
    parts = [
        "# A/B: B against A",
        "",
        _side_line(doc.a) + "  ",
        _side_line(doc.b),
        "",
        _differ_line(doc) + ".",
        "",
        f"Made {doc.created} by `{doc.command}`." if doc.command else f"Made {doc.created}.",
        "",
        verdict_line,
        "",
        method + (f" {load_note(doc.load)}" if doc.load is not None else ""),
        "",
        table(head, [_row(doc, p) for p in doc.pairs]) if doc.pairs else "No pair was run.",
    ]
    if errors:
        parts += ["", "## Errors", "", *errors]
    return "\n".join(parts) + "\n"
