"""Compile cost and shape generality: when does a compiled backend pay back its compiles? Pure Python.

A *shape sweep* (``torch_impl.recompiles.shape_sweep``, ``jax_impl.recompiles.shape_sweep``) calls one compiled
function on inputs of several token counts in turn and records, per shape, a row::

    {"backend": str, "framework": "torch" | "jax", "dynamic": bool | None (None: no compiler involved),
     "tokens": int, "model", "dim", "hidden", "dtype", "mode", "device",
     "compiles": int,            # (re)compilations this shape caused, read from the framework's own counter
     "compile_counter": str,     # which counter
     "first_call_s": float | None, "median_s": float | None, "iqr_s": float | None,   # shared timer
     "timed": bool, "generic": bool (shape-generic: compiles nothing per shape), "note": str, "error": str}

:func:`with_payback` adds ``compile_s`` (the first call's excess over a steady call), ``payback_verdict`` (is the
compiled step faster than the fastest shape-generic backend at the same shape, beyond both timings' noise, by
:func:`compare.timing.significance.compare_timing`) and ``payback_calls`` (the calls after which that compile is paid
back,
only when it is), and :func:`shapes_section` renders ``doc["shape_sweep"]`` as markdown.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from compare.backends.registry import BackendSpec
from compare.formats.codec import from_json
from compare.problem.cases import Case
from compare.problem.shape_cases import case_for_tokens
from compare.results.document import Results
from compare.timing.significance import FASTER, SLOWER, WITHIN_NOISE, compare_timing
from compare.timing.timer import Timing

Row = dict[str, Any]


def payback_calls(compile_s: float, compiled_step_s: float, generic_step_s: float) -> float | None:
    """Calls after which a compiled backend has paid back ``compile_s`` against a shape-generic one.

    Each call saves ``generic_step_s - compiled_step_s``; the compile is paid back after
    ``compile_s / saving`` calls (0.0 when there was nothing to pay back). None when the compiled step is not
    faster, so it never pays back.
    """
    if compile_s <= 0:
        return 0.0
    saving = generic_step_s - compiled_step_s
    if saving <= 0:
        return None
    return compile_s / saving


def _key(r: Row) -> tuple[Any, ...]:
    return (r.get("model"), r.get("dim"), r.get("hidden"), r.get("dtype"), r.get("mode"), r["tokens"])


def _timing(r: Row) -> Timing:
    return from_json(Timing, {"median_s": r["median_s"], "iqr_s": r.get("iqr_s") or 0.0})


def with_payback(rows: list[Row]) -> list[Row]:
    """Copies of ``rows`` with ``compile_s``, ``baseline``, ``payback_verdict`` and ``payback_calls`` added.

    ``compile_s`` = first call - median (0 when the shape caused no compile); the baseline is the fastest timed
    shape-generic row (``generic``) of the same model, sizes, dtype, mode and token count. ``payback_verdict`` is
    the compiled row's median and IQR against the baseline's (:func:`compare.timing.significance.compare_timing`, its
    median/IQR fallback): "faster", "slower" or "within noise". ``payback_calls`` is a number only when the verdict
    is "faster" (or 0.0 when nothing was compiled); a difference within noise never becomes a call count.
    Shape-generic rows and rows without the numbers get None.
    """
    fastest: dict[tuple[Any, ...], Row] = {}
    for r in rows:
        if r.get("generic") and r.get("median_s") and not r.get("error"):
            k = _key(r)
            if k not in fastest or r["median_s"] < fastest[k]["median_s"]:
                fastest[k] = r
    out = []
    for r in rows:
        r = dict(r)
        r["compile_s"], r["baseline"], r["payback_verdict"], r["payback_calls"] = None, None, None, None
        if not r.get("generic") and r.get("median_s") and r.get("first_call_s") is not None:
            r["compile_s"] = max(r["first_call_s"] - r["median_s"], 0.0) if r.get("compiles") else 0.0
            base = fastest.get(_key(r))
            if base is not None:
                r["baseline"] = base["backend"]
                r["payback_verdict"] = compare_timing(_timing(base), _timing(r)).verdict
                if r["compile_s"] <= 0 or r["payback_verdict"] == FASTER:
                    r["payback_calls"] = payback_calls(r["compile_s"], r["median_s"], base["median_s"])
        out.append(r)
    return out


def _dynamic(r: Row) -> str:
    d = r.get("dynamic")
    return "-" if d is None else str(d)


def _payback(r: Row) -> str:
    if r.get("generic"):
        return "(shape-generic)"
    if r.get("compile_s") is None or r.get("baseline") is None:
        return "-"
    p = r.get("payback_calls")
    if p == 0:
        return "nothing to pay back"
    verdict = r.get("payback_verdict")
    if p is None or verdict != FASTER:
        if verdict == SLOWER:
            return f"never (slower than {r['baseline']})"
        if verdict == WITHIN_NOISE:
            return f"never (not faster beyond noise than {r['baseline']})"
        return f"never (not faster than {r['baseline']})"
    return f"{math.ceil(p):,} calls vs {r['baseline']}"


def shapes_section(doc: Results) -> str:
    """Markdown for the document's ``shape_sweep``: per backend and shape, compiles, first call, steady state,
    payback."""
    from compare.formats.markdown import fmt_s, table

    rows = list(doc.shape_sweep)
    if not rows:
        return ""
    if any("payback_verdict" not in r for r in rows):  # older documents: judge the payback here, by the same rule
        rows = with_payback(rows)
    body = []
    for r in rows:
        size = f"{r.get('dim')}->{r.get('hidden')}" if r.get("dim") else ""
        body.append(
            [
                r["backend"],
                _dynamic(r),
                str(r["tokens"]),
                size,
                str(r.get("dtype", "")),
                str(r.get("mode", "")),
                "-" if r.get("error") else str(r.get("compiles", "-")),
                fmt_s(r.get("first_call_s")),
                fmt_s(r.get("median_s")),
                "none" if r.get("compile_s") == 0 else fmt_s(r.get("compile_s")),
                _payback(r),
                (r.get("error") or r.get("note") or "").replace("|", "\\|"),
            ]
        )
    head = [
        "backend",
        "dynamic",
        "tokens",
        "dim->hidden",
        "dtype",
        "mode",
        "compiles",
        "first call",
        "median",
        "compile cost",
        "paid back after",
        "notes",
    ]
    totals = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["backend"], _dynamic(r)), []).append(r)
    for (backend, dyn), rs in groups.items():
        n = sum(r.get("compiles") or 0 for r in rs)
        timed = [r["first_call_s"] for r in rs if r.get("first_call_s") is not None]
        first = f"first calls {fmt_s(sum(timed))} in all" if timed else "first calls not timed"
        totals.append(
            f"- {backend}"
            + (f" (dynamic={dyn})" if dyn != "-" else "")
            + f": {n} compile(s) over {len(rs)} shape(s), {first}"
        )
    counters = list(
        dict.fromkeys(f"- {r['backend']}: {r['compile_counter']}" for r in rows if r.get("compile_counter"))
    )
    intro = (
        "One compiled function called on inputs of each token count in turn, in the order shown. Compiles: "
        "the (re)compilations that shape caused, read from the framework's own counter (below), never "
        "inferred from time; a timed loop that recompiles is an error. Compile cost = first call - median. "
        "Paid back after: that cost over the per-call saving against the fastest shape-generic backend at "
        "the same shape (one that compiles nothing per shape), only where the compiled step is faster beyond "
        "both medians' IQRs (the rule of `compare diff`); otherwise it never pays back."
    )
    return (
        "## Compile cost and shape generality\n\n"
        + intro
        + "\n\n"
        + table(head, body)
        + "\n\n"
        + "\n".join(totals)
        + ("\n\nCounters:\n\n" + "\n".join(counters) if counters else "")
    )


def run_shape_sweep(
    cases: list[Case],
    tokens: list[int],
    budget_s: float,
    progress: Callable[[str], None],
    specs: Iterable[BackendSpec] | None = None,
    deadline: float | None = None,
    cut: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Compile cost per token count at each case's dim, hidden and dtype, mode fwd, for every backend whose registry
    line joins the sweep (``BackendSpec.sweep``: one run per variant, e.g. ``dynamic=False`` then ``True``) and that
    implements the case's model and can run here. Each backend builds its own compiled forward and reads its own
    recompile counter (its ``shape_sweep`` method); rows are schema'd in the module docstring. With a ``deadline``
    (``time.monotonic``: the end of the sweep's share of a run's budget) no variant starts after it, and each one left
    out is said to ``cut`` (a variant's compiles are not cut once started)."""
    from compare.backends.registry import BACKENDS

    rows: list[dict[str, Any]] = []
    chosen = list(BACKENDS.values()) if specs is None else list(specs)
    for base in cases:

        def make(t: int, base: Case = base) -> Case:
            return case_for_tokens(base, t)

        progress(f"shape sweep {base.model} {base.shape.dim}->{base.shape.hidden} {base.dtype}: tokens {tokens}")
        for s in chosen:
            if not s.sweep or base.model not in s.models:
                continue
            avail = s.availability()
            if not avail.ok:
                progress(f"shape sweep: {s.name} left out: {avail.reason}")
                continue
            backend = s.load()
            for variant in s.sweep:
                if deadline is not None and time.monotonic() >= deadline:
                    if cut is not None:
                        shown = ", ".join(f"{k}={v}" for k, v in variant.items())
                        cut(
                            f"compile-cost sweep: {s.name}{f' ({shown})' if shown else ''} at {base.dtype} left out "
                            f"(the sweep's share of the budget was spent)"
                        )
                    continue
                # an optional method of the Backend protocol: a backend whose registry line has ``sweep`` defines it
                sweep_fn = getattr(backend, "shape_sweep")  # noqa: B009
                rows += sweep_fn(make, tokens, budget_s=budget_s, **variant)
    return with_payback(rows)


