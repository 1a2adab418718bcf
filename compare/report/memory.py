"""The report's memory: what each step saved for its backward and its peak, against the cost model (issue 19). A pure
function of the results document; a document without memory records renders no section and no summary part.

- :func:`memory_section`: a table per case, dtype and mode: each backend's saved-for-backward bytes (its tensors
  counted from the framework, ``compare.results.memory``), the check against its cost-model plan byte for byte
  (``= model``, or both sides spelled out with the difference: a finding, as a collective that differs from the
  communication model is one; like that one it is the report's, not the exit status's), its peak above inputs and
  weights with its source; a figure that was not measured says why, never 0. Below it the findings, each with the
  registry line's ``assumption`` where the plan is one.
- :func:`memory_line`: the summary's part: what fusion keeps out of memory per MLP step (the baseline's saved bytes
  less the least that a backend that passes saved, neither a framework's baseline nor a recomputation backend; as a
  share of the baseline's saved activations) and, where a
  recomputation backend ran beside its twin (``BackendSpec.remat_of``), what it saved and what it cost in time (a
  difference within noise is "within noise", never a number: ``compare.timing.significance``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compare.backends.registry import BACKENDS, baseline_of
from compare.formats.markdown import case_label, fmt_s, table
from compare.report.cells import mib
from compare.results.document import Result, Results
from compare.results.memory import Memory, model_check
from compare.timing.significance import compare_timing

MIB = 1 << 20
#: Statuses whose memory figures the summary weighs (a failing step's memory is no saving).
PASSING = ("ok", "deviates", "implausible")


def short_source(source: str) -> str:
    """A figure's source as a table cell: the reader it came from, the full text under the table."""
    for key, short in (
        ("saved_tensors_hooks", "autograd saved-tensor hooks"),
        ("saved_residuals", "jax.vjp residuals"),
        ("no jax.vjp", "no vjp (fwd)"),
        ("max_memory_allocated", "CUDA allocator"),
        ("profile_memory", "profiler allocator events"),
        ("memory_analysis", "XLA memory_analysis (static)"),
        ("memory_stats", "device memory_stats (bound)"),
    ):
        if key in source:
            return short
    return source


def _counted_by(m: Memory | None) -> str:
    """How the saved tensors were counted, and whether the second count agrees (``agrees``, **differs**, or none)."""
    if m is None or m.saved is None:
        return "-"
    check = m.saved.cross_check
    verdict = "; cross-check agrees" if check.startswith("agrees") else ""
    if check.startswith("DIFFERS"):
        verdict = "; **cross-check differs**"
    return short_source(m.saved.source) + verdict


def _saved_cell(m: Memory | None) -> str:
    if m is None:
        return "not measured (memory not asked for)"
    if m.saved is None:
        return f"not measured ({m.saved_reason})"
    n = len(m.saved.tensors)
    return f"{mib(m.saved.bytes)} ({n} tensor{'s' if n != 1 else ''})"


def _peak_cell(m: Memory | None) -> tuple[str, str]:
    if m is None:
        return "not measured (memory not asked for)", "-"
    if m.peak is None:
        return f"not measured ({m.peak_reason})", "-"
    bound = " (bound)" if m.peak.bound and "bound" not in short_source(m.peak.source) else ""
    return ("<= " if m.peak.bound else "") + mib(m.peak.bytes), short_source(m.peak.source) + bound


