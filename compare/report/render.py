"""The markdown report: a pure function of a results document (:class:`~compare.results.document.Results`). It measures
nothing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from compare.backends.registry import MODULE_BASELINE, baselines_said
from compare.formats.codec import from_json
from compare.formats.markdown import case_label, fmt_e, fmt_s, table
from compare.gate.parity import WHERE_FAIL, WHERE_MIN
from compare.kernels import busy
from compare.report.cells import LEAD, lead, signed_s
from compare.report.cost import cost_section, fusion_section
from compare.report.gpu_build import render_markdown
from compare.report.kernels import kernel_section
from compare.report.layers import layers_section
from compare.report.machines import machine_of, several, timed_machine_types
from compare.report.measured import FLOP_COUNTER, NOT_MODELLED, XLA_COST, measured_flops, unmodelled
from compare.report.memory import memory_section
from compare.report.plots import plots_section
from compare.report.resolution import resolution_section
from compare.report.shapes import shapes_section
from compare.report.summary import Link, module_line, speedup_cell, summary_section, untimed_reason, weights_line
from compare.report.tp import tp_section
from compare.results.document import Result, Results
from compare.results.environment import ISA_FLAGS, Environment
from compare.results.load import BUSY_SHARE, Load
from compare.timing import nvml
from compare.timing.budget_record import PHASES, REST, BudgetRecord
from compare.timing.llc import ColdSetup
from compare.timing.significance import MIN_PAIRS, compare_timing

Row = list[str]
Rows = Sequence[Result]


def _cpu(env: Environment) -> str:
    """The CPU and its logical cores (``os.cpu_count()`` may not know them: then the CPU alone)."""
    return f"{env.cpu} ({env.cpu_count} logical cores)" if env.cpu_count else env.cpu


def environment_section(env: Environment, load: Load | None = None) -> str:
    """The platform, versions and settings; with the machine's load over the measurements and what the run added to
    the data cache where the run recorded them (``compare.results.load``, ``DataCacheUse``; a run before they were
    recorded shows no row)."""
    rows = [
        ["platform", env.platform],
        ["CPU", _cpu(env)],
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
    if load is not None:
        rows.append(["machine load", load.describe()])
    if env.data_cache is not None:
        rows.append(["data cache", env.data_cache.describe()])
    return "## Environment\n\n" + table(["", ""], rows)


def load_note(load: Load | None) -> str:
    """The timing table's line on the machine's load ("" where not recorded): what others took and, on a busy machine
    (more than :data:`~compare.results.load.BUSY_SHARE` of it), that the spread shown understates the noise."""
    if load is None:
        return ""
    busy = (
        f" Busy (others took more than {BUSY_SHARE:.0%} of the cores' time): a step shared its cores with work this "
        "run did not see, so its times and their spread are wider than on a quiet machine, and a difference to "
        "another run is only as good as the quieter of the two."
        if load.busy
        else ""
    )
    return f"Machine load over the measurements: {load.describe()}.{busy}"


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
                some = f", {p.fresh.rows} tokens drawn by seed {p.fresh.rows_seed}" if p.fresh.rows else ""
                verdict += f" (fresh inputs, seed {p.fresh.seed}{some}: **FAIL**)"
            same = r.extras.get("deterministic")
            rows.append(
                [
                    *lead(r),
                    t.tensor,
                    f"{fmt_e(t.max_abs_err)} ({fmt_e(t.bound)}; {fmt_e(t.max_fail)})",
                    f"{fmt_e(t.rms_err)} ({fmt_e(t.rms_bound)}; {fmt_e(t.rms_fail)})",
                    f"{fmt_e(t.mean_err)} vs {fmt_e(t.mean_plain)} ({fmt_e(t.mean_bound)}; {fmt_e(t.mean_fail)})",
                    f"{fmt_e(t.scale_err)} vs {fmt_e(t.scale_plain)} ({fmt_e(t.scale_bound)}; {fmt_e(t.scale_fail)})",
                    str(t.not_representable),
                    "-" if same is None else ("yes" if same else "**no**"),
                    verdict,
                ]
            )
    head = [
        *LEAD,
        "tensor",
        "max abs err (pass line; fail line)",
        "rms err (pass line; fail line)",
        "mean err vs plain's (pass; fail line of the difference)",
        "scale err vs plain's (pass; fail line of the difference)",
        "values not in dtype",
        "same bits twice",
        "parity",
    ]
    timed = any("last timed call" in r.parity.checked for r in results if r.parity is not None)
    fed = [r.parity.fresh for r in results if r.parity and r.parity.fresh and r.parity.fresh.made is not None]
    fresh_checked = any(r.parity.fresh is not None for r in results if r.parity is not None)
    some_rows = sorted({r.parity.fresh.rows for r in results if r.parity and r.parity.fresh and r.parity.fresh.rows})
    intro = (
        "Error against the float64 golden, every check of the gate (`compare/gate/parity.py`), each with a pass line "
        "and a fail line; between them a tensor *deviates*: a real, measured difference that an honest "
        "implementation can have, with what its checks measured: a cause where a fit measures one, else an "
        "unexplained deviation and the statistics that deviated, in numbers. Every line comes from a plain "
        "same-dtype computation's own error on the same case (float32 accumulation in a fixed order, the same bits "
        "on every machine). max: "
        "pass if max|err| <= 8 x plain max + one unit roundoff of max|ref|, fail beyond 8 x (2 x plain max + a "
        "unit roundoff), or 8 x the envelope's (the plain computation with float32 tanh/exp 4 ulp off) where "
        "larger. rms: pass if rms(err) <= 2.5 x plain rms (+ a tenth of a unit roundoff), fail as max. mean (a "
        "constant shift) and scale (the slope of err on ref: output = (1 + scale) x ref): pass if their difference "
        "from the plain computation's is within 5 cluster-robust standard errors, fail if it is beyond that plus "
        "one unit roundoff of the dtype (and 8 float32 ulps). where (not a column): once the rms error is past its "
        "pass line, fail if the rms error over the tenth of elements with the smallest |ref| is more than "
        f"{WHERE_FAIL:g} x the "
        "rms error over all (rounding puts the least error there; zeroed or cut-off small outputs the most), "
        f"judged where that tenth holds {WHERE_MIN} elements or more. "
        "Values not in dtype: outputs that are not values of "
        "the case dtype (computed or answered in a wider type), or that use no more bits than a narrower type, "
        "fail. Same bits twice: the step's second call on the same (golden) inputs gave the first call's bits. "
        "The numbers are the first call's output"
        + (
            "; timed rows were checked again on the output of their last timed call, and a failure there is "
            "marked in the row."
            if timed
            else "."
        )
        + (
            " Every later call (warm-up, sizing, timed samples; one call for an untimed row) ran on inputs the "
            "harness made: the case's fresh draw (same shapes and distribution, a seed drawn at run time) with its "
            "tokens in an order of the call's own, no two calls alike, its buffers overwritten before any output "
            f"was read; {min(f.judged or 0 for f in fed)} to {max(f.judged or 0 for f in fed)} outputs a row, chosen "
            "at random after the calls returned, were judged against the draw's reference, computed only after "
            "every step of the case had returned"
            if fed
            else ""
        )
        + (
            (
                ""
                if fed
                else " Every row was also run once on fresh inputs (same shapes and distribution, a seed drawn at "
                "run time, its reference computed only after every step of the case had returned"
            )
            + (
                f"; a forward alone judged on {', '.join(map(str, some_rows))} of its tokens where it has more, "
                "drawn at random only then"
                if some_rows
                else ""
            )
            + (
                ": a step that does not compute its answer from its inputs, answers a repeated input from memory "
                "or computes only when its output is read fails there"
                if fed
                else "): a step that does not compute its answer from its inputs fails there"
            )
            + ", and that failure is marked in the row (a deviation found only there is recorded in results.json, "
            "not promoted: a fresh seed changes with every run)."
            if fresh_checked
            else ""
        )
    )
    kinds = {m for r in results if r.parity is not None and (m := machine_of(r)) is not None}
    if len(kinds) > 1:
        intro += (
            f" These rows were measured on {len(kinds)} machine types (listed in the summary): parity is judged "
            "against the same float64 golden with the same machine-independent bounds on every machine, so the "
            "verdicts compare across machines; the timings do not, and the timing section groups them by machine type."
        )
    return "## Parity\n\n" + intro + "\n\n" + table(head, rows)


def _cold_cells(r: Result) -> list[str]:
    """The cold median, its IQR and the cold/warm ratio (``within noise`` where the two do not differ beyond it, by
    the unpaired rule: they are timed in separate rounds); ``-`` where no cold timing was made."""
    c, t = r.cold, r.timing
    if c is None or t is None:
        return ["-", "-", "-"]
    v = compare_timing(t, c)
    return [fmt_s(c.median_s), fmt_s(c.iqr_s) + f" (n {c.n})", v.said(f"{v.ratio:.2f}x")]


def _kernel_cells(r: Result) -> list[str]:
    """Kernel time per step (overlaps merged), its split (GEMM / fused / unfused elementwise / collective / other,
    as shares of it) and the framework overhead (warm wall minus kernel time); ``-`` where the profile has no
    times. A kernel time above the wall time beyond the margin is marked (the profiler's cost, or load)."""
    k = r.kernels.kernel_time if r.kernels is not None else None
    t = r.timing
    if k is None or t is None:
        return ["-", "-", "-"]
    sp = busy.split(k, t.median_s)
    parts = [
        f"{name} {sp[name + '_share']:.0%}"
        for name in ("gemm", "fused", "unfused", "collective", "other")
        if sp[name + "_share"] >= 0.005
    ]
    mark = "" if k.consistent(t.median_s) else f" (> wall by more than {busy.CONSISTENT_MARGIN:.0%})"
    return [fmt_s(sp["busy_s"]) + mark, ", ".join(parts) or "-", signed_s(sp["overhead_s"])]


def _device_notes(r: Result) -> list[str]:
    """A row's CUDA-graph outcome and its warm window's GPU telemetry (``compare.timing.nvml``): clocks, power,
    energy per call, and **throttled** with the reasons where NVML saw a slowdown."""
    out = []
    if isinstance(r.extras.get("cuda_graph"), str):
        out.append("CUDA graph: " + r.extras["cuda_graph"])
    tele = r.extras.get("telemetry")
    if isinstance(tele, dict):
        t = from_json(nvml.Telemetry, tele)
        parts = [f"{t.samples} NVML samples"]
        if t.sm_clock_mhz is not None:
            parts.append(f"SM clock {t.sm_clock_mhz.median:.0f} MHz")
        if t.power_w is not None:
            parts.append(f"{t.power_w.median:.0f} W")
        if t.energy_per_call_j is not None:
            parts.append(f"{t.energy_per_call_j:.3g} J/call" + ("" if t.energy_reliable else " (unreliable)"))
        if t.throttled:
            parts.append("**throttled**: " + ", ".join(t.throttle_reasons))
        out.append("; ".join(parts))
    return out


def budget_head(budget: BudgetRecord) -> str:
    """The time budget, what the measurements took and where (one line; :func:`budget_note` adds the cuts)."""
    over = f", {budget.overrun_s:.0f} s over it (parity is never cut)" if budget.overrun_s > 0 else ""
    spent = ""
    if budget.phases:
        parts = [f"{PHASES[name]} {fmt_s(s)}" for name, s in budget.phases.items()]
        parts.append(f"{REST} {fmt_s(budget.rest_s)}")
        spent = f" Where it went: {', '.join(parts)}."
    return f"Time budget: {budget.total_s:.0f} s, measurements took {budget.spent_s:.0f} s{over}.{spent}"


def budget_note(budget: BudgetRecord) -> str:
    """:func:`budget_head` and what was cut to keep to the budget, one per line."""
    cuts = "".join(f"\n  - {c}" for c in budget.cuts) or "\n  - nothing was cut"
    return f"{budget_head(budget)} Cut:{cuts}"


def _untimed(r: Result) -> bool:
    return r.status in ("ok", "deviates", "parity-fail", "implausible") and r.timing is None


def grouped(results: Iterable[Result], reason: Callable[[Result], str]) -> list[str]:
    """One list line per reason, said once: the backends it holds for, each with its cells (dtype and mode, the case
    too where the rows have several)."""
    rows = list(results)
    cases = len({r.case for r in rows}) > 1
    by: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        cell = (f"{case_label(r)} " if cases else "") + f"{r.dtype} {r.mode}"
        by.setdefault(reason(r) or "no reason recorded", {}).setdefault(r.label, []).append(cell)
    return [
        "- " + ", ".join(f"{b} ({', '.join(cells)})" for b, cells in who.items()) + f": {why}"
        for why, who in by.items()
    ]


def timing_section(
    results: Rows,
    cold: ColdSetup | None = None,
    budget: BudgetRecord | None = None,
    telemetry: str = "",
    load: Load | None = None,
) -> str:
    rows: dict[str | None, list[Row]] = {}
    for r in results:
        t = r.timing
        if t is None:
            continue
        flags = [x for x in ("noisy (IQR > 10% of median)" if t.noisy else "", r.note, *_device_notes(r)) if x]
        rows.setdefault(machine_of(r) if several(results) else None, []).append(
            [
                *lead(r),
                fmt_s(t.median_s),
                fmt_s(t.iqr_s),
                fmt_s(t.min_s),
                f"{t.n} x {t.calls_per_sample}",
                t.design,
                *_cold_cells(r),
                *_kernel_cells(r),
                fmt_s(t.first_call_s),
                speedup_cell(results, r),
                "; ".join(flags),
            ]
        )
    head = [
        *LEAD,
        "warm median",
        "IQR",
        "min",
        "n x calls",
        "design",
        "cold median",
        "cold IQR",
        "cold / warm",
        "kernel time",
        "kernel time split",
        "overhead",
        "first call",
        "vs baseline",
        "notes",
    ]
    intro = (
        f"Per call, steady state, after warm-up; every sample ends with a full device sync. "
        f"First call (compile + run) apart. The backends of one case, dtype and mode are timed together, in "
        f"rounds of one sample each in a random order (design 'interleaved'), so that load drift hits them alike. "
        f"Speedup is the baseline's ({baselines_said(r.model for r in results)}) median over this one's, shown "
        f"only where the two differ beyond noise "
        f"(`compare.timing.significance`: median ratio outside the band of both IQRs and, for an interleaved pair, an "
        f"exact signed-rank test on the rounds' paired log ratios, which stays at its nominal rate under any load; "
        f"a pair timed in separate windows, e.g. a tensor-parallel group's rows, is marked 'unpaired' and gets "
        f"the rule of `compare diff`: quartiles apart and a Mann-Whitney test); else 'within noise', or 'not "
        f"tested (N rounds)' where a pair shares fewer rounds than the signed-rank test needs ({MIN_PAIRS}). "
        f"Warm: the caches hold what the previous call left there. Cold: each sample is one call right after a "
        f"flush of the last-level cache (its own time left out), in rounds in a random order too; 'cold / warm' is "
        f"the ratio of the medians, by the unpaired rule. Kernel time: the profiled step's kernels with overlapping "
        f"intervals merged (`compare.kernels.busy`), split by kind as shares of it; overhead: the warm median minus "
        f"it (what the framework spends outside kernels: dispatch, Python, allocation; negative where the profiled "
        f"kernels took longer than the unprofiled step)."
    )
    notes = []
    if cold is not None:
        where = (
            f"a level-{cold.cache.level} cache of {cold.cache.bytes / 2**20:.0f} MiB ({cold.cache.source})"
            if cold.cache is not None
            else "no cache size listed by the OS"
        )
        notes.append(
            f"Cold caches ('{cold.mode}'): {where}; the flush is {cold.flush_about} ({cold.flush_bytes / 2**20:.0f} "
            f"MiB, {fmt_s(cold.flush_s)} each, outside every sample). On a VM the cache is the host's, shared with its "
            f"other guests."
        )
    else:
        notes.append("Cold caches: not measured in this run (`--cache warm`).")
    if telemetry:
        notes.append(f"GPU telemetry: {telemetry}.")
    if load is not None:
        notes.append(load_note(load))
    if budget is not None:
        notes.append(budget_note(budget))
    untimed = grouped((r for r in results if _untimed(r)), untimed_reason)
    cached = [
        f"- {r.label} ({case_label(r)}, {r.dtype}, {r.mode}): parity reused from the interpreted-parity cache "
        f"(made {r.extras['parity_cache'].get('created', '?')}; same kernel sources, case, versions and CPU)"
        for r in results
        if isinstance(r.extras.get("parity_cache"), dict)
    ]
    tail = "\n\n".join(x for x in ("Not timed:\n\n" + "\n".join(untimed) if untimed else "", "\n".join(cached)) if x)
    if several(results):  # one table per machine type, each row's speedup against the baseline of its own type
        notes.append(
            "The rows were measured on several machine types: one table per type, each speedup against "
            f"{baselines_said(r.model for r in results)} on the same type; no speedup is computed across two machine "
            "types."
        )
        tables = "\n\n".join(
            f"### On {m or 'a machine not recorded'}\n\n" + table(head, rows[m]) for m in timed_machine_types(results)
        )
    else:
        tables = table(head, rows.get(None, []))
    return "## Timing\n\n" + intro + "\n\n" + "\n\n".join(notes) + "\n\n" + tables + ("\n\n" + tail if tail else "")


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
        f"## Timing by mode\n\nMedian per call (speedup against {baselines_said(r.model for r in results)}, where "
        "beyond noise).\n\n" + table(["backend", "case", "dtype", *modes], rows)
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
                *lead(r),
                f"{cost.flops:.4g}",
                f"{xla['flops']:.4g}",
                f"{fr:.3f}",
                f"{cost.bytes:.4g}",
                "-" if xb is None else f"{xb:.4g}",
                br,
            ]
        )
    module = module_xla_part(results)
    if not rows:
        return "## Cost model against XLA's cost analysis\n\n" + module if module else ""
    intro = (
        "Model GEMM FLOPs and bytes against XLA's `cost_analysis()` of the same compiled step. XLA also counts "
        "elementwise FLOPs (a ratio a little above 1), and its bytes count every operand of every HLO op it "
        "keeps, which is not the same as DRAM traffic."
    )
    head = [
        *LEAD,
        "model FLOPs",
        "XLA FLOPs",
        "XLA/model",
        "model bytes",
        "XLA bytes accessed",
        "XLA/model",
    ]
    body = intro + "\n\n" + table(head, rows) + ("\n\n" + module if module else "")
    return "## Cost model against XLA's cost analysis\n\n" + body


