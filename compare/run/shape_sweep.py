"""The compile-cost sweep of a run: every registered backend that joins it (``BackendSpec.sweep``) swept over the
token counts (:func:`run_shape_sweep`), within the run's time budget (:func:`budgeted_sweep`). Rows are schema'd, and
their payback judged, in ``compare.timing.compile_sweep``; ``compare.report.shapes`` renders them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from compare.backends.registry import BackendSpec
from compare.problem.cases import Case
from compare.problem.shape_cases import case_for_tokens
from compare.timing.compile_sweep import with_payback


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
    line joins the sweep (``BackendSpec.shape_sweep``: one run per variant, e.g. ``dynamic=False`` then ``True``) and
    that implements the case's model and can run here. Each backend builds its own compiled forward and reads its own
    recompile counter (its ``shape_sweep`` method); rows are schema'd in ``compare.timing.compile_sweep``. With a
    ``deadline`` (``time.monotonic``: the end of the sweep's share of a run's budget) no variant starts after it, and
    each one left out is said to ``cut`` (a variant's compiles are not cut once started)."""
    from compare.backends.registry import BACKENDS

    rows: list[dict[str, Any]] = []
    chosen = list(BACKENDS.values()) if specs is None else list(specs)
    for base in cases:
        progress(f"shape sweep {base.model} {base.shape.dim}->{base.shape.hidden} {base.dtype}: tokens {tokens}")
        for s in chosen:
            if not s.shape_sweep or base.model not in s.models:
                continue
            avail = s.availability()
            if not avail.ok:
                progress(f"shape sweep: {s.name} left out: {avail.reason}")
                continue
            backend = s.load()
            for variant in s.shape_sweep:
                if deadline is not None and time.monotonic() >= deadline:
                    if cut is not None:
                        shown = ", ".join(f"{k}={v}" for k, v in variant.items())
                        cut(
                            f"compile-cost sweep: {s.name}{f' ({shown})' if shown else ''} at {base.dtype} left out "
                            f"(the sweep's share of the budget was spent)"
                        )
                    continue
                # an optional method of the Backend protocol: a registry line with ``shape_sweep`` variants promises it
                sweep_fn = getattr(backend, "shape_sweep")  # noqa: B009
                rows += sweep_fn(functools.partial(case_for_tokens, base), tokens, budget_s=budget_s, **variant)
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
        return sum(
            len(s.shape_sweep) for s in BACKENDS.values() if s.shape_sweep and any(c.model in s.models for c in chosen)
        )

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
