"""The cost model in the report: what fusion buys each backend over the baseline (predicted from bytes, measured
beside it) and the roofline table, as pure functions of a results document (``compare.costmodel`` computes)."""

from __future__ import annotations

import math
from typing import Any

from compare.cost_types import Achieved, Ceiling
from compare.costmodel import roofline
from compare.markdown import case_label, fmt_s, table
from compare.results import Result, Results


def si(x: float | None, unit: str) -> str:
    """``x`` with a decimal SI prefix and 3 significant digits, e.g. ``38.7 GFLOP``, ``50.3 MB``; None is ``-``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _signed_s(s: float | None) -> str:

    if s is None:
        return "-"
    return ("-" if s < 0 else "") + fmt_s(abs(s))


def ceilings_for(doc: Results, dtype: str) -> Ceiling | None:
    """The measured ceilings of ``dtype`` in the document, or None."""
    return doc.ceilings.get(dtype) if doc.ceilings is not None else None


def achieved(doc: Results, r: Result) -> Achieved | None:
    """A result's roofline numbers: stored as ``cost.achieved``, else computed from its timing and the document's
    ceilings (still a function of the document alone); None without timing or ceilings."""
    c = r.cost
    if c is None:
        return None
    if c.achieved is not None:
        return c.achieved
    ceil = ceilings_for(doc, r.dtype)
    t = r.timing
    if ceil is None or t is None or not t.median_s:
        return None
    return roofline(c, t.median_s, ceil)


def _find_baseline(results: tuple[Result, ...], r: Result, baseline: str) -> Result | None:
    for b in results:
        if b.backend == baseline and b.case == r.case and b.mode == r.mode and b.cost is not None:
            return b
    return None


def fusion_benefit(doc: Results) -> list[dict[str, Any]]:
    """Per non-baseline backend with a cost, against the baseline (``DEFAULT_BASELINE``) on the same case (dtype
    included) and mode.

    Each row: ``backend, case, label, dtype, mode``; ``kernels_eliminated`` (eager's measured
    ``kernels_per_step`` minus this backend's, None unless both were profiled) and ``model_kernels_eliminated``;
    ``intermediate_bytes_saved`` (intermediate traffic no longer written and read) and ``bytes_saved`` (all
    traffic, e.g. x read once instead of twice); ``extra_flops`` (recompute); ``predicted_saved_s`` =
    ``bytes_saved / bytes_per_s`` and ``predicted_extra_flops_s`` = ``extra_flops / flops_per_s`` (None without
    ceilings); ``measured_saved_s`` = eager median - this median and ``measured_verdict``, this backend's timing
    against eager's by :func:`compare.significance.compare_timing` ("faster", "slower" or "within noise": then the
    difference is not a measured saving, whatever its sign); both None unless both were timed.
    """
    from compare.registry import DEFAULT_BASELINE
    from compare.significance import compare_timing

    results = doc.results
    rows = []
    for r in results:
        c = r.cost
        if r.backend == DEFAULT_BASELINE or c is None:
            continue
        base = _find_baseline(results, r, DEFAULT_BASELINE)
        if base is None or base.cost is None:
            continue
        bc = base.cost
        k_r = r.kernels.kernels_per_step if r.kernels else None
        k_b = base.kernels.kernels_per_step if base.kernels else None
        ceil = ceilings_for(doc, r.dtype)
        t_r, t_b = r.timing, base.timing
        bytes_saved = bc.bytes - c.bytes
        extra_flops = c.flops - bc.flops
        rows.append(
            {
                "backend": r.backend,
                "case": r.case,
                "label": case_label(r),
                "dtype": r.dtype,
                "mode": r.mode,
                "kernels_eliminated": k_b - k_r if k_r is not None and k_b is not None else None,
                "model_kernels_eliminated": bc.model_kernels_per_step - c.model_kernels_per_step,
                "intermediate_bytes_saved": bc.intermediate_bytes - c.intermediate_bytes,
                "bytes_saved": bytes_saved,
                "extra_flops": extra_flops,
                "not_materialized": [n for n in bc.materialized if n not in c.materialized],
                "predicted_saved_s": bytes_saved / ceil.bytes_per_s if ceil else None,
                "predicted_extra_flops_s": extra_flops / ceil.flops_per_s if ceil else None,
                "measured_saved_s": t_b.median_s - t_r.median_s if t_r and t_b else None,
                "measured_verdict": compare_timing(t_b, t_r).verdict if t_r and t_b else None,
                "baseline_median_s": t_b.median_s if t_b else None,
                "median_s": t_r.median_s if t_r else None,
            }
        )
    return rows


def _measured_saved(f: dict[str, Any]) -> str:
    """The measured saving of a fusion-benefit row: a number only when the difference is beyond noise."""
    from compare.significance import WITHIN_NOISE

    if f["measured_saved_s"] is None:
        return "-"
    if f.get("measured_verdict") == WITHIN_NOISE:
        return WITHIN_NOISE
    return _signed_s(f["measured_saved_s"])


def fusion_section(doc: Results) -> str:
    """Markdown: what fusion buys each backend over the baseline, predicted from bytes and measured side by side."""
    from compare.registry import DEFAULT_BASELINE

    rows = fusion_benefit(doc)
    if not rows:
        return ""
    out = []
    for f in rows:
        kern = "-" if f["kernels_eliminated"] is None else str(f["kernels_eliminated"])
        out.append(
            [
                f["backend"],
                f["label"],
                f["dtype"],
                f["mode"],
                f"{kern} (model {f['model_kernels_eliminated']})",
                ", ".join(f["not_materialized"]) or "none",
                si(f["intermediate_bytes_saved"], "B"),
                si(f["bytes_saved"], "B"),
                _signed_s(f["predicted_saved_s"]),
                si(f["extra_flops"], "FLOP") if f["extra_flops"] else "0",
                _signed_s(f["predicted_extra_flops_s"]) if f["extra_flops"] else "-",
                _measured_saved(f),
                fmt_s(f["baseline_median_s"]),
            ]
        )
    head = [
        "backend",
        "case",
        "dtype",
        "mode",
        "kernels eliminated",
        "not in memory",
        "intermediate traffic saved",
        "bytes saved",
        "predicted saved (bytes / bandwidth)",
        "extra GEMM FLOPs",
        "their time at peak",
        "measured saved",
        f"{DEFAULT_BASELINE} median",
    ]
    intro = (
        f"Each backend against {DEFAULT_BASELINE} on the same case, dtype and mode. Kernels eliminated: "
        f"{DEFAULT_BASELINE}'s profiled kernels per step minus this backend's ('-' where either was not "
        "profiled; the cost model's count in brackets). Bytes saved come from the cost model (below): "
        "intermediates no longer written and read back, and inputs read fewer times. Predicted saved = bytes "
        "saved / this machine's measured copy bandwidth; a backend that recomputes (extra GEMM FLOPs) pays "
        "them back at the measured matmul rate. Measured saved = the two medians' difference, shown only where "
        "it is beyond both runs' noise (the rule of `compare diff`: median ratio outside the band of both "
        "IQRs, quartiles apart, a Mann-Whitney test), else 'within noise'. Negative means slower or more "
        "traffic."
    )
    return "## What fusion buys\n\n" + intro + "\n\n" + table(head, out)


def _ceilings_rows(doc: Results) -> list[list[str]]:
    if doc.ceilings is None:
        return []
    rows = []
    for dtype, c in doc.ceilings.by_dtype.items():
        mm, cp = (c.timing.matmul, c.timing.copy) if c.timing else (None, None)
        shape = "x".join(str(n) for n in c.matmul_shape) or "?"
        how = (
            f"{dtype} matmul {shape} (2MNK FLOPs), median {fmt_s(mm.median_s if mm else None)}; copy of "
            f"{si(c.copy_bytes, 'B')} (read + write counted), median {fmt_s(cp.median_s if cp else None)}"
        )
        rows.append(
            [
                doc.ceilings.device,
                dtype,
                si(c.flops_per_s, "FLOP/s"),
                si(c.bytes_per_s, "B/s"),
                si(c.flops_per_s / c.bytes_per_s, "FLOP/B"),
                how,
            ]
        )
    return rows


def cost_section(doc: Results) -> str:
    """Markdown: per result, modelled FLOPs and bytes, intensity, achieved rates against the measured ceilings."""
    rows = []
    for r in doc.results:
        c = r.cost
        if c is None:
            continue
        a = achieved(doc, r)
        t = r.timing
        rows.append(
            [
                r.label,
                case_label(r),
                r.dtype,
                r.mode,
                si(c.flops, "FLOP"),
                si(c.bytes, "B"),
                f"{c.arithmetic_intensity:.3g}",
                ", ".join(c.materialized) or "none",
                str(c.model_kernels_per_step),
                fmt_s(t.median_s) if t else "-",
                f"{si(a.flops_per_s, 'FLOP/s')} ({a.flops_fraction:.0%})" if a else "-",
                f"{si(a.bytes_per_s, 'B/s')} ({a.bytes_fraction:.0%})" if a else "-",
                f"{fmt_s(a.predicted_s)} ({a.bound})" if a else "-",
            ]
        )
    ceil_rows = _ceilings_rows(doc)
    if not rows and not ceil_rows:
        return ""
    parts = ["## Cost model and roofline"]
    if rows:
        head = [
            "backend",
            "case",
            "dtype",
            "mode",
            "GEMM FLOPs",
            "bytes moved",
            "FLOP/byte",
            "intermediates in memory",
            "model kernels",
            "median",
            "achieved FLOP/s (of ceiling)",
            "achieved bytes/s (of ceiling)",
            "roofline time (bound)",
        ]
        assumed = sorted({f"- {r.backend}: {r.cost.assumption}" for r in doc.results if r.cost and r.cost.assumption})
        intro = (
            "FLOPs and bytes are modelled, not counted (compare/costmodel.py): FLOPs are the GEMMs' 2MNK; "
            "bytes assume each kernel reads each operand and writes each result once, so bytes moved is a "
            "lower bound for the unfused backends' real traffic. Achieved rates divide them by the measured "
            "median; a fraction above 100% means the step beat the single-shape ceiling below. Roofline time "
            "= max(FLOPs / peak FLOP/s, bytes / peak bandwidth)."
        )
        parts.append(intro + "\n\n" + table(head, rows) + ("\n\n" + "\n".join(assumed) if assumed else ""))
    if ceil_rows:
        parts.append(
            "Ceilings, measured on this machine through the shared timer (each rate from its fastest sample: a "
            "peak):\n\n" + table(["device", "dtype", "peak FLOP/s", "peak bytes/s", "ridge", "how measured"], ceil_rows)
        )
    return "\n\n".join(parts)
