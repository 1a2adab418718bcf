"""The answer first: one line per case, dtype and mode, at the top of the report. A pure function of the document.

Each line gives
- **parity**: every backend passes, or which fail and on what (tensor: checks), which deviate (a real difference
  an honest implementation can have) and the worst one's cause (``compare.gate.parity.cause``: measured, or an
  unexplained deviation with the statistics that deviated), with the gate's resolution on that case
  (``compare.gate.resolution``: the smallest scale error it catches on ``y``, and whether erf and tanh GELU can be told
  apart), so "pass" has a size;
- **fastest**: the fastest timed backend among those that pass or deviate (a parity failure, an error or an
  ``implausible`` time is never named; a deviating one has its deviation beside it), tested against the baseline
  and against the runner-up, each verdict with its test (``compare.timing.significance``: paired by round when they
  were timed together, interleaved; unpaired across separate windows): a speedup only where *significant*, else
  *within noise* where the test ran, or *not tested (N rounds)* where the paired test had too few rounds to run.
  Without a timed baseline no fastest is named, and the line says why. Plausible means checked against the run's
  measured ceilings; where the run measured none for the dtype (``--no-ceilings``), the line says plausibility was
  not checked;
- **fusion headroom**: per framework present, the share of its own unfused baseline's profiled step spent outside
  its GEMMs (its elementwise and other kernels, from the profiler's per-kernel times): the most that fusing them
  away could ever save. Next to it, what each fused backend of that framework saved over that baseline, from the
  fusion table (a number only where it is beyond noise, none for a backend or baseline that fails parity, and only
  for a backend whose cost-model plan removes something: ``compare.cost.model.removed``); a saving
  larger than the baseline's time outside GEMMs says where the rest came from (GEMMs, dispatch). Speed across
  frameworks is never a saving: it stays in the timing table;
- **memory** (only where the run measured it, ``--memory`` or ``--profile``): what fusion keeps out of memory per
  MLP step and what recomputation saves for what time (``compare.report.memory.memory_line``).

A case whose parameters came from a checkpoint (``--weights``) names the file and its sha256 (and its layer, with
``--layers``) in its line, and the report's head names each file once in full, with the dtypes a case widened
(:func:`weights_line`); so does a case of a user's own MLP file (``--module``: :func:`module_line`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import Any

from compare.backends.registry import (
    BACKENDS,
    NO_SPEEDUP,
    baseline_of,
    baselines_said,
    framework_baseline,
    unfused_baseline,
)
from compare.formats.markdown import case_label, fmt_s, si, table
from compare.gate.resolution import NOT_MEASURED, ResolutionRow
from compare.problem import checkpoint
from compare.problem.cases import MOE_MODELS, ModuleFile, Weights
from compare.report.cells import mib, signed_s
from compare.report.cost import MEASURED, UNMEASURED, ceilings_for, fusion_benefit, kernel_time_split, measured_saved
from compare.report.machines import machine_of, machines_line, same_machine, several, timed_machine_types
from compare.report.memory import by_case_mode, memory_line, saved_bytes
from compare.report.resolution import RESOLUTION
from compare.results.document import Result, Results
from compare.timing.significance import MIN_PAIRS, NOT_TESTED, PAIRED, WITHIN_NOISE, compare_timing, not_tested
from compare.timing.timer import Timing

#: A link to a section of the details by its title and the words shown (``compare.report.render.files``); plain
#: words where there are no details to link to.
Link = Callable[[str, str], str]


def _words(title: str, text: str) -> str:
    return text


def weights_tag(w: Weights | None) -> str:
    """`` (weights `F.safetensors`, sha256 `0123456789ab`)`` for a case read from a checkpoint (its layer and prefix
    where it has them); "" for drawn weights."""
    if w is None:
        return ""
    layer = f", layer {w.layer}" if w.layer is not None else ""
    prefix = f", prefix `{w.prefix}`" if w.prefix else ""
    return f" (weights `{PurePath(w.path).name}`{layer}{prefix}, sha256 `{w.sha256[:12]}`)"


def module_tag(m: ModuleFile | None) -> str:
    """`` (module `F.py`, sha256 `0123456789ab`)`` for a case of a user's MLP file; "" for a built-in model."""
    return "" if m is None else f" (module `{PurePath(m.path).name}`, sha256 `{m.sha256[:12]}`)"


