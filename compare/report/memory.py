"""The report's memory: what each step saved for its backward and its peak, against the cost model (issue 19). A pure
function of the results document; a document without memory records renders no section and no summary part.

- :func:`memory_section`: a table per case, dtype and mode: each backend's saved-for-backward bytes (its tensors
  counted from the framework, ``compare.results.memory``), the check against its cost-model plan byte for byte
  (``= model``, or both sides spelled out with the difference: a finding, as a collective that differs from the
  communication model is one; like that one it is the report's, not the exit status's), its peak above inputs and
  weights with its source; a figure that was not measured says why, never 0. Below it the findings, each with the
  registry line's ``assumption`` where the plan is one.
- :func:`memory_line`: the summary's part: what fusion keeps out of memory per MLP step (the baseline's saved bytes
  less the least a fused backend that passes saved; as a share of the baseline's saved activations) and, where a
  recomputation backend ran beside its twin (``BackendSpec.remat_of``), what it saved and what it cost in time (a
  difference within noise is "within noise", never a number: ``compare.timing.significance``).
"""

from __future__ import annotations

from collections.abc import Sequence

from compare.backends.registry import BACKENDS, DEFAULT_BASELINE
from compare.formats.markdown import case_label, fmt_s, table
from compare.results.document import Result, Results
from compare.results.memory import Memory, model_check
from compare.timing.significance import WITHIN_NOISE, compare_timing

MIB = 1 << 20
#: Statuses whose memory figures the summary weighs (a failing step's memory is no saving).
PASSING = ("ok", "deviates", "implausible")


def mib(n: int) -> str:
    """Bytes as MiB, to 4 significant digits (``48 MiB``, ``0.1389 MiB``); exact bytes stay in results.json."""
    return f"{n / MIB:.4g} MiB"


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


def _groups(results: Sequence[Result]) -> dict[tuple[str, str], list[Result]]:
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
        "hooks over one forward; JAX: the residuals of `jax.vjp` of the forward, cross-checked against a jitted "
        "vjp's closure); in `fwd`, what an inference forward keeps. *Against model*: the cost model's saved tensors "
        "of the backend's plan (`compare/cost/model.py`), byte for byte; a difference is a finding. *Peak*: the "
        "most the step allocated above its inputs and weights, with its source. A figure that was not measured "
        "says why; it is never 0.",
    ]
    sources: list[str] = []
    findings: list[str] = []
    for (_, mode), group in _groups(rows).items():
        body = []
        for r in group:
            m = r.memory
            check = model_check(m, r.cost)
            peak, peak_src = _peak_cell(m)
            saved_src = short_source(m.saved.source) if m is not None and m.saved is not None else "-"
            for s in (
                m.saved.source if m is not None and m.saved is not None else "",
                m.peak.source if m and m.peak else "",
            ):
                if s and s not in sources:
                    sources.append(s)
            body.append([r.label, r.status, _saved_cell(m), saved_src, check.cell, peak, peak_src])
            if check.finding:
                spec = BACKENDS.get(r.backend)
                why = f" The plan is an assumption: {spec.assumption}" if spec is not None and spec.assumption else ""
                findings.append(f"- {r.label}, {case_label(r)} {r.dtype} {mode}: {check.text}.{why}")
            if m is not None and m.saved is not None and m.saved.cross_check.startswith("DIFFERS"):
                findings.append(f"- {r.label}, {case_label(r)} {r.dtype} {mode}: residuals {m.saved.cross_check}.")
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
        parts += ["", "**Findings** (measured saved tensors that differ from the backend's cost-model plan):", ""]
        parts += findings
    parts += ["", "Sources:", ""] + [f"- {s}" for s in sources]
    return "\n".join(parts)


def _saved_bytes(r: Result | None) -> int | None:
    if r is None or r.status not in PASSING or r.memory is None or r.memory.saved is None:
        return None
    return r.memory.saved.bytes


def memory_line(rows: Sequence[Result]) -> str:
    """The summary's memory part for one case, dtype and mode (module docstring); "" when no row has a memory
    record. Names the baseline (``torch-eager``) when it has no figure."""
    if not any(r.memory is not None for r in rows):
        return ""
    mode = rows[0].mode
    if mode == "fwd":
        return "memory: an inference forward saves nothing for a backward; see the peaks in the memory table"
    by_name = {r.backend: r for r in rows if r.world_size == 1}
    base = _saved_bytes(by_name.get(DEFAULT_BASELINE))
    if base is None:
        return f"memory: not compared ({DEFAULT_BASELINE}'s saved activations not measured)"
    remats = {n for n, s in BACKENDS.items() if s.remat_of}
    fused = [
        (b, r)
        for name, r in by_name.items()
        if name != DEFAULT_BASELINE and name not in remats and (b := _saved_bytes(r)) is not None
    ]
    text = "memory: "
    if not fused:
        text += "no fused backend's saved activations measured"
    else:
        least, who = min(fused, key=lambda br: br[0])
        kept = base - least
        share = f"{kept / base:.0%}" if base else "-"
        text += (
            f"fusion keeps {mib(kept)} out of memory per MLP ({who.backend}; {share} of {DEFAULT_BASELINE}'s saved "
            f"activations, {mib(base)})"
        )
    for name in sorted(remats & set(by_name)):
        r = by_name[name]
        twin = by_name.get(BACKENDS[name].remat_of)
        saved, twin_saved = _saved_bytes(r), _saved_bytes(twin)
        if twin is None or saved is None or twin_saved is None:
            continue
        cost = "time not compared (one of them not timed)"
        if r.timing is not None and twin.timing is not None:
            v = compare_timing(twin.timing, r.timing)
            cost = (
                f"{WITHIN_NOISE} in time"
                if v.verdict == WITHIN_NOISE
                else f"{'+' if r.timing.median_s >= twin.timing.median_s else '-'}"
                f"{fmt_s(abs(r.timing.median_s - twin.timing.median_s))} a step"
            )
        text += f"; recomputation saves {mib(twin_saved - saved)} for {cost} ({name} against {twin.backend})"
    return text
