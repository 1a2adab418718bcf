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

One row per shape, schema in ``compare.report.shapes``: the counter's extra fields sit after ``compile_counter``.
With ``keep_errors`` an exception of a first call (e.g. torch's recompile limit) is that row's ``error`` (its type
and first line, then ``error_note``) and the sweep goes on to the next shape; without it the exception propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from compare.problem.cases import check_name
from compare.problem.golden import Golden
from compare.problem.shape_cases import GoldenFactory, row_fields, sweep_goldens
from compare.timing import timer

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
    """A framework's compile counter, read around each shape's first call and around its timed samples."""

    #: What the count reads (each row's ``compile_counter``).
    description: str

    def start(self) -> None:
        """A new window begins (the first call, then the timed samples): forget what was seen before it."""
        ...

    def count(self) -> int:
        """Compilations counted so far in this process (only differences are used)."""
        ...

    def first_call_fields(self) -> dict[str, Any]:
        """Extra row fields read from the first call's window (``{}`` for none), placed after ``compile_counter``."""
        ...

    def moved(self, since: int) -> str:
        """``""`` when nothing compiled in this window since ``count()`` was ``since``; else what compiled (for
        the error, e.g. ``"1 more graph(s)"``)."""
        ...


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