def module_line(doc: Results) -> str:
    """``Module: ...``: every user's MLP file the run's cases computed, with its full sha256, its parameters and its
    path; "" when every case is a built-in model."""
    found = dict.fromkeys(r.module for r in doc.results if r.module is not None)
    parts = [
        f"`{PurePath(m.path).name}` (sha256 `{m.sha256}`, parameters "
        + ", ".join(f"`{k}` {list(s)}" for k, s in m.params)
        + f", read from `{m.path}`)"
        for m in found
    ]
    if not parts:
        return ""
    return (
        f"Module: {'; '.join(parts)}: your own MLP; its golden is its torch module run in float64 with fixed-bit "
        "arithmetic (the same bits on every machine), its parameters drawn from the seed (N(0, 1) / sqrt(fan-in)) "
        "unless a --weights file gave them; no cost model (not modelled)."
    )


def weights_line(doc: Results) -> str:
    """``Weights: ...``: every checkpoint the run's cases read their parameters from, with its full sha256, prefix
    and path (a ``--layers`` run's: its layers, each layer's prefix and sha256 in the per-case lines), and the dtypes
    a case widened (bfloat16 weights for a float32 case: exact); "" when every case drew them from its seed."""
    found = dict.fromkeys(r.weights for r in doc.results if r.weights is not None)
    by_path: dict[str, list[Weights]] = {}
    for w in found:
        by_path.setdefault(w.path, []).append(w)
    parts = []
    for path, ws in by_path.items():
        what = "sha256 of the tensors it reads" if ws[0].sharded else "sha256"
        layers = sorted({w.layer for w in ws if w.layer is not None})
        if len(ws) == 1 or not layers:
            parts += [
                f"`{PurePath(w.path).name}` ({what} `{w.sha256}`"
                + (f", layer {w.layer}" if w.layer is not None else "")
                + (f", prefix `{w.prefix}`" if w.prefix else "")
                + f", read from `{w.path}`)"
                for w in ws
            ]
            continue
        shas = {w.sha256 for w in ws}
        sha = f"sha256 `{ws[0].sha256}`" if len(shas) == 1 else f"each layer's {what} in its case's line"
        parts.append(
            f"`{PurePath(path).name}` ({len(layers)} layers, {checkpoint.span(layers)}, prefixes "
            f"`{ws[0].prefix}` to `{ws[-1].prefix}`, {sha}, read from `{path}`)"
        )
    if not parts:
        return ""
    widen = sorted({(d, r.dtype) for r in doc.results for d in checkpoint.widened(r.weights, r.dtype)})
    said = (
        " " + "; ".join(f"{a} weights widened to {b} (exact: {b} holds every {a} value)" for a, b in widen) + "."
        if widen
        else ""
    )
    return (
        f"Weights: {'; '.join(parts)}: the parameters as the checkpoint holds them, the inputs drawn from the seed."
        + said
    )


def _plain(cell: str) -> str:
    """A header cell's words without its link."""
    return cell.split("](")[0].lstrip("[")


def speedup_cell(results: Sequence[Result], r: Result) -> str:
    """``r``'s speedup against the baseline on the same case and mode, e.g. ``1.52x``, only where the two timings
    differ beyond noise (:func:`compare.timing.significance.compare_timing`, the rule of ``compare diff``); else
    ``within noise`` (or ``not tested (N rounds)`` where the paired test had too few rounds to run). ``baseline``
    for the baseline itself, ``-`` where the baseline was not timed (on the row's machine type: a row is never
    compared with a baseline measured on another)."""
    if r.status in NO_SPEEDUP:
        return f"- ({r.status})"
    base = same_machine(results, r, baseline_of(r.model), lambda b: b.timing)
    if base is None or base.timing is None or r.timing is None:
        return "-"
    if base is r:
        return "baseline"
    v = compare_timing(base.timing, r.timing)
    mark = "" if v.design == PAIRED else ", unpaired"
    return v.said(f"{1 / v.ratio:.2f}x") + mark


def _where_failed(r: Result) -> str:
    """Which output failed: the first call's tensors and checks, else the last timed call, else fresh inputs."""
    p = r.parity
    if p is None:
        return "no verdict"
    if p.failed:
        return ", ".join(p.failed)
    if p.last_timed is not None and p.last_timed.tier == "fail":
        return "last timed call"
    if p.fresh is not None and p.fresh.tier == "fail":
        return f"fresh inputs: {', '.join(sorted({f.split(':')[0] for f in p.fresh.failures}))}"
    return "see the reason"


