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
:func:`compare.significance.compare_timing`) and ``payback_calls`` (the calls after which that compile is paid back,
only when it is), and :func:`shapes_section` renders ``doc["shape_sweep"]`` as markdown.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from compare.cases import Case, InputError, Shape
from compare.golden import Golden, golden_for
from compare.significance import FASTER, SLOWER, WITHIN_NOISE, compare_timing

#: Makes the case (or its golden data) of a shape sweep for a token count.
GoldenFactory = Callable[[int], Case | Golden]

Row = dict[str, Any]


def case_for_tokens(base: Case, tokens: int) -> Case:
    """``base`` with ``tokens`` tokens as one sequence (``batch = 1, seq = tokens``); dim, hidden, dtype kept."""
    s = base.shape
    return dataclasses.replace(base, shape=Shape(1, tokens, s.dim, s.hidden))


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


def _timing(r: Row) -> dict[str, Any]:
    return {"median_s": r["median_s"], "iqr_s": r.get("iqr_s") or 0.0}


def with_payback(rows: list[Row]) -> list[Row]:
    """Copies of ``rows`` with ``compile_s``, ``baseline``, ``payback_verdict`` and ``payback_calls`` added.

    ``compile_s`` = first call - median (0 when the shape caused no compile); the baseline is the fastest timed
    shape-generic row (``generic``) of the same model, sizes, dtype, mode and token count. ``payback_verdict`` is
    the compiled row's median and IQR against the baseline's (:func:`compare.significance.compare_timing`, its
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


def shapes_section(doc: dict[str, Any]) -> str:
    """Markdown for ``doc["shape_sweep"]``: per backend and shape, compiles, first call, steady state, payback."""
    from compare.report import fmt_s, table

    rows = doc.get("shape_sweep") or []
    if not rows:
        return ""
    if any("payback_verdict" not in r for r in rows):  # older documents: judge the payback here, by the same rule
        rows = with_payback(rows)
    body = []
    for r in rows:
        size = f"{r.get('dim')}->{r.get('hidden')}" if r.get("dim") else ""
        body.append([r["backend"], _dynamic(r), str(r["tokens"]), size, str(r.get("dtype", "")), str(r.get("mode", "")),
                     "-" if r.get("error") else str(r.get("compiles", "-")), fmt_s(r.get("first_call_s")),
                     fmt_s(r.get("median_s")), "none" if r.get("compile_s") == 0 else fmt_s(r.get("compile_s")),
                     _payback(r),
                     (r.get("error") or r.get("note") or "").replace("|", "\\|")])
    head = ["backend", "dynamic", "tokens", "dim->hidden", "dtype", "mode", "compiles", "first call", "median",
            "compile cost", "paid back after", "notes"]
    totals = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["backend"], _dynamic(r)), []).append(r)
    for (backend, dyn), rs in groups.items():
        n = sum(r.get("compiles") or 0 for r in rs)
        timed = [r["first_call_s"] for r in rs if r.get("first_call_s") is not None]
        first = f"first calls {fmt_s(sum(timed))} in all" if timed else "first calls not timed"
        totals.append(f"- {backend}" + (f" (dynamic={dyn})" if dyn != "-" else "")
                      + f": {n} compile(s) over {len(rs)} shape(s), {first}")
    counters = list(dict.fromkeys(f"- {r['backend']}: {r['compile_counter']}" for r in rows
                                  if r.get("compile_counter")))
    intro = ("One compiled function called on inputs of each token count in turn, in the order shown. Compiles: "
             "the (re)compilations that shape caused, read from the framework's own counter (below), never "
             "inferred from time; a timed loop that recompiles is an error. Compile cost = first call - median. "
             "Paid back after: that cost over the per-call saving against the fastest shape-generic backend at "
             "the same shape (one that compiles nothing per shape), only where the compiled step is faster beyond "
             "both medians' IQRs (the rule of `compare diff`); otherwise it never pays back.")
    return ("## Compile cost and shape generality\n\n" + intro + "\n\n" + table(head, body) + "\n\n"
            + "\n".join(totals) + ("\n\nCounters:\n\n" + "\n".join(counters) if counters else ""))

def run_shape_sweep(cases: list[Case], tokens: list[int], budget_s: float,
                progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Compile cost per token count (``compare.shapes``) at each case's dim, hidden and dtype, mode fwd:
    torch.compile (dynamic False, then True), torch-eager, torch-triton (where it runs), jax.jit."""
    from jax_impl import recompiles as jax_rc
    from torch_impl import device as tdev
    from torch_impl import recompiles as torch_rc

    rows: list[dict[str, Any]] = []
    for base in cases:
        def make(t: int, base: Case = base) -> Case:
            return case_for_tokens(base, t)

        progress(f"shape sweep {base.model} {base.shape.dim}->{base.shape.hidden} {base.dtype}: tokens {tokens}")
        for dynamic in (False, True):
            rows += torch_rc.shape_sweep(make, tokens, dynamic, budget_s=budget_s)
        rows += torch_rc.shape_sweep(make, tokens, backend="torch-eager", budget_s=budget_s)
        if tdev.triton_status()[0]:
            rows += torch_rc.shape_sweep(make, tokens, backend="torch-triton", budget_s=budget_s)
        rows += jax_rc.shape_sweep(make, tokens, budget_s=budget_s)
    return with_payback(rows)


def sweep_goldens(make: GoldenFactory, tokens: Sequence[int]) -> list[Golden]:
    """The golden data of each token count of a shape sweep; every other dimension must stay the same."""
    if not tokens:
        raise InputError("shape sweep needs at least one token count")
    out = []
    for t in tokens:
        got = make(t)
        g = golden_for(got) if isinstance(got, Case) else got
        if g.case.shape.tokens != t:
            raise InputError(f"the factory's case for {t} tokens has {g.case.shape.tokens} tokens")
        out.append(g)
    first = out[0].case
    for g in out[1:]:
        c = g.case
        if (c.model, c.dtype, c.shape.dim, c.shape.hidden) != (first.model, first.dtype, first.shape.dim,
                                                                first.shape.hidden):
            raise InputError(f"a shape sweep varies tokens only; {c.name} differs from {first.name} in more")
    return out
