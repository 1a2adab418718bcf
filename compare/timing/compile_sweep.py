"""The compile-cost sweep's loop, framework-neutral: one step per token count, its first call timed apart from its
steady state, the compiles it caused read from the framework's own counter. Pure Python.

The frameworks' runners (``torch_impl.recompiles``, ``jax_impl.recompiles``) build their step once from the first
shape's problem and hand :func:`run` the two framework parts: ``step_for`` (the zero-argument step and its ``sync``
over one shape's inputs, already on the device) and a :class:`CompileCounter` (Dynamo's graph count plus Triton's
JIT hook; ``jax.jit``'s executable cache plus ``jax.monitoring``'s compile events). Per shape, in order:

1. ``step_for(golden)`` (any conversion it compiles happens here, before the count starts);
2. ``counter.start()``, ``before = counter.count()``, the first call (``compare.timing.timer.first_call``), and
   ``compiles = counter.count() - before``, with the counter's own extra fields of that window;
3. when ``timed``: ``counter.start()``, the steady state (``compare.timing.timer.measure``), and a RuntimeError if
   the counter says anything compiled during those samples (a timed loop that recompiles measures compiles).

One row per shape (a *shape sweep*: ``torch_impl.recompiles.shape_sweep``, ``jax_impl.recompiles.shape_sweep``;
the counter's extra fields sit after ``compile_counter``)::

    {"backend": str, "framework": "torch" | "jax", "dynamic": bool | None (None: no compiler involved),
     "tokens": int, "model", "dim", "hidden", "dtype", "mode", "device",
     "compiles": int,            # (re)compilations this shape caused, read from the framework's own counter
     "compile_counter": str,     # which counter
     "first_call_s": float | None, "median_s": float | None, "iqr_s": float | None,   # shared timer
     "timed": bool, "generic": bool (shape-generic: compiles nothing per shape), "note": str, "error": str}

With ``keep_errors`` an exception of a first call (e.g. torch's recompile limit) is that row's ``error`` (its type
and first line, then ``error_note``) and the sweep goes on to the next shape; without it the exception propagates.

:func:`with_payback` adds ``compile_s`` (the first call's excess over a steady call), ``payback_verdict`` (is the
compiled step faster than the fastest shape-generic backend at the same shape, beyond both timings' noise, by
:func:`compare.timing.significance.compare_timing`) and ``payback_calls`` (the calls after which that compile is paid
back, only when it is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from compare.formats.codec import from_json
from compare.problem.cases import check_name
from compare.problem.golden import Golden
from compare.problem.shape_cases import GoldenFactory, row_fields, sweep_goldens
from compare.timing import timer
from compare.timing.significance import FASTER, compare_timing
from compare.timing.timer import Timing

#: The modes a shape sweep runs.
SWEEP_MODES: tuple[str, ...] = ("fwd", "fwd+bwd")

#: A zero-argument step (one call of the compiled forward, or forward and backward, on one shape's inputs).
Step = Callable[[], Any]
#: Blocks until a step's output is complete on the device.
Sync = Callable[[Any], None]
#: The step of one shape and its sync, built by the framework from that shape's golden data.
StepFor = Callable[[Golden], tuple[Step, Sync]]
Row = dict[str, Any]


class CompileCounter(Protocol):
    """A framework's compile counter, read around each shape's first call and around its timed samples. ``start``:
    a new window begins (the first call, then the timed samples), forget what was seen before it; ``count``: the
    compilations counted so far in this process (only differences are used); ``first_call_fields``: extra row fields
    read from the first call's window (``{}`` for none), placed after ``compile_counter``; ``moved(since)``: ``""``
    when nothing compiled in this window since ``count()`` was ``since``, else what compiled (for the error, e.g.
    ``"1 more graph(s)"``)."""

    #: What the count reads (each row's ``compile_counter``).
    description: str

    def start(self) -> None: ...

    def count(self) -> int: ...

    def first_call_fields(self) -> dict[str, Any]: ...

    def moved(self, since: int) -> str: ...


def goldens(make: GoldenFactory, tokens: Sequence[int], mode: str) -> list[Golden]:
    """Check ``mode`` is one of :data:`SWEEP_MODES` and return the golden data of each token count
    (``compare.problem.shape_cases.sweep_goldens``: every other dimension the same)."""
    check_name("mode", mode, SWEEP_MODES)
    return sweep_goldens(make, tokens)


def _error(exc: Exception, note: str) -> str:
    """A first call's exception as a row's ``error``: its type and first line, then ``note``."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}".strip() + note


def run(
    golden_list: Sequence[Golden],
    *,
    backend: str,
    framework: str,
    device: str,
    step_for: StepFor,
    counter: CompileCounter,
    mode: str,
    budget_s: float,
    dynamic: bool | None,
    generic: bool,
    timed: bool = True,
    note: str = "",
    keep_errors: bool = False,
    error_note: str = "",
) -> list[Row]:
    """Call one backend's step on each shape of ``golden_list`` in turn; one row per shape (see the module
    docstring for the order and the errors).

    ``backend``, ``framework``, ``device``, ``mode``, ``dynamic`` (``None``: no compiler involved), ``generic``
    (shape-generic: compiles nothing per shape), ``timed`` (``False``: compiles only, no timing columns) and
    ``note`` are recorded in every row; ``budget_s`` is the timer's sampling budget per shape.
    """
    rows: list[Row] = []
    for g in golden_list:
        step, sync = step_for(g)
        head: Row = {
            "backend": backend,
            "framework": framework,
            "dynamic": dynamic,
            **row_fields(g.case),
            "mode": mode,
            "device": device,
        }
        tail: Row = {"timed": timed, "generic": generic, "note": note, "error": ""}
        timing: Row = {"first_call_s": None, "median_s": None, "iqr_s": None}
        counter.start()
        before = counter.count()
        try:
            first_s, out = timer.first_call(step, sync)
        except Exception as exc:
            if not keep_errors:
                raise
            compile_row: Row = {"compiles": None, "compile_counter": counter.description}
            rows.append({**head, **compile_row, **timing, **tail, "error": _error(exc, error_note)})
            continue
        del out
        after_first = counter.count()
        compile_row = {
            "compiles": after_first - before,
            "compile_counter": counter.description,
            **counter.first_call_fields(),
        }
        if timed:
            counter.start()
            t = timer.measure(step, sync, first_call_s=first_s, budget_s=budget_s)
            moved = counter.moved(after_first)
            if moved:
                raise RuntimeError(
                    f"{backend} (dynamic={dynamic}) compiled during the timed samples at {g.case.shape.tokens} "
                    f"tokens ({moved}): the timing would measure compiles"
                )
            timing = {"first_call_s": first_s, "median_s": t.median_s, "iqr_s": t.iqr_s}
        rows.append({**head, **compile_row, **timing, **tail})
    return rows


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