def _deviation(r: Result) -> str:
    """Which tensors of a deviating row deviate, and the cause of the worst (measured, or an unexplained deviation)."""
    p = r.parity
    worst = max(p.tensors, key=lambda t: t.worst_ratio) if p is not None and p.tensors else None
    cause = f": {worst.cause}" if worst is not None and worst.cause else ""
    return f"{', '.join(p.deviated if p is not None else ())}{cause}"


def _parity(rows: list[Result], resolution: tuple[ResolutionRow, ...]) -> str:
    judged = [r for r in rows if r.parity is not None]
    bad = [r for r in rows if r.status in ("parity-fail", "error")]
    deviating = [r for r in rows if r.status == "deviates"]
    passing = [r for r in judged if r.status == "ok"]
    parts = []
    if bad:
        what = [f"{r.label} ({'error' if r.status == 'error' else _where_failed(r)})" for r in bad]
        parts.append("**FAIL**: " + "; ".join(what))
    implausible = [r for r in rows if r.status == "implausible"]
    if implausible:
        parts.append(
            "**IMPLAUSIBLE** (faster than this machine's measured matmul ceiling allows): "
            + ", ".join(r.label for r in implausible)
        )
    if deviating:
        parts.append("deviates: " + "; ".join(f"{r.label} ({_deviation(r)})" for r in deviating))
    if not parts and not judged:
        return "nothing judged"
    verdict = "; ".join(parts) + f"; {len(passing)} other(s) pass" if parts else f"all {len(judged)} pass"
    case = rows[0].case
    res = next((x for x in resolution if x.case == case and x.tensor == "y"), None)
    if res and res.note != NOT_MEASURED:
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


def _fastest(rows: list[Result], plausibility_checked: bool) -> str:
    """The fastest plausible backend of a group; per machine type where its timed rows come from several (never a
    speedup across two). ``plausibility_checked``: the run measured a ceiling for the group's dtype."""
    if several(rows):
        text = "; ".join(
            f"on {m or 'a machine not recorded'}, {_fastest_of([r for r in rows if machine_of(r) == m])}"
            for m in timed_machine_types(rows)
        )
    else:
        text = _fastest_of(rows)
    if plausibility_checked or text == "nothing timed":
        return text
    return f"{text} (plausibility not checked: the run measured no {rows[0].dtype} ceiling)"


def _against(best: Timing, other: Result, what: str) -> str:
    """``best``'s verdict against ``other`` (``what`` names it: the baseline, or "the runner-up" with its name and
    median) with the test that gave it: a speedup only where significant, "within noise" only where a test ran."""
    assert other.timing is not None
    v = compare_timing(other.timing, best)
    if v.verdict == NOT_TESTED:
        return f"{not_tested(v.pairs)} against {what} (timed together; the paired test needs {MIN_PAIRS})"
    how = "timed together, paired by round" if v.design == PAIRED else "separate windows, unpaired"
    if v.verdict == WITHIN_NOISE:
        return f"{WITHIN_NOISE} of {what} ({how})"
    return f"{1 / v.ratio:.2f}x {what} (significant; {how})"


def _fastest_of(rows: list[Result]) -> str:
    """The quickest timed row that passes or deviates (with its deviation beside it), tested against the baseline
    and against the runner-up; none named without a timed baseline."""
    timed = sorted(
        (r for r in rows if r.timing is not None and r.status in ("ok", "deviates")),
        key=lambda r: r.timing.median_s if r.timing is not None else 0.0,
    )
    if not timed:
        return "nothing timed"
    baseline = baseline_of(rows[0].model)
    base = next((r for r in timed if r.backend == baseline), None)
    if base is None:
        row = next((r for r in rows if r.backend == baseline), None)
        why = (
            "not run"
            if row is None
            else "not timed"
            if row.status in MEASURED
            else UNMEASURED.get(row.status, row.status)
        )
        return f"none named ({baseline} {why}: a fastest is tested against it; the timing table has the rest)"
    best, *rest = timed
    assert best.timing is not None
    text = f"{best.label} {fmt_s(best.timing.median_s)}"
    if best.status == "deviates":
        text += f" (deviates: {_deviation(best)})"
    if not rest:
        return text + " (the baseline itself, the only one timed)"
    verdicts = []
    if best is base:
        text += " (the baseline itself)"
    else:
        verdicts.append(_against(best.timing, base, baseline) + (", also the runner-up" * (rest[0] is base)))
    if rest[0] is not base:
        second = rest[0]
        assert second.timing is not None
        verdicts.append(_against(best.timing, second, f"the runner-up {second.label} {fmt_s(second.timing.median_s)}"))
    return text + ", " + "; ".join(verdicts)


