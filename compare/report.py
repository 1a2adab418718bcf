"""The markdown report: a pure function of a results document. It measures nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from compare.costmodel import cost_section, fusion_section
from compare.kernels import kernel_section
from compare.plots import plots_section
from compare.registry import DEFAULT_BASELINE
from compare.shapes import shapes_section

Row = list[str]
Doc = dict[str, Any]


def table(header: Row, rows: Iterable[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def fmt_s(s: float | None) -> str:
    """Seconds with a unit that keeps 3 significant digits readable."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_e(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def case_label(r: Doc) -> str:
    s = r["shape"]
    return f"{r['model']} {s['batch']}x{s['seq']}x{s['dim']}->{s['hidden']}"


def environment_section(env: Doc) -> str:
    v = env.get("versions", {})
    rows = [
        ["platform", env.get("platform", "")],
        ["CPU", f"{env.get('cpu', '')} ({env.get('cpu_count')} logical cores)"],
        ["GPU", env.get("gpu") or "none"],
        ["versions", ", ".join(f"{k} {val}" for k, val in v.items() if val)],
        ["threads", ", ".join(f"{k}={val}" for k, val in env.get("threads", {}).items() if val != "")],
        ["precision", ", ".join(f"{k}={val}" for k, val in env.get("precision", {}).items())],
        ["TRITON_INTERPRET", env.get("triton_interpret") or "unset"],
    ]
    return "## Environment\n\n" + table(["", ""], rows)


def parity_section(results: list[Doc]) -> str:
    rows = []
    for r in results:
        p = r.get("parity")
        if not p:
            continue
        for t in p["tensors"]:
            rows.append([r["backend"], case_label(r), r["dtype"], r["mode"], t["tensor"], fmt_e(t["max_abs_err"]),
                         fmt_e(t["max_rel_err"]), fmt_e(t["bound"]), f"{t['ratio']:.2f}",
                         "pass" if t["passed"] else "**FAIL**"])
    head = ["backend", "case", "dtype", "mode", "tensor", "max abs err", "max rel err", "bound", "err/bound", "parity"]
    intro = ("Error against the float64 golden. Bound = 2 x the error of a plain same-dtype computation + one unit "
             "roundoff of the output scale; max rel err is max abs err / max|ref|.")
    return "## Parity\n\n" + intro + "\n\n" + table(head, rows)


def _baseline(results: list[Doc], r: Doc) -> Doc | None:
    for b in results:
        if (b["backend"] == DEFAULT_BASELINE and b["case"] == r["case"] and b["mode"] == r["mode"]
                and b.get("timing")):
            return b
    return None


def timing_section(results: list[Doc]) -> str:
    rows = []
    for r in results:
        t = r.get("timing")
        if not t:
            continue
        base = _baseline(results, r)
        speedup = f"{base['timing']['median_s'] / t['median_s']:.2f}x" if base else "-"
        flags = [x for x in ("noisy (IQR > 10% of median)" if t.get("noisy") else "", r.get("note", "")) if x]
        rows.append([r["backend"], case_label(r), r["dtype"], r["mode"], fmt_s(t["median_s"]), fmt_s(t["iqr_s"]),
                     fmt_s(t["min_s"]), f"{t['n']} x {t['calls_per_sample']}", fmt_s(t["first_call_s"]), speedup,
                     "; ".join(flags)])
    head = ["backend", "case", "dtype", "mode", "median", "IQR", "min", "n x calls", "first call", "vs eager", "notes"]
    intro = (f"Per call, steady state, after warm-up; every sample ends with a full device sync. "
             f"First call (compile + run) apart. Speedup is {DEFAULT_BASELINE}'s median over this one's.")
    untimed = [f"- {r['backend']} ({case_label(r)}, {r['dtype']}, {r['mode']}): not timed: {r['note']}"
               for r in results if r["status"] in ("ok", "parity-fail") and not r.get("timing")]
    return "## Timing\n\n" + intro + "\n\n" + table(head, rows) + ("\n\n" + "\n".join(untimed) if untimed else "")


