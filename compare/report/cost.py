"""The cost model in the report: what fusion buys each backend over its own framework's unfused baseline (predicted
from bytes, measured beside it, the measured kernel time split into GEMMs and the rest) and the roofline table, as
pure functions of a results document and the registry's lines (``compare.cost.model`` computes)."""

from __future__ import annotations

from typing import Any

from compare.backends.registry import BACKENDS, MODULE_FRAMEWORK_BASELINES, framework_baseline, unfused_baseline
from compare.cost.model import removed, roofline
from compare.cost.records import Achieved, Ceiling
from compare.formats.markdown import case_label, fmt_s, si, table
from compare.report.cells import LEAD, lead, signed_s
from compare.report.machines import same_machine
from compare.report.measured import NOT_MODELLED, achieved_flops_per_s, measured_flops, not_counted, unmodelled
from compare.results.document import Result, Results
from compare.timing.significance import NOT_TESTED, WITHIN_NOISE, compare_timing, not_tested


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


#: Statuses whose timing and kernels measure what the backend computes (``compare.results.document.STATUSES``).
MEASURED: tuple[str, ...] = ("ok", "deviates")
#: Why a result's timing is no measurement, by status; the baseline's reads "baseline " + this.
UNMEASURED: dict[str, str] = {
    "parity-fail": "failed parity",
    "implausible": "implausible timing",
    "error": "error",
    "skipped": "skipped",
}


def kernel_time_split(r: Result) -> tuple[float, float] | None:
    """``(gemm_s, outside_s)``: a result's profiled kernel time per step in GEMM kernels and in every other kernel
    (``compare.kernels.summary``: ``kind == "gemm"``; elementwise, fused, reduction, copy... outside), in seconds; None
    unless it was profiled with a time for every kernel (a partial table would misstate the split)."""
    k = r.kernels
    if k is None or not k.kernels or any(e.time_us is None for e in k.kernels):
        return None
    gemm = sum(e.time_us or 0.0 for e in k.kernels if e.kind == "gemm")
    outside = sum(e.time_us or 0.0 for e in k.kernels if e.kind != "gemm")
    return gemm * 1e-6, outside * 1e-6


def _not_measured(r: Result, base: Result) -> str:
    """Why there is no measured saving of ``r`` over ``base`` ("" when there is one)."""
    if r.status not in MEASURED:
        return UNMEASURED.get(r.status, r.status)
    if base.status not in MEASURED:
        return "baseline " + UNMEASURED.get(base.status, base.status)
    if r.timing is None or base.timing is None:
        return "not timed" if r.timing is None else "baseline not timed"
    return ""