def _saved(f: dict[str, Any]) -> str | None:
    """What one fused backend saved over its framework's baseline (a fusion-table row), or None to say nothing.

    A number only beyond noise. It is never left larger than what the baseline spent outside GEMMs without saying
    why: then the kernel tables split it into GEMM time, other kernels and time outside any kernel (dispatch), or,
    without them, it says the rest is not fusion."""
    b, why = f["backend"], f.get("not_measured", "")
    if why:  # a failing backend is named; a failing or untimed baseline is said once, in the headroom
        return None if why.startswith("baseline") or why == "not timed" else f"{b} not measured ({why})"
    if f.get("measured_verdict") is None:
        return None
    text = f"{b} {measured_saved(f)}"
    if f["measured_verdict"] in (WITHIN_NOISE, NOT_TESTED):
        return text
    saved, bound = f["measured_saved_s"], f.get("baseline_outside_gemm_s")
    if bound is None or saved <= bound * (1 + 1e-9):  # within float rounding of the bound is the bound
        return text
    more = f"more than the {fmt_s(bound)} {f['baseline']} spends outside GEMMs"
    g, o = f.get("gemm_time_saved_s"), f.get("outside_gemm_saved_s")
    if g is None or o is None:
        why = "the rest is not fusion but faster GEMMs or less dispatch; unsplit, a profile has no kernel times"
        return f"{text} ({more}: {why})"
    split = f"of which GEMMs {signed_s(g)}, other kernels {signed_s(o)}, outside any kernel {signed_s(saved - g - o)}"
    return f"{text} ({more}: {split})"


def _framework_headroom(rows: list[Result], fusion: list[dict[str, Any]], baseline: str) -> str:
    """One framework's headroom: the share of its baseline's profiled kernel time outside GEMMs (and that time per
    step), then what each of its fused backends saved over that baseline."""
    base = next((r for r in rows if r.backend == baseline), None)
    split = kernel_time_split(base) if base is not None and base.status in MEASURED else None
    if base is None:
        head = f"not measured ({baseline} not run)"
    elif base.status not in MEASURED:
        head = f"not measured ({baseline} {UNMEASURED.get(base.status, base.status)})"
    elif split is None or sum(split) <= 0:
        head = f"not measured ({baseline} not profiled with kernel times: run with --profile)"
    else:
        gemm, outside = split
        head = f"{outside / (gemm + outside):.0%} of {baseline}'s kernel time ({fmt_s(outside)} a step)"
    names = {r.backend for r in rows}
    saved = [
        x
        for f in fusion
        if f["baseline"] == baseline
        and f["backend"] in names
        and (f["case"], f["mode"]) == (rows[0].case, rows[0].mode)
        if f["removed"]  # a plan that fuses nothing saves nothing by fusion, whatever its time
        if (x := _saved(f)) is not None
    ]
    if not saved:
        return head
    return head + (", saved: " if split is not None else ", saved (medians only, unsplit): ") + ", ".join(saved)


def _headroom(rows: list[Result], fusion: list[dict[str, Any]]) -> str:
    """Per framework present in the group (one case, dtype and mode), its own unfused baseline's headroom and what
    its fused backends saved over it (:func:`_framework_headroom`); frameworks named when there are several.
    Nothing here compares frameworks: that is the timing table's. A module case (``--module``) has no cost-model
    plan, so nothing says what fusion removes from it: not modelled. Nor has a MoE case, but its headroom is measured
    off its own unfused baseline's profile (``registry.unfused_baseline``: torch's MoE baseline; JAX has none)."""
    if rows[0].module is not None:
        return "not modelled (your own MLP has no cost-model plan)"
    moe = rows[0].model in MOE_MODELS  # measured off its baseline's profile; what fusion removes is not modelled
    frameworks = list(dict.fromkeys(s.framework for r in rows if (s := BACKENDS.get(r.backend)) is not None))
    parts = []
    for fw in frameworks:
        baseline = unfused_baseline(fw, rows[0].model) if moe else framework_baseline(fw)
        text = "no unfused baseline registered" if baseline is None else _framework_headroom(rows, fusion, baseline)
        parts.append(text if len(frameworks) == 1 else f"{fw}: {text}")
    text = "; ".join(parts) or "not measured (no registered backend)"
    return text + (" (a mixture-of-experts block has no cost-model plan: what fusion removes is not modelled)" * moe)