def module_xla_part(results: Rows) -> str:
    """Markdown: a user's module's JAX results, no cost-model plan: XLA's FLOPs and bytes beside the FLOPs
    ``torch.utils.flop_counter`` counted for its torch module (the module baseline) on the same case and
    mode ("" without such a row)."""
    rows = []
    for r in results:
        m = measured_flops(r)
        if not unmodelled(r) or m is None or m.source != XLA_COST or r.kernels is None:
            continue
        xla = r.kernels.xla_cost or {}
        torch_row = next(
            (
                b
                for b in results
                if unmodelled(b) and (b.case, b.mode) == (r.case, r.mode) and b.backend == MODULE_BASELINE
            ),
            None,
        )
        t = measured_flops(torch_row) if torch_row is not None else None
        t = t if t is not None and t.source == FLOP_COUNTER else None
        xb = xla.get("bytes_accessed")
        rows.append(
            [
                *lead(r),
                NOT_MODELLED,
                f"{m.flops:.4g}",
                "-" if t is None else f"{t.flops:.4g}",
                "-" if t is None or not t.flops else f"{m.flops / t.flops:.3f}",
                NOT_MODELLED,
                "-" if xb is None else f"{xb:.4g}",
            ]
        )
    if not rows:
        return ""
    intro = (
        "A user's own MLP (`--module`): the bytes-and-FLOPs plan is not modelled for it, so XLA's `cost_analysis()` "
        f"of the step is set beside the FLOPs `torch.utils.flop_counter` counted for its torch module "
        f"({MODULE_BASELINE}) on the same case and mode. The flop counter counts only matmuls; XLA counts "
        "elementwise FLOPs too (a ratio a little above 1)."
    )
    head = [
        *LEAD,
        "model FLOPs",
        "XLA FLOPs",
        "torch flop_counter FLOPs",
        "XLA/flop_counter",
        "model bytes",
        "XLA bytes accessed",
    ]
    return intro + "\n\n" + table(head, rows)


