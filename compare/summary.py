"""The answer first: one line per case, dtype and mode, at the top of the report. A pure function of the document.

Each line gives
- **parity**: every backend passes, or which fail and on what (tensor: checks), which deviate (a real difference
  an honest implementation can have) and the likely cause, with the gate's resolution on that case
  (``compare.resolution``: the smallest scale error it catches on ``y``, and whether erf and tanh GELU can be told
  apart), so "pass" has a size;
- **fastest**: the fastest timed backend and its speedup against the baseline, marked *significant* only beyond
  both runs' noise (``compare.significance``, the rule of ``compare diff``), else *within noise*;
- **fusion headroom**: the share of the baseline's profiled step spent outside its GEMMs (its elementwise and other
  kernels, from the profiler's per-kernel times): the most that fusing them away could ever save. Next to it, what
  each fused backend actually saved, from the fusion table (a number only where it is beyond noise).
"""

from __future__ import annotations

from typing import Any

from compare.cost_report import fusion_benefit
from compare.markdown import case_label, fmt_s
from compare.registry import DEFAULT_BASELINE
from compare.resolution import ResolutionRow
from compare.results import Result, Results
from compare.significance import WITHIN_NOISE, speedup


def _key(r: Result) -> tuple[str, str]:
    return r.case, r.mode


def _label(r: Result) -> str:
    return f"{case_label(r)} {r.dtype} {r.mode}"


def _parity(rows: list[Result], resolution: tuple[ResolutionRow, ...]) -> str:
    judged = [r for r in rows if r.parity is not None]
    bad = [r for r in rows if r.status in ("parity-fail", "error")]
    deviating = [r for r in rows if r.status == "deviates"]
    passing = [r for r in judged if r.status == "ok"]
    parts = []
    if bad:
        what = []
        for r in bad:
            if r.status == "error":
                what.append(f"{r.label} (error)")
            else:
                failed = r.parity.failed if r.parity is not None else ()
                what.append(f"{r.label} ({', '.join(failed) or 'last timed call'})")
        parts.append("**FAIL**: " + "; ".join(what))
    if deviating:
        what = []
        for r in deviating:
            p = r.parity
            worst = max(p.tensors, key=lambda t: t.worst_ratio) if p is not None and p.tensors else None
            cause = f": {worst.cause}" if worst is not None and worst.cause else ""
            what.append(f"{r.label} ({', '.join(p.deviated if p is not None else ())}{cause})")
        parts.append("deviates: " + "; ".join(what))
    if not parts and not judged:
        return "nothing judged"
    verdict = "; ".join(parts) + f"; {len(passing)} other(s) pass" if parts else f"all {len(judged)} pass"
    case = rows[0].case
    res = next((x for x in resolution if x.case == case and x.tensor == "y"), None)
    if res:
        s = res.scale_resolution
        size = (
            "no scale error"
            if s is None
            else f"< {s:.1g}"
            if res.note == "below"
            else f"{s:.2%}"
            if s >= 1e-4
            else f"{s:.1g}"
        )
        erf = (
            ""
            if res.erf_distinguishable is None
            else "; erf vs tanh GELU " + ("told apart" if res.erf_distinguishable else "not distinguishable")
        )
        verdict += f" (the gate catches a scale error of {size} on y{erf})"
    return verdict


def _fastest(rows: list[Result]) -> str:
    timed = [(r, r.timing) for r in rows if r.timing is not None and r.status in ("ok", "deviates")]
    if not timed:
        return "nothing timed"
    best, best_t = min(timed, key=lambda rt: rt[1].median_s)
    base = next(((r, t) for r, t in timed if r.backend == DEFAULT_BASELINE), None)
    text = f"{best.label} {fmt_s(best_t.median_s)}"
    if base is None:
        return text + f" ({DEFAULT_BASELINE} not timed)"
    if best is base[0]:
        return text + " (the baseline itself)"
    ratio, verdict = speedup(base[1], best_t)
    return text + (
        f", {WITHIN_NOISE} of {DEFAULT_BASELINE}"
        if verdict == WITHIN_NOISE
        else f", {ratio:.2f}x {DEFAULT_BASELINE} (significant)"
    )


def _headroom(rows: list[Result], fusion: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r.backend == DEFAULT_BASELINE), None)
    kernels = base.kernels if base is not None else None
    timed = [(k, k.time_us) for k in (kernels.kernels if kernels else ()) if k.time_us]
    if base is None or not timed:
        return f"not measured ({DEFAULT_BASELINE} not profiled: run with --profile)"
    total = sum(t for _, t in timed)
    outside = sum(t for k, t in timed if k.kind != "gemm")
    saved = []
    for f in fusion:
        if (f["case"], f["mode"]) != _key(base) or f.get("measured_verdict") is None:
            continue
        sign = "-" if f["measured_saved_s"] < 0 else ""
        saved.append(
            f"{f['backend']} {WITHIN_NOISE}"
            if f["measured_verdict"] == WITHIN_NOISE
            else f"{f['backend']} {sign}{fmt_s(abs(f['measured_saved_s']))}"
        )
    head = f"{outside / total:.0%} of {DEFAULT_BASELINE}'s kernel time ({fmt_s(outside * 1e-6)} a step)"
    return head + ("; saved: " + ", ".join(saved) if saved else "")


def summary_section(doc: Results) -> str:
    """``## Summary``: the answer per case, dtype and mode (see the module docstring); "" without results."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in doc.results:
        groups.setdefault(_key(r), []).append(r)
    if not groups:
        return ""
    fusion = fusion_benefit(doc)
    lines = []
    for rows in groups.values():
        lines.append(
            f"- **{_label(rows[0])}**: parity {_parity(rows, doc.resolution)}. Fastest: {_fastest(rows)}. "
            f"Fusion headroom: {_headroom(rows, fusion)}."
        )
    intro = (
        "One line per case, dtype and mode. Parity: every backend against the float64 golden (details and the "
        "gate's resolution below). Fastest: the quickest timed backend; a speedup is a number only beyond both "
        f"runs' noise. Fusion headroom: the share of {DEFAULT_BASELINE}'s profiled kernel time spent outside "
        "its GEMMs, the most fusing the rest away could ever save, next to what each fused backend saved."
    )
    return "## Summary\n\n" + intro + "\n\n" + "\n".join(lines)