def _ceiling_notes(doc: Results) -> str:
    """One line per dtype whose native matmul the run's ceilings found emulated (``Ceiling.matmul_emulated``: far
    below the float32 route, e.g. bfloat16 on a CPU without AVX512-BF16 or AMX), saying both rates; ``""`` when
    none is, or the run measured no ceilings. A slow 16-bit backend may be running the emulated route."""
    if doc.ceilings is None:
        return ""
    return "\n".join(
        f"{dtype} matmul is emulated on this machine: native {si(c.native_flops_per_s, 'FLOP/s')} against "
        f"{si(c.float32_route_flops_per_s, 'FLOP/s')} through float32 (the ceiling uses the faster route)."
        for dtype, c in doc.ceilings.by_dtype.items()
        if c.matmul_emulated
    )


def _busy_note(doc: Results) -> str:
    """One sentence when the machine was busy over the measurements (``compare.results.load.Load.busy``: other
    processes and steal took more than ``BUSY_SHARE`` of the cores' time), "" otherwise or where not recorded."""
    if doc.load is None or not doc.load.busy:
        return ""
    return (
        f"The machine was busy while this run measured ({doc.load.describe()}): the timings are noisier than their "
        "spread shows; rerun on a quiet machine before trusting a speed difference."
    )


def parity_cell(r: Result) -> str:
    """The row's tier with its worst statistic: the tensor closest to (or furthest past) its pass line, the checks it
    failed or deviated on, and how far along its pass line it came (value / pass line, over every check); a MoE
    step's wrong router instead, or the near-tie tokens it routed the other way beside it; what a failing or
    deviating step computes instead (its near variant, else "unexplained": ``compare.gate.near_variants``)."""
    p = r.parity
    if p is None or not p.tensors:
        return r.status
    if p.routing is not None and p.routing.wrong_tokens:  # a MoE step's wrong router (compare.gate.routing)
        return f"**FAIL**: routing (a wrong router on {p.routing.wrong_tokens} of {p.routing.tokens} tokens)"
    t = max(p.tensors, key=lambda x: x.worst_ratio)
    tier = {"fail": "**FAIL**"}.get(t.tier, t.tier)
    checks = ", ".join(t.failed or t.deviated)
    what = f"{t.tensor}{' ' + checks if checks else ''} at {t.worst_ratio:.2g} x pass line"
    if p.routing is not None and p.routing.rerouted:  # judged against the golden of its own routing
        what += f" (routed {p.routing.rerouted} near-tie token(s) the other way)"
    if p.variants is not None:  # what it computes instead (compare.gate.near_variants)
        what += f"; {p.variants.short}"
    return f"{tier}: {what}" + (f"; status {r.status}" if r.status not in ("ok", "deviates", "parity-fail") else "")


def _memory_saved(rows: list[Result], r: Result) -> str:
    """The saved activations this row keeps below its framework's unfused baseline's (measured, ``--memory``)."""
    s = BACKENDS.get(r.backend)
    name = framework_baseline(s.framework) if s is not None else None
    base = next((b for b in rows if b.backend == name and b.world_size == r.world_size), None)
    if base is None or base is r:
        return "-"
    b, mine = saved_bytes(base), saved_bytes(r)
    return "-" if b is None or mine is None else mib(b - mine)


def untimed_reason(r: Result) -> str:
    """Why a row that ran has no timing: the time budget's cut, else its backend's note (an interpreted backend:
    parity only), else its status's reason."""
    return r.extras.get("untimed") or r.note or r.reason or "no reason recorded"


