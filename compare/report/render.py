"""The markdown report: a pure function of a results document (:class:`~compare.results.document.Results`). It measures
nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compare.backends.registry import DEFAULT_BASELINE
from compare.formats.markdown import case_label, fmt_e, fmt_s, table
from compare.gpu_build.table import render_markdown
from compare.kernels.summary import Kernels
from compare.report.cost import cost_section, fusion_section
from compare.report.kernels import kernel_section
from compare.report.plots import plots_section
from compare.report.resolution import resolution_section
from compare.report.shapes import shapes_section
from compare.report.summary import summary_section
from compare.report.tp import tp_section
from compare.results.document import Result, Results
from compare.results.environment import ISA_FLAGS, Environment
from compare.timing.significance import PAIRED, WITHIN_NOISE, compare_timing

Row = list[str]
Rows = Sequence[Result]


def environment_section(env: Environment) -> str:
    rows = [
        ["platform", env.platform],
        ["CPU", f"{env.cpu} ({env.cpu_count} logical cores)"],
        ["GPU", env.gpu or "none"],
        ["versions", ", ".join(f"{k} {val}" for k, val in env.versions.items() if val)],
        ["threads", ", ".join(f"{k}={val}" for k, val in env.threads.items() if val != "")],
        ["precision", ", ".join(f"{k}={val}" for k, val in env.precision.items())],
        ["TRITON_INTERPRET", env.triton_interpret or "unset"],
    ]
    if env.cpu_isa is not None or env.blas or env.isa_caps:  # what decides the ceilings and the bits (newer runs)
        isa = "unknown" if env.cpu_isa is None else ", ".join(env.cpu_isa) or f"none of {', '.join(ISA_FLAGS)}"
        rows += [
            ["CPU instruction sets", isa],
            ["BLAS (numpy)", f"{env.blas or 'unknown'}, kernel {env.blas_core or 'unknown'}"],
            ["ISA caps", ", ".join(f"{k}={v}" for k, v in env.isa_caps.items() if v) or "none set"],
        ]
    return "## Environment\n\n" + table(["", ""], rows)


def _e_bound(value: float | None, bound: float | None) -> str:
    return f"{fmt_e(value)} ({fmt_e(bound)})"


def parity_section(results: Rows) -> str:
    """Every statistic of the gate (``compare.gate.parity``) per tensor, with the checks that failed."""
    rows = []
    for r in results:
        p = r.parity
        if p is None:
            continue
        last = p.last_timed
        for t in p.tensors:
            if t.tier == "pass":
                verdict = "pass"
            elif t.tier == "deviates":
                verdict = f"deviates ({', '.join(t.deviated)}): {t.cause}"
            else:
                verdict = "**FAIL** (" + ", ".join(t.failed) + f"): {t.cause}"
            if last and last.tier == "fail" and any(f.startswith(t.tensor + ":") for f in last.failures):
                verdict += " (last timed call: **FAIL**)"
            if p.fresh and p.fresh.tier == "fail" and any(f.startswith(t.tensor + ":") for f in p.fresh.failures):
                verdict += f" (fresh inputs, seed {p.fresh.seed}: **FAIL**)"
            rows.append(
                [
                    r.label,
                    case_label(r),
                    r.dtype,
                    r.mode,
                    t.tensor,
                    f"{fmt_e(t.max_abs_err)} ({fmt_e(t.bound)}; {fmt_e(t.max_fail)})",
                    f"{fmt_e(t.rms_err)} ({fmt_e(t.rms_bound)}; {fmt_e(t.rms_fail)})",
                    f"{fmt_e(t.mean_err)} vs {fmt_e(t.mean_plain)} ({fmt_e(t.mean_bound)}; {fmt_e(t.mean_fail)})",
                    f"{fmt_e(t.scale_err)} vs {fmt_e(t.scale_plain)} ({fmt_e(t.scale_bound)}; {fmt_e(t.scale_fail)})",
                    str(t.not_representable),
                    verdict,
                ]
            )
    head = [
        "backend",
        "case",
        "dtype",
        "mode",
        "tensor",
        "max abs err (pass line; fail line)",
        "rms err (pass line; fail line)",
        "mean err vs plain's (pass; fail line of the difference)",
        "scale err vs plain's (pass; fail line of the difference)",
        "values not in dtype",
        "parity",
    ]
    timed = any("last timed call" in r.parity.checked for r in results if r.parity is not None)
    fresh_checked = any(r.parity.fresh is not None for r in results if r.parity is not None)
    intro = (
        "Error against the float64 golden, every check of the gate (`compare/gate/parity.py`), each with a pass line "
        "and a fail line; between them a tensor *deviates*: a real, measured difference that an honest "
        "implementation can have, with its likely cause. Every line comes from a plain same-dtype computation's "
        "own error on the same case (float32 accumulation in a fixed order, the same bits on every machine). max: "
        "pass if max|err| <= 8 x plain max + one unit roundoff of max|ref|, fail beyond 8 x (2 x plain max + a "
        "unit roundoff), or 8 x the envelope's (the plain computation with float32 tanh/exp 4 ulp off) where "
        "larger. rms: pass if rms(err) <= 2.5 x plain rms (+ a tenth of a unit roundoff), fail as max. mean (a "
        "constant shift) and scale (the slope of err on ref: output = (1 + scale) x ref): pass if their difference "
        "from the plain computation's is within 5 cluster-robust standard errors, fail if it is beyond that plus "
        "one unit roundoff of the dtype (and 8 float32 ulps). Values not in dtype: outputs that are not values of "
        "the case dtype (computed or answered in a wider type), or that use no more bits than a narrower type, "
        "fail. The numbers are the first call's output"
        + (
            "; timed rows were checked again on the output of their last timed call, and a failure there is "
            "marked in the row."
            if timed
            else " (no row was timed, so no later output was checked)."
        )
        + (
            " Every row was also run once on fresh inputs (same shapes and distribution, a seed drawn at run time, "
            "its reference computed only after every step of the case had returned): a step that does not compute "
            "its answer from its inputs fails there, and that failure is marked in the row (a deviation found only "
            "there is recorded in results.json, not promoted: a fresh seed changes with every run)."
            if fresh_checked
            else ""
        )
    )
    return "## Parity\n\n" + intro + "\n\n" + table(head, rows)


def _baseline(results: Rows, r: Result) -> Result | None:
    for b in results:
        if b.backend == DEFAULT_BASELINE and b.case == r.case and b.mode == r.mode and b.timing is not None:
            return b
    return None


def speedup_cell(results: Rows, r: Result) -> str:
    """``r``'s speedup against the baseline on the same case and mode, e.g. ``1.52x``, only where the two timings
    differ beyond noise (:func:`compare.timing.significance.compare_timing`, the rule of ``compare diff``); else
    ``within noise``. ``baseline`` for the baseline itself, ``-`` where the baseline was not timed."""
    base = _baseline(results, r)
    if base is None or base.timing is None or r.timing is None:
        return "-"
    if base is r:
        return "baseline"
    v = compare_timing(base.timing, r.timing)
    mark = "" if v.design == PAIRED else ", unpaired"
    return (WITHIN_NOISE if v.verdict == WITHIN_NOISE else f"{1 / v.ratio:.2f}x") + mark


def timing_section(results: Rows) -> str:
    rows = []
    for r in results:
        t = r.timing
        if t is None:
            continue
        speedup = speedup_cell(results, r)
        flags = [x for x in ("noisy (IQR > 10% of median)" if t.noisy else "", r.note) if x]
        rows.append(
            [
                r.label,
                case_label(r),
                r.dtype,
                r.mode,
                fmt_s(t.median_s),
                fmt_s(t.iqr_s),
                fmt_s(t.min_s),
                f"{t.n} x {t.calls_per_sample}",
                t.design,
                fmt_s(t.first_call_s),
                speedup,
                "; ".join(flags),
            ]
        )
    head = [
        "backend",
        "case",
        "dtype",
        "mode",
        "median",
        "IQR",
        "min",
        "n x calls",
        "design",
        "first call",
        "vs eager",
        "notes",
    ]
    intro = (
        f"Per call, steady state, after warm-up; every sample ends with a full device sync. "
        f"First call (compile + run) apart. The backends of one case, dtype and mode are timed together, in "
        f"rounds of one sample each in a random order (design 'interleaved'), so that load drift hits them alike. "
        f"Speedup is {DEFAULT_BASELINE}'s median over this one's, shown only where the two differ beyond noise "
        f"(`compare.timing.significance`: median ratio outside the band of both IQRs and, for an interleaved pair, an "
        f"exact signed-rank test on the rounds' paired log ratios, which stays at its nominal rate under any load; "
        f"a pair timed in separate windows, e.g. a tensor-parallel group's rows, is marked 'unpaired' and gets "
        f"the rule of `compare diff`: quartiles apart and a Mann-Whitney test); else 'within noise'."
    )
    untimed = [
        f"- {r.label} ({case_label(r)}, {r.dtype}, {r.mode}): not timed: {r.note}"
        for r in results
        if r.status in ("ok", "deviates", "parity-fail", "implausible") and r.timing is None
    ]
    return "## Timing\n\n" + intro + "\n\n" + table(head, rows) + ("\n\n" + "\n".join(untimed) if untimed else "")


def modes_section(results: Rows) -> str:
    """One row per (backend, case, dtype), a column per timed mode: median (and speedup against eager, or "within
    noise")."""
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if any(r.mode == m and r.timing for r in results)]
    if len(modes) < 2:
        return ""
    keys: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str, str], str] = {}
    for r in results:
        if r.timing is None:
            continue
        key = (r.label, r.case, r.dtype)
        if key not in keys:
            keys.append(key)
        speed = speedup_cell(results, r)
        shown = f" ({speed})" if speed not in ("-", "baseline") else ""
        cells[(*key, r.mode)] = fmt_s(r.timing.median_s) + shown
    label = {r.case: case_label(r) for r in results}
    rows = [[b, label[c], d, *(cells.get((b, c, d, m), "-") for m in modes)] for b, c, d in keys]
    return (
        f"## Timing by mode\n\nMedian per call (speedup against {DEFAULT_BASELINE}, where beyond noise).\n\n"
        + table(["backend", "case", "dtype", *modes], rows)
    )


