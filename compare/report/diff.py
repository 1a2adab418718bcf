"""``python -m compare diff OLD NEW``: what changed between two results documents, and is any of it a regression.

Cells are matched by (backend, case, mode); the case name holds the model, shape, dtype, distribution and seed.

**Performance** (the rule lives in :mod:`compare.timing.significance`; the report's speedups, measured savings and
compile paybacks use it too). Each side's quartiles (q1, median, q3) come from its per-sample times
``timing["samples_s"]`` when it has at least two, else from ``median_s`` -/+ ``iqr_s``/2. With
``ratio = new median / old median`` and the combined relative spread
``noise = sqrt((old IQR / old median)^2 + (new IQR / new median)^2)``, the band is ``tol = max(threshold, k * noise)``
(defaults: threshold 5%, k 1). The new run is **slower** (a regression) only if all of these hold:

1. ``ratio > 1 + tol``: slower by more than the threshold and more than the runs' own spread;
2. ``new q1 > old q3``: the middle halves of the two sample sets do not overlap;
3. when both sides have at least :data:`MIN_SAMPLES_FOR_TEST` samples: a one-sided Mann-Whitney U test says the
   new samples tend to be larger with ``p < alpha`` (default 0.01); exact distribution for small tie-free samples,
   else the normal approximation with tie and continuity corrections.

**Faster** is the mirror image (``ratio < 1 / (1 + tol)``, ``new q3 < old q1``, the test the other way); anything
else is **within noise**. A cell timed on only one side is "not compared".

**Between processes.** Each run is one process, and two processes of one build differ by more than their samples
do (two identical ``run --history`` runs 18 s apart: the XLA backend 34.2 -> 39.4 ms), so the rule above cannot tell a
change from another process. Two runs measure no between-process spread: a change at or below the floor
``compare.timing.significance.BETWEEN_FLOOR`` (the A/A between-process spread measured on the project's development
VM; another machine has its own) is within noise, and the verdict says the spread was not measured
(``significance.beyond_processes``). ``history`` measures the spread where it holds runs of one build; ``ab`` times K
processes a side.

**Load** (``compare.results.load``; where a run recorded it). Each run's machine load is shown. A slower (or
faster) cell is **ambiguous**, not a regression, when the ratio (or its inverse) is no more than what the busier
run's load explains (``Load.explained_ratio``): any change when that run was busy (others and steal took more than
``compare.results.load.BUSY_SHARE`` of the cores' time: a parallel step then loses far more than its share, so two
runs at different times cannot tell a change from the load; compare them interleaved in one session instead), else
``1 / (1 - share)``, ``share`` the part of the cores' time others took over that run's measurements (a step left
``1 - share`` of the machine takes up to that much longer under a fair share). It cannot see a load that changed
within a run's window (the share is an average over it).

**Parity.** A cell whose status was ``ok`` in the old run and is ``parity-fail`` or ``error`` in the new one is a
regression. Other status changes (e.g. ``ok`` -> ``skipped``: the backend is unavailable here) are listed, not
counted. Cells present on only one side are listed as added or removed.

**Memory** (issue 19; only where a run measured it, ``run --memory``). Memory is not noisy: the bytes saved for the
backward are an exact count, so any increase beyond ``--memory-tolerance`` (default 0 bytes) is a regression; the
peak is a bound, a regression when the new one exceeds the old by more than ``--peak-tolerance`` (default 5%: the
allocator's figure moves with where the runtime puts its workspaces), and only between figures of the same source.
A figure measured on one side only is "not compared".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from compare.formats.codec import to_json
from compare.formats.markdown import case_label, fmt_s, table
from compare.problem.cases import InputError
from compare.report.cells import mib
from compare.results.document import Result, Results
from compare.results.load import busier
from compare.results.memory import Memory
from compare.timing.significance import (
    ALPHA,
    BETWEEN_FLOOR,
    MIN_SAMPLES_FOR_TEST,
    NOISE_K,
    THRESHOLD,
    beyond_processes,
    compare_timing,
)

Key = tuple[str, str, str]

BAD_STATUSES = ("deviates", "parity-fail", "implausible", "error")


# --- the diff --------------------------------------------------------------------------------------------------


def _key(r: Result) -> Key:
    return r.backend, r.case, r.mode


def _index(doc: Results) -> dict[Key, Result]:
    return {_key(r): r for r in doc.results}


def _env_changes(old: Results, new: Results) -> list[str]:
    eo, en = to_json(old.environment), to_json(new.environment)
    out = [
        f"{k}: {eo.get(k)} -> {en.get(k)}"
        for k in ("cpu", "cpu_count", "gpu", "platform", "cpu_isa", "blas", "blas_core", "isa_caps")
        if eo.get(k) != en.get(k)
    ]
    vo, vn = old.environment.versions, new.environment.versions
    out += [f"{k}: {vo.get(k)} -> {vn.get(k)}" for k in sorted(set(vo) | set(vn)) if vo.get(k) != vn.get(k)]
    return out


#: The default tolerances of the memory comparison (module docstring).
MEMORY_TOLERANCE_BYTES = 0
PEAK_TOLERANCE = 0.05


def memory_rows(
    pairs: Sequence[tuple[Result, Result]],
    tolerance: int = MEMORY_TOLERANCE_BYTES,
    peak_tolerance: float = PEAK_TOLERANCE,
) -> tuple[list[list[str]], int]:
    """The memory table's rows of the cells measured on either side, and the number of regressions: saved bytes an
    exact count (an increase beyond ``tolerance`` bytes), the peak a bound (beyond ``peak_tolerance``, same source
    only)."""
    rows, bad = [], 0

    def figures(m: Memory | None) -> tuple[int | None, int | None, str]:
        if m is None:
            return None, None, ""
        return (
            (m.saved.bytes if m.saved else None),
            (m.peak.bytes if m.peak else None),
            (m.peak.source if m.peak else ""),
        )

    for o, n in pairs:
        if o.memory is None and n.memory is None:
            continue
        os_, op, osrc = figures(o.memory)
        ns, np_, nsrc = figures(n.memory)
        verdicts = []
        if os_ is None or ns is None:
            verdicts.append("saved: not compared (measured on one side only)")
        elif ns > os_ + tolerance:
            verdicts.append(f"**saved: regression, +{ns - os_:,} B**")
            bad += 1
        else:
            verdicts.append("saved: same" if ns == os_ else f"saved: {ns - os_:+,} B")
        if op is None or np_ is None:
            verdicts.append("peak: not compared (measured on one side only)")
        elif osrc != nsrc:
            verdicts.append("peak: not compared (other sources)")
        elif np_ > op * (1 + peak_tolerance):
            verdicts.append(f"**peak: regression, +{(np_ - op) / op:.1%}**" if op else "**peak: regression**")
            bad += 1
        else:
            verdicts.append("peak: within bound")
        rows.append(
            [
                n.backend,
                case_label(n),
                n.dtype,
                n.mode,
                *("-" if x is None else mib(x) for x in (os_, ns, op, np_)),
                "; ".join(verdicts),
            ]
        )
    return rows, bad


def diff(
    old_doc: Results,
    new_doc: Results,
    threshold: float = THRESHOLD,
    k: float = NOISE_K,
    alpha: float = ALPHA,
    memory_tolerance: int = MEMORY_TOLERANCE_BYTES,
    peak_tolerance: float = PEAK_TOLERANCE,
) -> tuple[str, bool]:
    """Markdown comparing two results documents, and whether a performance, parity or memory regression was
    found."""
    old, new = _index(old_doc), _index(new_doc)
    common = [key for key in new if key in old]
    perf_rows, status_rows = [], []
    n_slow = n_fast = n_parity = n_ambiguous = 0
    load = busier(old_doc.load, new_doc.load)
    explained = load.explained_ratio() if load is not None else 1.0
    explains = "any change (a busy run)" if math.isinf(explained) else f"{explained:.2f}x"
    for key in common:
        o, n = old[key], new[key]
        cell = [n.backend, case_label(n), n.dtype, n.mode]
        if o.timing is not None and n.timing is not None:
            v = beyond_processes(compare_timing(o.timing, n.timing, threshold, k, alpha), None, k)
            moved = v.regression or v.verdict == "faster"
            if moved and max(v.ratio, 1 / v.ratio) <= explained:  # within what the busier run's load explains
                n_ambiguous += 1
                verdict = f"ambiguous ({'slower' if v.ratio > 1 else 'faster'}, the load explains {explains})"
            else:
                n_slow += v.regression
                n_fast += v.verdict == "faster"
                verdict = "**slower: regression**" if v.regression else v.said(v.verdict)
            p = v.p_slower if v.ratio >= 1 else v.p_faster
            perf_rows.append(
                [
                    *cell,
                    fmt_s(v.old.median),
                    fmt_s(v.new.median),
                    f"{v.ratio:.3f}",
                    f"+/-{v.tol:.1%}",
                    "-" if p is None else f"{p:.2g}",
                    verdict,
                ]
            )
        elif o.timing is not None or n.timing is not None:
            side = "old" if o.timing is not None else "new"
            perf_rows.append(
                [
                    *cell,
                    fmt_s(o.timing.median_s) if o.timing is not None else "-",
                    fmt_s(n.timing.median_s) if n.timing is not None else "-",
                    "-",
                    "-",
                    "-",
                    f"not compared (timed in the {side} run only)",
                ]
            )
        if o.status != n.status:
            parity_regression = o.status == "ok" and n.status in BAD_STATUSES
            n_parity += parity_regression
            reason = n.reason.replace("|", "\\|")
            verdict = "**regression**" if parity_regression else ("fixed" if n.status == "ok" else "changed")
            status_rows.append([*cell, o.status, n.status, verdict, reason])
    added = [new[key] for key in new if key not in old]
    removed = [old[key] for key in old if key not in new]
    mem_rows, n_memory = memory_rows([(old[key], new[key]) for key in common], memory_tolerance, peak_tolerance)
    regression = bool(n_slow or n_parity or n_memory)

    def when(doc: Results) -> str:
        cmd = doc.config.command
        return (doc.created or "?") + (f" (`{cmd}`)" if cmd else "")

    def loaded(doc: Results) -> str:
        return doc.load.describe() if doc.load is not None else "not recorded"

    out = ["# fusion-compare diff", "", f"Old: {when(old_doc)}  ", f"New: {when(new_doc)}", ""]
    out += [f"Old machine load: {loaded(old_doc)}  ", f"New machine load: {loaded(new_doc)}", ""]
    ambiguous = (
        f" {n_ambiguous} cells changed by no more than the busier run's load explains ({explains}): ambiguous, "
        "not counted; rerun both on a quiet machine, or time both versions interleaved in one session, to tell."
        if n_ambiguous
        else ""
    )
    if regression:
        out.append(
            f"**Regression**: {n_slow} slower beyond noise, {n_parity} parity/status regressions"
            + (f", {n_memory} memory regressions" if n_memory else "")
            + f" ({n_fast} faster)."
            + ambiguous
        )
    else:
        out.append(f"No regression ({len(common)} cells matched; {n_fast} faster beyond noise).{ambiguous}")
    env = _env_changes(old_doc, new_doc)
    if env:
        out += ["", "Environments differ (times may not be comparable): " + "; ".join(env) + "."]
    out += [
        "",
        "## Timing",
        "",
        f"Slower means: new/old median ratio above 1 + band, where band = max({threshold:.0%}, {k:g} x the "
        f"combined relative IQR of both runs); the new first quartile above the old third; and, with at least "
        f"{MIN_SAMPLES_FOR_TEST} samples a side, a one-sided Mann-Whitney U test at p < {alpha:g}. Faster is "
        f"the mirror image. p is the test's p-value in the direction of the change. Two runs are made at "
        f"different times and cannot be interleaved: their samples cannot be paired by round as the backends of "
        f"one run are (`compare run` times them together), so this unpaired rule is the one that applies, and a "
        f"change of load between the runs can move a cell: rerun both on a quiet machine before trusting one. Each "
        f"run is one process, and two processes of one build differ by more than their samples: the between-process "
        f"spread is not measured here, so no change of {BETWEEN_FLOOR:.0%} or less is called (the A/A spread "
        f"between processes measured on a 2-core development VM; `compare ab` with several workers a side, or a "
        f"history with runs of one build, measures it). A "
        f"change by no more than the busier run's recorded load explains (any change when it was busy, else 1 / (1 "
        f"- the share of the cores' time others took): {explains} here) is 'ambiguous', not counted.",
        "",
    ]
    head = ["backend", "case", "dtype", "mode", "old median", "new median", "new/old", "band", "p", "verdict"]
    out.append(table(head, perf_rows) if perf_rows else "No cell was timed in both runs.")
    out += ["", "## Status and parity", ""]
    if status_rows:
        out.append(table(["backend", "case", "dtype", "mode", "old", "new", "verdict", "new reason"], status_rows))
    else:
        out.append("No status changed.")
    if mem_rows:
        out += [
            "",
            "## Memory",
            "",
            f"Saved for backward is an exact count: more than {memory_tolerance:,} B over the old run is a "
            f"regression. The peak is a bound: more than {peak_tolerance:.0%} over the old one (same source) is a "
            "regression.",
            "",
            table(
                ["backend", "case", "dtype", "mode", "old saved", "new saved", "old peak", "new peak", "verdict"],
                mem_rows,
            ),
        ]
    if added or removed:
        out += ["", "## Added and removed cells", ""]
        out += [f"- added: {r.backend} {case_label(r)} {r.dtype} {r.mode} ({r.status})" for r in added]
        out += [f"- removed: {r.backend} {case_label(r)} {r.dtype} {r.mode} ({r.status})" for r in removed]
    return "\n".join(out) + "\n", regression


def check_shared(old: Results, new: Results, old_name: str, new_name: str) -> None:
    """An :class:`InputError` (exit 2) when ``old`` and ``new`` share no cell (backend, case, mode): nothing to
    compare, never "no regression". The message names both files and the cells each has (the first 8)."""
    if any(key in _index(old) for key in _index(new)):
        return

    def cells(doc: Results) -> str:
        keys = [" ".join(key) for key in _index(doc)]
        more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
        return ", ".join(keys[:8]) + more if keys else "no cell"

    raise InputError(
        f"{old_name} and {new_name} share no cell (backend, case, mode): nothing to compare. {old_name} has "
        f"{cells(old)}; {new_name} has {cells(new)}"
    )