def fusion_benefit(doc: Results) -> list[dict[str, Any]]:
    """Per backend with a cost, against its own framework's unfused baseline (``compare.backends.registry``:
    :func:`~compare.backends.registry.framework_baseline`) on the same case (dtype included) and mode: what fusion saved
    within one framework. Across frameworks the medians differ by GEMM library and dispatch, not by fusion: that
    speed is the timing table's, never a row here. Baselines themselves, and backends of a framework with no
    baseline (or no baseline result on the case and mode), have no row.

    Each row: ``backend, baseline, case, label, dtype, mode``; ``kernels_eliminated`` (the baseline's measured
    ``kernels_per_step`` minus this backend's, None unless both were profiled) and ``model_kernels_eliminated``;
    ``intermediate_bytes_saved`` (intermediate traffic no longer written and read) and ``bytes_saved`` (all
    traffic, e.g. x read once instead of twice); ``extra_flops`` (recompute); ``predicted_saved_s`` =
    ``bytes_saved / bytes_per_s`` and ``predicted_extra_flops_s`` = ``extra_flops / flops_per_s`` (None without
    ceilings). Measured, only where both results are ``ok`` or ``deviates`` and timed (else ``not_measured`` says
    why, e.g. "failed parity", "baseline failed parity", "not timed"; "" when measured): ``measured_saved_s`` =
    baseline median - this median and ``measured_verdict``, this backend's timing against the baseline's by
    :func:`compare.timing.significance.compare_timing` ("faster", "slower" or "within noise": then the difference is not
    a measured saving, whatever its sign); from the profiled kernel tables (:func:`kernel_time_split`, None unless
    both have a time for every kernel), ``gemm_time_saved_s`` (the baseline's GEMM kernel time per step minus this
    backend's: GEMM library and shapes, not fusion) apart from ``outside_gemm_saved_s`` (the same for every other
    kernel: what fusing the elementwise work saved), and ``baseline_outside_gemm_s`` (the baseline's time outside
    GEMMs: the most fusion could save; None unless the baseline was profiled with times and passed or deviates).
    ``measured_pairs``: the rounds the two shared when timed together (None for separate windows; with fewer than
    the paired test needs, ``measured_verdict`` is "not tested"). ``removed``: what this backend's cost-model plan
    removes from the baseline's (:func:`compare.cost.model.removed`); empty when it fuses nothing, and then its time
    is never listed as a saving (:func:`fusion_section`, the summary).
    """
    results = doc.results
    rows = []
    for r in results:
        c = r.cost
        s = BACKENDS.get(r.backend)
        baseline = framework_baseline(s.framework) if s is not None else None
        if c is None or baseline is None or r.backend == baseline:
            continue
        base = same_machine(results, r, baseline, lambda b: b.cost)
        if base is None or base.cost is None:
            continue
        bc = base.cost
        k_r = r.kernels.kernels_per_step if r.kernels else None
        k_b = base.kernels.kernels_per_step if base.kernels else None
        ceil = ceilings_for(doc, r.dtype)
        why = _not_measured(r, base)
        t_r, t_b = (r.timing, base.timing) if not why else (None, None)
        split_b = kernel_time_split(base) if base.status in MEASURED else None
        split_r = kernel_time_split(r) if not why else None
        gemm_saved = outside_saved = None
        if split_r is not None and split_b is not None:
            gemm_saved, outside_saved = split_b[0] - split_r[0], split_b[1] - split_r[1]
        v = compare_timing(t_b, t_r) if t_r and t_b else None
        bytes_saved = bc.bytes - c.bytes
        extra_flops = c.flops - bc.flops
        rows.append(
            {
                "backend": r.backend,
                "baseline": baseline,
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
                "not_measured": why,
                "measured_saved_s": t_b.median_s - t_r.median_s if t_r and t_b else None,
                "measured_verdict": v.verdict if v else None,
                "measured_pairs": v.pairs if v else None,
                "removed": list(removed(c, bc)),
                "gemm_time_saved_s": gemm_saved,
                "outside_gemm_saved_s": outside_saved,
                "baseline_outside_gemm_s": split_b[1] if split_b is not None else None,
                "baseline_median_s": base.timing.median_s if base.timing else None,
                "median_s": r.timing.median_s if r.timing else None,
            }
        )
    return rows


def measured_saved(f: dict[str, Any]) -> str:
    """The measured saving of a fusion-benefit row: a number only when the difference is beyond noise."""
    if f.get("not_measured"):
        return f"- ({f['not_measured']})"
    if f["measured_saved_s"] is None:
        return "-"
    if f.get("measured_verdict") == WITHIN_NOISE:
        return WITHIN_NOISE
    if f.get("measured_verdict") == NOT_TESTED:
        return not_tested(f.get("measured_pairs"))
    return signed_s(f["measured_saved_s"])