def xla_check_section(results: Rows) -> str:
    """The cost model against XLA's own ``cost_analysis()`` of the compiled executable, for JAX backends."""
    rows = []
    for r in results:
        xla, cost = r.kernels.xla_cost if r.kernels else None, r.cost
        if not xla or cost is None or xla.get("flops") is None:
            continue
        fr = xla["flops"] / cost.flops if cost.flops else float("nan")
        xb = xla.get("bytes_accessed")
        br = f"{xb / cost.bytes:.2f}" if xb and cost.bytes else "-"
        rows.append(
            [
                r.label,
                case_label(r),
                r.dtype,
                r.mode,
                f"{cost.flops:.4g}",
                f"{xla['flops']:.4g}",
                f"{fr:.3f}",
                f"{cost.bytes:.4g}",
                "-" if xb is None else f"{xb:.4g}",
                br,
            ]
        )
    if not rows:
        return ""
    intro = (
        "Model GEMM FLOPs and bytes against XLA's `cost_analysis()` of the same compiled step. XLA also counts "
        "elementwise FLOPs (a ratio a little above 1), and its bytes count every operand of every HLO op it "
        "keeps, which is not the same as DRAM traffic."
    )
    head = [
        "backend",
        "case",
        "dtype",
        "mode",
        "model FLOPs",
        "XLA FLOPs",
        "XLA/model",
        "model bytes",
        "XLA bytes accessed",
        "XLA/model",
    ]
    return "## Cost model against XLA's cost analysis\n\n" + intro + "\n\n" + table(head, rows)