def budgeted_sweep(
    cases: list[Case], tokens: list[int], per_shape_s: float, budget: Any
) -> tuple[list[Case], list[int], float, float]:
    """The cases, token counts, sampling seconds per shape and the seconds of its share that keep a run's time
    budget (``compare.run.budget``: the sweep's share, never more than is left), each cut said to ``budget``. When the
    run is already past its share's start (what parity and the compiles before it cost overran the budget), the sweep
    keeps the first dtype of each model and shape (compiles, not samples, are most of its time: each dtype is another
    compile per shape and variant) and only the smallest and largest token counts; the sampling per shape is cut to
    what the share gives each (cases x variants x tokens; a shape's compile and warm-up cost about twice its
    samples), and when even that is under the timer's floor (0.01 s), the token counts are cut to the ends too."""
    from compare.backends.registry import BACKENDS

    def variants_of(chosen: list[Case]) -> int:
        return sum(len(s.sweep) for s in BACKENDS.values() if s.sweep and any(c.model in s.models for c in chosen))

    share = budget.part("shape_sweep")
    late = budget.left() < share
    kept_cases = list(cases)
    if late:
        first: dict[tuple[str, Any], Case] = {}
        for c in cases:
            first.setdefault((c.model, c.shape), c)
        kept_cases = list(first.values())
        if len(kept_cases) < len(cases):

            def named(cs: list[Case]) -> str:
                return ", ".join(f"{c.model} {c.shape.dim}->{c.shape.hidden} {c.dtype}" for c in cs)

            budget.cut(
                f"compile-cost sweep: one dtype per model and shape, {named(kept_cases)}; left out "
                f"{named([c for c in cases if c not in kept_cases])} (the run was past the sweep's share, "
                f"{share:.3g} s, with {budget.left():.3g} s left)"
            )
    runs = max(1, len(kept_cases) * variants_of(kept_cases) * len(tokens))
    each = share / (3 * runs)
    kept = list(tokens)
    if len(kept) > 2 and (each < 0.01 or late):
        kept = [min(kept), max(kept)]
        budget.cut(
            f"compile-cost sweep: tokens {kept} of {tokens} (its share of the budget: {share:.3g} s, "
            f"{budget.left():.3g} s left)"
        )
        each = share / (3 * max(1, len(kept_cases) * variants_of(kept_cases) * len(kept)))
    if each < per_shape_s:
        budget.cut(f"compile-cost sweep: {each:.3g} s of samples per shape instead of {per_shape_s:.3g} s")
        return kept_cases, kept, max(each, 0.01), share
    return kept_cases, kept, per_shape_s, share