def modes_section(results: list[Doc]) -> str:
    """One row per (backend, case, dtype), a column per timed mode: median (and speedup against eager)."""
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if any(r["mode"] == m and r.get("timing") for r in results)]
    if len(modes) < 2:
        return ""
    keys: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str, str], str] = {}
    for r in results:
        if not r.get("timing"):
            continue
        key = (r["backend"], r["case"], r["dtype"])
        if key not in keys:
            keys.append(key)
        base = _baseline(results, r)
        speed = f" ({base['timing']['median_s'] / r['timing']['median_s']:.2f}x)" if base else ""
        cells[(*key, r["mode"])] = fmt_s(r["timing"]["median_s"]) + speed
    label = {r["case"]: case_label(r) for r in results}
    rows = [[b, label[c], d, *(cells.get((b, c, d, m), "-") for m in modes)] for b, c, d in keys]
    return ("## Timing by mode\n\nMedian per call (speedup against torch-eager).\n\n"
            + table(["backend", "case", "dtype", *modes], rows))


def xla_check_section(results: list[Doc]) -> str:
    """The cost model against XLA's own ``cost_analysis()`` of the compiled executable, for JAX backends."""
    rows = []
    for r in results:
        xla, cost = (r.get("kernels") or {}).get("xla_cost"), r.get("cost")
        if not xla or not cost or xla.get("flops") is None:
            continue
        fr = xla["flops"] / cost["flops"] if cost["flops"] else float("nan")
        xb = xla.get("bytes_accessed")
        br = f"{xb / cost['bytes']:.2f}" if xb and cost["bytes"] else "-"
        rows.append([r["backend"], case_label(r), r["dtype"], r["mode"], f"{cost['flops']:.4g}", f"{xla['flops']:.4g}",
                     f"{fr:.3f}", f"{cost['bytes']:.4g}", "-" if xb is None else f"{xb:.4g}", br])
    if not rows:
        return ""
    intro = ("Model GEMM FLOPs and bytes against XLA's `cost_analysis()` of the same compiled step. XLA also counts "
             "elementwise FLOPs (a ratio a little above 1), and its bytes count every operand of every HLO op it "
             "keeps, which is not the same as DRAM traffic.")
    head = ["backend", "case", "dtype", "mode", "model FLOPs", "XLA FLOPs", "XLA/model", "model bytes",
            "XLA bytes accessed", "XLA/model"]
    return "## Cost model against XLA's cost analysis\n\n" + intro + "\n\n" + table(head, rows)


def traces_section(results: list[Doc]) -> str:
    """Links to the profiler traces a run wrote (paths relative to the report's folder)."""
    rows = [f"- {r['backend']} ({case_label(r)}, {r['dtype']}, {r['mode']}): [{r['kernels']['trace']}]"
            f"({r['kernels']['trace']})" for r in results if (r.get("kernels") or {}).get("trace")]
    if not rows:
        return ""
    intro = ("Chrome/Perfetto traces: open in https://ui.perfetto.dev or chrome://tracing "
             "(torch: `torch.profiler`, schedule wait=1 warmup=1 active=3; JAX: `jax.profiler`).")
    return "## Traces\n\n" + intro + "\n\n" + "\n".join(rows)


def problems_section(results: list[Doc]) -> str:
    bad = [r for r in results if r["status"] != "ok"]
    if not bad:
        return "## Skipped and failed\n\nNone: every backend ran and passed parity."
    rows = [[r["backend"], case_label(r), r["dtype"], r["mode"], r["status"], r["reason"].replace("|", "\\|")]
            for r in bad]
    return "## Skipped and failed\n\n" + table(["backend", "case", "dtype", "mode", "status", "reason"], rows)


def summary(results: list[Doc]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


#: Report sections in order. Later issues add sections here; each is a pure function of the document.
SECTIONS: list[Callable[[Doc], str]] = [
    lambda d: environment_section(d["environment"]),
    lambda d: parity_section(d["results"]),
    lambda d: timing_section(d["results"]),
    lambda d: modes_section(d["results"]),
    kernel_section,
    fusion_section,
    cost_section,
    lambda d: xla_check_section(d["results"]),
    shapes_section,
    lambda d: traces_section(d["results"]),
    plots_section,
    lambda d: problems_section(d["results"]),
]


def render(doc: Doc) -> str:
    """The whole ``REPORT.md`` for a results document."""
    cfg = doc.get("config", {})
    head = [
        "# fusion-compare report",
        "",
        f"Run {doc.get('created', '')}: {summary(doc['results'])}.",
        f"Command: `{cfg['command']}`" if cfg.get("command") else "",
    ]
    body = [section(doc) for section in SECTIONS]
    return "\n".join(x for x in head if x is not None) + "\n\n" + "\n\n".join(b for b in body if b) + "\n"