def _steps_note(k: Kernels) -> str:
    return "" if k.steps is None else f", {k.steps} recorded step{'s' if k.steps != 1 else ''}"


def traces_section(results: Rows) -> str:
    """Links to the profiler traces a run wrote (paths relative to the report's folder)."""
    rows = [
        f"- {r.label} ({case_label(r)}, {r.dtype}, {r.mode}): [{r.kernels.trace}]({r.kernels.trace})"
        + _steps_note(r.kernels)
        for r in results
        if r.kernels is not None and r.kernels.trace
    ]
    if not rows:
        return ""
    intro = (
        "Chrome/Perfetto traces: open in https://ui.perfetto.dev or chrome://tracing "
        "(torch: `torch.profiler`, recorded steps as each line says; JAX: `jax.profiler`)."
    )
    return "## Traces\n\n" + intro + "\n\n" + "\n".join(rows)


def problems_section(results: Rows) -> str:
    """Every result that is not a clean pass: skipped, failed, errors, and timings flagged implausible."""
    bad = [r for r in results if r.status != "ok" or r.implausible]
    if not bad:
        return "## Skipped, failed and implausible\n\nNone: every backend ran and passed parity."
    rows = [
        [
            r.label,
            case_label(r),
            r.dtype,
            r.mode,
            r.status + (" (timing implausible)" if r.implausible else ""),
            "; ".join(x for x in (r.reason, r.implausible) if x).replace("|", "\\|"),
        ]
        for r in bad
    ]
    return "## Skipped, failed and implausible\n\n" + table(
        ["backend", "case", "dtype", "mode", "status", "reason"], rows
    )


def summary(doc: Results) -> str:
    """Counts by status, e.g. ``3 ok, 1 skipped`` (:meth:`Results.summary`)."""
    return doc.summary()


#: Report sections in order. Later issues add sections here; each is a pure function of the document.
SECTIONS: list[Callable[[Results], str]] = [
    summary_section,
    lambda d: environment_section(d.environment),
    lambda d: parity_section(d.results),
    lambda d: resolution_section(d.resolution),
    lambda d: timing_section(d.results),
    lambda d: modes_section(d.results),
    lambda d: tp_section(d.results),
    kernel_section,
    fusion_section,
    cost_section,
    lambda d: xla_check_section(d.results),
    shapes_section,
    lambda d: traces_section(d.results),
    lambda d: plots_section(d),
    lambda d: render_markdown(d.gpu_build).rstrip() if d.gpu_build else "",
    lambda d: problems_section(d.results),
]


def render(doc: Results) -> str:
    """The whole ``REPORT.md`` for a results document."""
    head = [
        "# fusion-compare report",
        "",
        f"Run {doc.created}: {doc.summary()}.",
        f"Command: `{doc.config.command}`" if doc.config.command else "",
    ]
    body = [section(doc) for section in SECTIONS]
    return "\n".join(x for x in head if x is not None) + "\n\n" + "\n\n".join(b for b in body if b) + "\n"