def fusion_section(doc: Results) -> str:
    """Markdown: what fusion buys each backend over its framework's unfused baseline, predicted from bytes and
    measured side by side, the measured kernel time split into GEMMs and the rest. Only backends whose cost-model
    plan removes something from the baseline's (``removed``); the others are named under the table."""
    every = fusion_benefit(doc)
    rows = [f for f in every if f["removed"]]
    fuse_nothing = [f"{f['backend']} ({f['label']} {f['dtype']} {f['mode']})" for f in every if not f["removed"]]
    module = module_fusion_part(doc)
    if not rows and not fuse_nothing:
        return "## What fusion buys\n\n" + module if module else ""
    out = []
    for f in rows:
        kern = "-" if f["kernels_eliminated"] is None else str(f["kernels_eliminated"])
        out.append(
            [
                f["backend"],
                f["baseline"],
                f["label"],
                f["dtype"],
                f["mode"],
                f"{kern} (model {f['model_kernels_eliminated']})",
                ", ".join(f["not_materialized"]) or "none",
                si(f["intermediate_bytes_saved"], "B"),
                si(f["bytes_saved"], "B"),
                signed_s(f["predicted_saved_s"]),
                si(f["extra_flops"], "FLOP") if f["extra_flops"] else "0",
                signed_s(f["predicted_extra_flops_s"]) if f["extra_flops"] else "-",
                measured_saved(f),
                signed_s(f["gemm_time_saved_s"]),
                signed_s(f["outside_gemm_saved_s"]),
                fmt_s(f["baseline_median_s"]),
            ]
        )
    head = [
        "backend",
        "baseline",
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
        "GEMM kernel time saved",
        "other kernel time saved",
        "baseline median",
    ]
    intro = (
        "Each backend against its own framework's unfused baseline (one kernel per op, every intermediate in "
        "memory) on the same case, dtype and mode: what fusion saved within one framework. Speed across "
        "frameworks (GEMM libraries, dispatch) is the timing table's, never a saving here. Kernels eliminated: "
        "the baseline's profiled kernels per step minus this backend's ('-' where either was not "
        "profiled; the cost model's count in brackets). Bytes saved come from the cost model (below): "
        "intermediates no longer written and read back, and inputs read fewer times. Predicted saved = bytes "
        "saved / this machine's measured copy bandwidth; a backend that recomputes (extra GEMM FLOPs) pays "
        "them back at the measured matmul rate. Measured saved = the two medians' difference, shown only where "
        "it is beyond both runs' noise (the rule of `compare diff`: median ratio outside the band of both "
        "IQRs, quartiles apart, a Mann-Whitney test; timed together, the paired test by round), else 'within "
        "noise', or 'not tested (N rounds)' where the paired test had too few rounds to run; not measured where "
        "either result "
        "failed parity, erred or was not timed (the reason in brackets). Of the kernel time (both profiled with "
        "a time per kernel, else '-'): the baseline's GEMM kernels' time per step minus this backend's (a "
        "different GEMM, not fusion) and the same for every other kernel (what fusing the elementwise work "
        "saved). Negative means slower or more traffic."
    )
    none = (
        "Not listed, as their cost-model plan keeps every intermediate in memory and fuses nothing on that case "
        "and mode (a time they save is not fusion's): " + ", ".join(fuse_nothing) + "."
        if fuse_nothing
        else ""
    )
    body = "\n\n".join(x for x in (table(head, out) if out else "", none, module) if x)
    return "## What fusion buys\n\n" + intro + "\n\n" + body


def _saved_for_backward(r: Result) -> int | None:
    """The bytes a result's forward saved for its backward, where ``--memory`` measured them on a passing step."""
    if r.status not in MEASURED or r.memory is None or r.memory.saved is None:
        return None
    return r.memory.saved.bytes