def by_case_mode(results: Sequence[Result]) -> dict[tuple[str, str], list[Result]]:
    """The results grouped by case (dtype included) and mode, in order of first appearance."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.case, r.mode), []).append(r)
    return groups


def memory_section(doc: Results) -> str:
    """``## Memory``: per case, dtype and mode, each backend's saved-for-backward bytes against its plan and its
    peak (module docstring); "" when no result carries a memory record."""
    rows = [r for r in doc.results if r.memory is not None]
    if not rows:
        return ""
    parts = [
        "## Memory",
        "",
        "What each step holds in memory, measured from its framework. *Saved for backward*: the tensors its forward "
        "keeps for the backward, each storage once, without its input and weights (torch: autograd's saved-tensor "
        "hooks over one forward, cross-checked against the bytes the allocator still holds after it; JAX: the "
        "residuals of `jax.vjp` of the forward, cross-checked against a jitted vjp's closure); in `fwd`, what an "
        "inference forward keeps. *Against model*: the cost model's saved tensors "
        "of the backend's plan (`compare/cost/model.py`), byte for byte; a difference is a finding. *Peak*: the "
        "most the step allocated above its inputs and weights, with its source. A figure that was not measured "
        "says why; it is never 0.",
    ]
    sources: dict[str, None] = {}  # in order of first appearance
    findings: list[str] = []
    for (_, mode), group in by_case_mode(rows).items():
        body = []
        for r in group:
            m = r.memory
            check = model_check(m, r.cost)
            peak, peak_src = _peak_cell(m)
            if m is not None:
                sources.update(dict.fromkeys(x.source for x in (m.saved, m.peak) if x is not None and x.source))
            body.append([r.label, r.status, _saved_cell(m), _counted_by(m), check.cell, peak, peak_src])
            if check.finding:
                spec = BACKENDS.get(r.backend)
                why = f" The plan is an assumption: {spec.assumption}" if spec is not None and spec.assumption else ""
                findings.append(f"- {r.label}, {case_label(r)} {r.dtype} {mode}: {check.text}.{why}")
            if m is not None and m.saved is not None and m.saved.cross_check.startswith("DIFFERS"):
                findings.append(
                    f"- {r.label}, {case_label(r)} {r.dtype} {mode}: the saved-tensor count {m.saved.cross_check}."
                )
        head = group[0]
        parts += [
            "",
            f"### {case_label(head)} {head.dtype} {mode}",
            "",
            table(
                ["backend", "status", "saved for backward", "counted by", "against model", "peak", "peak from"], body
            ),
        ]
    if findings:
        parts += [
            "",
            "**Findings** (saved tensors that differ from the backend's cost-model plan; a second count that "
            "differs from the first):",
            "",
        ]
        parts += findings
    parts += ["", "Sources:", ""] + [f"- {s}" for s in sources]
    by_tokens = tokens_section(doc)
    if by_tokens:
        parts += ["", by_tokens]
    return "\n".join(parts)


def saved_bytes(r: Result | None) -> int | None:
    if r is None or r.status not in PASSING or r.memory is None or r.memory.saved is None:
        return None
    return r.memory.saved.bytes


def memory_line(rows: Sequence[Result]) -> str:
    """The summary's memory part for one case, dtype and mode (module docstring); "" when no row has a memory
    record. Names the baseline (``torch-eager``) when it has no figure."""
    if not any(r.memory is not None for r in rows):
        return ""
    mode = rows[0].mode
    by_name = {r.backend: r for r in rows if r.world_size == 1}
    if mode == "fwd":
        alive = {n: b for n, r in by_name.items() if (b := saved_bytes(r))}
        if not alive:
            return "memory: no inference forward keeps anything for a backward; their peaks are in the memory table"
        return "memory: inference forwards that keep tensors alive: " + ", ".join(
            f"{n} {mib(b)}" for n, b in alive.items()
        )
    baseline = baseline_of(rows[0].model)
    base = saved_bytes(by_name.get(baseline))
    if base is None:
        return f"memory: not compared ({baseline}'s saved activations not measured)"
    remats = {n for n, s in BACKENDS.items() if s.remat_of}
    fused = [
        (b, r)
        for name, r in by_name.items()
        if not (name in remats or (name in BACKENDS and BACKENDS[name].baseline)) and (b := saved_bytes(r)) is not None
    ]
    text = "memory: "
    if not fused:
        text += "no fused backend's saved activations measured"
    else:
        least, who = min(fused, key=lambda br: br[0])
        kept = base - least
        share = f"{kept / base:.0%}" if base else "-"
        text += (
            f"fusion keeps {mib(kept)} out of memory per MLP ({who.backend}; {share} of {baseline}'s saved "
            f"activations, {mib(base)})"
        )
    for name in sorted(remats & set(by_name)):
        r = by_name[name]
        twin = by_name.get(BACKENDS[name].remat_of)
        saved, twin_saved = saved_bytes(r), saved_bytes(twin)
        if twin is None or saved is None or twin_saved is None:
            continue
        cost = "time not compared (one of them not timed)"
        if r.timing is not None and twin.timing is not None:
            v = compare_timing(twin.timing, r.timing)
            sign = "+" if r.timing.median_s >= twin.timing.median_s else "-"
            cost = v.said(f"{sign}{fmt_s(abs(r.timing.median_s - twin.timing.median_s))} a step")
            cost += " in time" if not v.significant else ""
        text += f"; recomputation saves {mib(twin_saved - saved)} for {cost} ({name} against {twin.backend})"
    return text


# --- memory against tokens (a sweep) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """A least-squares line ``bytes = intercept + slope * tokens`` through measured points, its largest absolute
    residual (bytes), and the largest token count whose line stays within a device memory (None: none given, or a
    line that does not grow)."""

    what: str
    points: tuple[tuple[int, int], ...]
    slope: float
    intercept: float
    max_residual: float
    largest_tokens: int | None = None


def linear_fit(what: str, points: Sequence[tuple[int, int]], device_memory: int = 0) -> Fit:
    """The line through ``points`` (``(tokens, bytes)``, two token counts at least) and, with ``device_memory``
    (bytes), the largest token count whose fitted bytes fit in it."""
    xs = [float(t) for t, _ in points]
    ys = [float(b) for _, b in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError(f"{what}: a fit needs two token counts at least, got {sorted(set(xs))}")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    resid = max(abs(y - (intercept + slope * x)) for x, y in zip(xs, ys, strict=True))
    largest = None
    if device_memory and slope > 0:
        largest = max(0, math.floor((device_memory - intercept) / slope))
    return Fit(what, tuple(sorted(points)), slope, intercept, resid, largest)


def family(r: Result) -> tuple[str, int, int]:
    """The plots' and fits' family of a result: its model, dim and hidden (token counts vary within one)."""
    return r.model, r.shape.dim, r.shape.hidden


def _weights_and_inputs(r: Result) -> tuple[int, int]:
    """The bytes a step's weights hold, and its inputs per token (``x`` and, with a backward, ``dy``), in its dtype:
    what a device holds beside the step's peak (the peak is measured above them)."""
    item = {"float32": 4, "bfloat16": 2, "float16": 2}.get(r.dtype, 4)
    d, h = r.shape.dim, r.shape.hidden
    weights = {"linear": d * h + h, "gelu-mlp": 2 * d * h + d + h}.get(r.model, 3 * d * h) * item
    out = h if r.model == "linear" else d
    per_token = (d + (out if r.mode != "fwd" else 0)) * item
    return weights, per_token