def traces_section(results: Rows) -> str:
    """Links to the profiler traces a run wrote (paths relative to the report's folder)."""
    rows = [
        f"- {r.label} ({case_label(r)}, {r.dtype}, {r.mode}): [{r.kernels.trace}]({r.kernels.trace})"
        + ("" if (n := r.kernels.steps) is None else f", {n} recorded step{'s' if n != 1 else ''}")
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


def _earlier_attempts(r: Result) -> str:
    """A sweep row that ran again after its worker or node was lost (``compare.cluster.ray_engine``): its attempt and
    the causes of the earlier ones; ``""`` for a row measured at its first attempt."""
    earlier = r.extras.get("earlier_attempts")
    if not isinstance(earlier, list) or not earlier:
        return ""
    return f"attempt {r.extras.get('attempt', len(earlier) + 1)}, after: " + "; ".join(map(str, earlier))


def problems_section(results: Rows) -> str:
    """Every result that is not a clean pass: skipped, failed, errors, timings flagged implausible, and cells that
    ran again after their worker or node was lost."""
    bad = [r for r in results if r.status != "ok" or r.implausible or _earlier_attempts(r)]
    if not bad:
        return "## Skipped, failed and implausible\n\nNone: every backend ran and passed parity."
    rows = [
        [
            *lead(r),
            r.status + (" (timing implausible)" if r.implausible else ""),
            "; ".join(x for x in (r.reason, r.implausible, _earlier_attempts(r)) if x).replace("|", "\\|"),
        ]
        for r in bad
    ]
    return "## Skipped, failed and implausible\n\n" + table([*LEAD, "status", "reason"], rows)


def machine_line(doc: Results, to: Link) -> str:
    """The machine in one line: CPU, GPU, the framework versions and the load over the measurements."""
    env = doc.environment
    versions = ", ".join(f"{k} {v}" for k, v in env.versions.items() if v and k in ("torch", "jax", "triton"))
    load = f"; load: {doc.load.describe()}" if doc.load is not None else ""
    where = to("Environment", "environment")
    return f"Machine: {_cpu(env)}, GPU {env.gpu or 'none'}; {versions}{load} ({where})."


def cut_section(doc: Results, to: Link) -> str:
    """What was cut or skipped, grouped by reason (:func:`grouped`): rows skipped or in error, rows not timed, the
    time budget's cuts, caches not measured cold, and a GPU build table left to its own report on a CPU run."""
    rs = doc.results
    parts = [
        f"- {what}:\n" + "\n".join("  " + x for x in lines)
        for what, lines in (
            ("Skipped", grouped((r for r in rs if r.status == "skipped"), lambda r: r.reason)),
            ("Error", grouped((r for r in rs if r.status == "error"), lambda r: r.reason)),
            ("Not timed", grouped((r for r in rs if _untimed(r)), untimed_reason)),
        )
        if lines
    ]
    if doc.budget is not None and (doc.budget.cuts or doc.budget.overrun_s > 0):  # its cuts one per line: DETAILS
        head = budget_head(doc.budget)
        n = len(doc.budget.cuts)
        parts.append(f"- {head} {n} cut{'s' * (n != 1)}, each in {to('Timing', 'the timing details')}.")
    if doc.cold is None:
        parts.append("- Cold caches: not measured in this run (`--cache warm`).")
    if doc.gpu_build and not doc.environment.gpu:
        parts.append(
            "- GPU build table: not shown on a CPU run; it is in `results.json` and in the GPU build report "
            "(`reports/gpu-build`, made by `python -m compare gpu-build`)."
        )
    every = to("Skipped, failed and implausible", "every row that is not a clean pass")
    return (
        "## Cut and skipped\n\n" + ("\n".join(parts) or "Nothing was cut or skipped.") + f"\n\nIn the details: {every}."
    )


#: The sections of ``DETAILS.md`` in order; each is a pure function of the document ("" where it has nothing).
SECTIONS: list[Callable[[Results], str]] = [
    lambda d: environment_section(d.environment, d.load),
    lambda d: parity_section(d.results),
    lambda d: resolution_section(d.resolution),
    lambda d: timing_section(d.results, d.cold, d.budget, d.telemetry, d.load),
    lambda d: modes_section(d.results),
    lambda d: tp_section(d.results),
    kernel_section,
    fusion_section,
    cost_section,
    memory_section,
    lambda d: xla_check_section(d.results),
    shapes_section,
    lambda d: traces_section(d.results),
    lambda d: render_markdown(d.gpu_build).rstrip() if d.gpu_build and d.environment.gpu else "",
    lambda d: problems_section(d.results),
]

REPORT, DETAILS = "REPORT.md", "DETAILS.md"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, every character but letters, digits, ``_``, ``-`` and spaces
    dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md: str) -> set[str]:
    """Every heading's anchor in a markdown text; a repeated heading's gets GitHub's ``-1``, ``-2`` suffix."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in md.splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            s = slug(m[1])
            n = seen[s] = seen.get(s, -1) + 1
            out.add(f"{s}-{n}" if n else s)
    return out


def files(doc: Results, report_name: str = REPORT, details_name: str = DETAILS) -> dict[str, str]:
    """The report as files, name -> text: ``REPORT.md`` (one page: a checkpoint's layers side by side where the run
    has two or more, the answer with its per-backend tables, the machine, the plots, what was cut or skipped) and
    ``DETAILS.md`` beside it (every other section), linked from it by section title (other names: the links follow
    them)."""
    REPORT, DETAILS = report_name, details_name  # the module's names, as this call has them
    body = "\n\n".join(b for b in (section(doc) for section in SECTIONS) if b)
    details = f"# fusion-compare report: details\n\nThe sections [{REPORT}]({REPORT}) links to.\n\n{body}\n"
    titles = [line[3:] for line in details.splitlines() if line.startswith("## ")]

    def to(title: str, text: str) -> str:
        return f"[{text}]({DETAILS}#{slug(title)})" if title in titles else text

    head = [
        "# fusion-compare report",
        "",
        f"Run {doc.created}: {doc.summary()}."
        if not doc.interrupted
        else f"**Run {doc.created}: {doc.cut_short()}**: {doc.summary() or 'none finished'}.",
        f"Command: `{doc.config.command}`" if doc.config.command else "",
        *([f"Data cache: {doc.environment.data_cache.describe()}."] if doc.environment.data_cache else []),
        "",
        machine_line(doc, to),
    ]
    for line in (module_line(doc), weights_line(doc)):
        head += ["", line] if line else []
    index = f"## Details\n\n[{DETAILS}]({DETAILS}) holds the rest: " + " · ".join(to(t, t) for t in titles) + "."
    parts = (layers_section(doc), summary_section(doc, to), plots_section(doc), cut_section(doc, to), index)
    report = "\n".join(head) + "\n\n" + "\n\n".join(b for b in parts if b) + "\n"
    return {REPORT: report, DETAILS: details}


def render(doc: Results) -> str:
    """``REPORT.md``'s text (:func:`files` has ``DETAILS.md`` too)."""
    return files(doc)[REPORT]