def module_fusion_benefit(doc: Results) -> list[dict[str, Any]]:
    """:func:`fusion_benefit`'s measured half for a user's module (``--module``), whose backends have no cost-model
    plan: each backend against its framework's unfused baseline on a module case
    (:func:`compare.backends.registry.unfused_baseline`: the file's torch module eager, its ``jax_function`` op by
    op), same case, dtype and mode. Each row: ``backend, baseline, label, dtype, mode``, ``kernels_eliminated``
    (None unless both were profiled), ``saved_for_backward_saved`` (the baseline's saved-for-backward bytes minus
    this backend's; None unless ``--memory`` measured both), and the measured timing and kernel-time figures of
    :func:`fusion_benefit` (``not_measured``, ``measured_saved_s``, ``measured_verdict``, ``measured_pairs``,
    ``gemm_time_saved_s``, ``outside_gemm_saved_s``, ``baseline_median_s``)."""
    results = doc.results
    rows = []
    for r in results:
        s = BACKENDS.get(r.backend)
        if not unmodelled(r) or s is None:
            continue
        baseline = unfused_baseline(s.framework, r.model)
        if baseline is None or r.backend == baseline:
            continue
        base = same_machine(results, r, baseline, lambda b: b)
        if base is None:
            continue
        k_r = r.kernels.kernels_per_step if r.kernels else None
        k_b = base.kernels.kernels_per_step if base.kernels else None
        why = _not_measured(r, base)
        t_r, t_b = (r.timing, base.timing) if not why else (None, None)
        split_b = kernel_time_split(base) if base.status in MEASURED else None
        split_r = kernel_time_split(r) if not why else None
        gemm_saved = outside_saved = None
        if split_r is not None and split_b is not None:
            gemm_saved, outside_saved = split_b[0] - split_r[0], split_b[1] - split_r[1]
        v = compare_timing(t_b, t_r) if t_r and t_b else None
        sv_r, sv_b = _saved_for_backward(r), _saved_for_backward(base)
        rows.append(
            {
                "backend": r.backend,
                "baseline": baseline,
                "case": r.case,
                "label": case_label(r),
                "dtype": r.dtype,
                "mode": r.mode,
                "kernels_eliminated": k_b - k_r if k_r is not None and k_b is not None else None,
                "saved_for_backward_saved": sv_b - sv_r if sv_r is not None and sv_b is not None else None,
                "not_measured": why,
                "measured_saved_s": t_b.median_s - t_r.median_s if t_r and t_b else None,
                "measured_verdict": v.verdict if v else None,
                "measured_pairs": v.pairs if v else None,
                "gemm_time_saved_s": gemm_saved,
                "outside_gemm_saved_s": outside_saved,
                "baseline_median_s": base.timing.median_s if base.timing else None,
            }
        )
    return rows