def memory_fits(doc: Results) -> list[tuple[Result, Fit, Fit | None]]:
    """Per family (model, dim, hidden), dtype, mode and backend with two token counts or more: the fit of its saved
    bytes, and of its whole step (weights + inputs + peak, where every point has a peak of one source), each with
    the largest token count that fits the document's device memory (``config.device_memory``)."""
    series: dict[tuple[Any, ...], dict[int, Result]] = {}
    for r in doc.results:
        if r.memory is not None and r.memory.saved is not None and r.world_size == 1:
            series.setdefault((family(r), r.dtype, r.mode, r.backend), {}).setdefault(r.shape.tokens, r)
    out = []
    dev = doc.config.device_memory
    for _, by_tokens in sorted(series.items(), key=lambda kv: kv[0]):
        if len(by_tokens) < 2:
            continue
        rows = [by_tokens[t] for t in sorted(by_tokens)]
        saved = linear_fit(
            "saved", [(r.shape.tokens, r.memory.saved.bytes) for r in rows if r.memory and r.memory.saved], dev
        )
        peaks = [r.memory.peak for r in rows if r.memory is not None and r.memory.peak is not None]
        step = None
        if len(peaks) == len(rows) and len({p.source for p in peaks}) == 1:
            weights, per_token = _weights_and_inputs(rows[0])
            pts = [
                (r.shape.tokens, weights + per_token * r.shape.tokens + p.bytes)
                for r, p in zip(rows, peaks, strict=True)
            ]
            step = linear_fit("step", pts, dev)
        out.append((rows[0], saved, step))
    return out


def _fit_text(f: Fit) -> str:
    return f"{f.intercept / MIB:+.4g} MiB + {f.slope / 1024:.4g} KiB/token (max residual {f.max_residual:,.0f} B)"


def _largest(f: Fit | None, dev: int) -> str:
    if f is None:
        return "-"
    if not dev:
        return "no --device-memory given"
    if f.largest_tokens is None:
        return "no growth with tokens"
    measured = max(t for t, _ in f.points)
    how = "within the measured points" if f.largest_tokens <= measured else f"extrapolated beyond {measured:,}"
    return f"{f.largest_tokens:,} ({how})"


def tokens_section(doc: Results) -> str:
    """``### Memory against tokens``: per backend the line through its measured saved bytes and its whole step's
    bytes (weights + inputs + peak) against tokens, and the largest token count that fits the device memory; "" with
    no backend measured at two token counts."""
    fits = memory_fits(doc)
    if not fits:
        return ""
    dev = doc.config.device_memory
    body = [
        [
            r.backend,
            f"{r.model} d={r.shape.dim} h={r.shape.hidden}",
            r.dtype,
            r.mode,
            ", ".join(f"{t:,}" for t, _ in saved.points),
            _fit_text(saved),
            _largest(saved, dev),
            "-" if step is None else _fit_text(step),
            _largest(step, dev),
        ]
        for r, saved, step in fits
    ]
    where = f"{dev / (1 << 30):.4g} GiB (`--device-memory`)" if dev else "no device memory (`--device-memory SIZE`)"
    return "\n".join(
        [
            "### Memory against tokens",
            "",
            "A least-squares line through the measured points of each backend (saved bytes are linear in tokens: the "
            "residual says how exactly), and the largest token count whose line fits in " + where + ". *Saved*: the "
            "activations one MLP keeps for its backward; *step*: its weights, its inputs and its measured peak above "
            "them (only where every point has a peak of one source). A count beyond the measured points is an "
            "extrapolation of the line, said as such.",
            "",
            table(
                [
                    "backend",
                    "family",
                    "dtype",
                    "mode",
                    "tokens measured",
                    "saved: fit",
                    "saved: largest tokens",
                    "step: fit",
                    "step: largest tokens",
                ],
                body,
            ),
        ]
    )