def case_table(doc: Results, rows: list[Result], fusion: list[dict[str, Any]], to: Link = _words) -> str:
    """One case, dtype and mode, a row per backend that ran: parity with its worst statistic, warm median and IQR,
    the speedup against the baseline (paired signed-rank test unless marked unpaired), kernels per step, what its
    cost-model plan keeps out of memory and the saved activations it spares against its framework's baseline. A
    column measured for no row is left out and named once under the table, as is each reason a row was not timed."""
    gone = {(f["backend"], f["case"], f["dtype"], f["mode"]): f["not_materialized"] for f in fusion}
    reasons: list[str] = []

    def median(r: Result) -> str:
        if r.timing is not None:
            return f"{fmt_s(r.timing.median_s)} ({fmt_s(r.timing.iqr_s)})"
        why = untimed_reason(r)
        reasons.extend([why] * (why not in reasons))
        return f"not timed ({reasons.index(why) + 1})"

    head = [
        "backend",
        to("Parity", "parity (worst statistic)"),
        to("Timing", "warm median (IQR)"),
        to("Timing", f"vs {baseline_of(rows[0].model)}"),
        to("Kernels per step", "kernels/step"),
        to("What fusion buys", "intermediates fused away"),
        to("Memory", "saved activations spared"),
    ]
    body = [
        [
            r.label,
            parity_cell(r),
            median(r),
            speedup_cell(doc.results, r),
            str(r.kernels.kernels_per_step) if r.kernels is not None else "-",
            ", ".join(gone.get((r.backend, r.case, r.dtype, r.mode), [])) or "-",
            _memory_saved(rows, r),
        ]
        for r in rows
        if r.status != "skipped"
    ]
    keep = [i for i in range(len(head)) if i < 4 or any(row[i] != "-" for row in body)]
    after = ["Not timed: " + "; ".join(f"({i}) {why}" for i, why in enumerate(reasons, 1)) + "."] if reasons else []
    if len(keep) < len(head):
        after.append(
            "Not measured in this run: " + ", ".join(_plain(head[i]) for i in range(len(head)) if i not in keep) + "."
        )
    return table([head[i] for i in keep], [[row[i] for i in keep] for row in body]) + "".join("\n\n" + x for x in after)


def summary_section(doc: Results, to: Link = _words) -> str:
    """``## Summary``: the answer per case, dtype and mode (see the module docstring), each line followed by its
    table (:func:`case_table`); "" without results. ``to`` links words to a section of the details."""
    groups = by_case_mode(doc.results)
    if not groups:
        return ""
    fusion = fusion_benefit(doc)

    lines = []
    for rows in groups.values():
        memory = memory_line(rows)
        checked = all(ceilings_for(doc, r.dtype) is not None for r in rows)  # a ceiling for each row's dtype
        fastest = _fastest(rows, checked)
        lines.append(
            f"- **{case_label(rows[0])} {rows[0].dtype} {rows[0].mode}**{module_tag(rows[0].module)}"
            f"{weights_tag(rows[0].weights)}: parity "
            f"{_parity(rows, doc.resolution)}. "
            f"Fastest: {fastest}. Fusion headroom: {_headroom(rows, fusion)}."
            + (f" {memory[0].upper()}{memory[1:]}." if memory else "")
        )
        lines.append(case_table(doc, rows, fusion, to))
    plausible = (
        "is plausible against this machine's measured ceilings"
        if doc.ceilings is not None
        else "whose plausibility was not checked (this run measured no ceilings)"
    )
    against = baselines_said(r.model for r in doc.results)
    intro = (
        "One line per case, dtype and mode, then its table. Parity: every backend against the float64 golden (the "
        f"gate's statistics in {to('Parity', 'Parity')}, its resolution in "
        f"{to(RESOLUTION, 'What a pass means')}). Fastest: the quickest timed backend that passes or deviates and "
        f"{plausible}, tested against {against} and against the runner-up; none is named when "
        "that baseline was not timed. A speedup is a number only beyond the noise, by the paired test when the "
        "two were timed together (interleaved), else by the unpaired rule, and the line says which; 'not tested' "
        f"where the paired test had fewer than {MIN_PAIRS} rounds. Fusion headroom, per "
        "framework: the share of its own unfused baseline's profiled kernel time spent outside its GEMMs, the most "
        "fusing the rest away could ever save, next to what each of its "
        "fused backends saved over that baseline (where both pass or deviate, and only a backend whose cost-model "
        "plan removes something); a saving beyond that share says "
        f"where the rest came from. Speed across frameworks is the {to('Timing', 'timing table')}'s, not a saving. "
        "In each table the worst statistic is the check that came closest to (or went furthest past) its pass "
        "line; the speedup against the baseline is by the paired signed-rank test unless marked unpaired."
    )
    notes = "\n\n".join(x for x in (machines_line(doc), _ceiling_notes(doc), _busy_note(doc)) if x)
    return "## Summary\n\n" + intro + "\n\n" + "\n\n".join(lines) + (f"\n\n{notes}" if notes else "")