def module_fusion_part(doc: Results) -> str:
    """Markdown: :func:`module_fusion_benefit` as a table with its intro ("" without a module row)."""
    every = module_fusion_benefit(doc)
    if not every:
        return ""
    out = []
    for f in every:
        sv = f["saved_for_backward_saved"]
        out.append(
            [
                f["backend"],
                f["baseline"],
                f["label"],
                f["dtype"],
                f["mode"],
                "-" if f["kernels_eliminated"] is None else str(f["kernels_eliminated"]),
                "-" if sv is None else si(sv, "B"),
                NOT_MODELLED,
                NOT_MODELLED,
                measured_saved(f),
                signed_s(f["gemm_time_saved_s"]),
                signed_s(f["outside_gemm_saved_s"]),
                fmt_s(f["baseline_median_s"]),
            ]
        )
    head = [
        "backend",
        "baseline",
        "case",
        "dtype",
        "mode",
        "kernels eliminated",
        "saved for backward saved",
        "bytes saved",
        "predicted saved (bytes / bandwidth)",
        "measured saved",
        "GEMM kernel time saved",
        "other kernel time saved",
        "baseline median",
    ]
    intro = (
        "A user's own MLP (`--module`): the bytes-and-FLOPs plan is not modelled for it, so what fusion saves in "
        "traffic, and the time that predicts, is not modelled. What is measured is shown against the module's own "
        "unfused baseline in the same framework (torch: its torch module eager, "
        f"{MODULE_FRAMEWORK_BASELINES['torch']}; JAX: its jax_function op by op, "
        f"{MODULE_FRAMEWORK_BASELINES['jax']}), same case, dtype and mode: kernels eliminated (the baseline's "
        "profiled kernels per step minus this backend's, '-' where either was not profiled), the "
        "bytes saved for the backward (the baseline's minus this backend's, where `--memory` measured both), "
        "the medians' difference (a number only where beyond both runs' noise, the rule of `compare diff`) and "
        "the profiled kernel time in GEMMs and outside them."
    )
    return intro + "\n\n" + table(head, out)


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
        if c.float32_route_flops_per_s is not None:  # a 16-bit dtype measured both ways: which one is the ceiling
            how += (
                f"; native {si(c.native_flops_per_s, 'FLOP/s')}, through float32 "
                f"{si(c.float32_route_flops_per_s, 'FLOP/s')}: the ceiling is the {c.route} route"
                + (" (native emulated here)" if c.matmul_emulated else "")
            )
        if c.aten_cpu_capability:
            how += f"; ATen CPU capability {c.aten_cpu_capability}"
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
                *lead(r),
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
    module = module_cost_part(doc)
    if not rows and not ceil_rows and not module:
        return ""
    parts = ["## Cost model and roofline"]
    if rows:
        head = [
            *LEAD,
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
            "FLOPs and bytes are modelled, not counted (compare/cost/model.py): FLOPs are the GEMMs' 2MNK; "
            "bytes assume each kernel reads each operand and writes each result once, so bytes moved is a "
            "lower bound for the unfused backends' real traffic. Achieved rates divide them by the measured "
            "median; a fraction above 100% means the step beat the single-shape ceiling below. Roofline time "
            "= max(FLOPs / peak FLOP/s, bytes / peak bandwidth)."
        )
        parts.append(intro + "\n\n" + table(head, rows) + ("\n\n" + "\n".join(assumed) if assumed else ""))
    if module:
        parts.append(module)
    if ceil_rows:
        parts.append(
            "Ceilings, measured on this machine through the shared timer (each rate from its fastest sample: a "
            "peak):\n\n" + table(["device", "dtype", "peak FLOP/s", "peak bytes/s", "ridge", "how measured"], ceil_rows)
        )
    return "\n\n".join(parts)


def module_cost_part(doc: Results) -> str:
    """Markdown: per result of a user's module (no cost-model plan), "not modelled" where the plan's figures would
    be, and the FLOPs its framework counted with the rate they make at the warm median ("" without such a row)."""
    rows = []
    for r in doc.results:
        if not unmodelled(r):
            continue
        m = measured_flops(r)
        rate = achieved_flops_per_s(r)
        ceil = ceilings_for(doc, r.dtype)
        of = f" ({rate / ceil.flops_per_s:.0%})" if rate is not None and ceil is not None else ""
        t = r.timing
        rows.append(
            [
                *lead(r),
                NOT_MODELLED,
                NOT_MODELLED,
                si(m.flops, "FLOP") if m else not_counted(r),
                m.source if m else "-",
                fmt_s(t.median_s) if t else "-",
                si(rate, "FLOP/s") + of if rate is not None else "-",
            ]
        )
    if not rows:
        return ""
    head = [*LEAD, "GEMM FLOPs", "bytes moved", "measured FLOPs", "counted by", "median", "achieved FLOP/s"]
    intro = (
        "A user's own MLP (`--module`): the bytes-and-FLOPs plan is not modelled for it (no bytes moved, "
        "intensity or roofline time). Its FLOPs are measured instead, over one profiled step of the mode: the "
        "torch backends' by `torch.utils.flop_counter` (torch flop_counter), which counts only matmuls, so "
        "elementwise FLOPs are not in it; the JAX backends' by XLA's `cost_analysis()` of the compiled step "
        f"(every op, elementwise included; {MODULE_FRAMEWORK_BASELINES['jax']}: its programs' sum). Achieved FLOP/s "
        "= measured "
        "FLOPs / the warm median (of the measured matmul ceiling where there is one); '-' where not profiled "
        "or not timed."
    )
    return intro + "\n\n" + table(head, rows)
