"""The cases of a shape sweep: one case per token count, every other dimension the same. Pure Python.

Shared by the compile-cost sweep's core (``compare.run.shape_sweep``) and the frameworks' sweep runners
(``torch_impl.recompiles``, ``jax_impl.recompiles``), so that neither imports the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from compare.problem.cases import Case, InputError, Shape
from compare.problem.golden import Golden, golden_for

#: Makes the case (or its golden data) of a shape sweep for a token count.
GoldenFactory = Callable[[int], Case | Golden]


def case_for_tokens(base: Case, tokens: int) -> Case:
    """``base`` with ``tokens`` tokens as one sequence (``batch = 1, seq = tokens``); dim, hidden, dtype kept."""
    s = base.shape
    return dataclasses.replace(base, shape=Shape(1, tokens, s.dim, s.hidden))


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
        if _kept(g.case) != _kept(first):
            raise InputError(f"a shape sweep varies tokens only; {g.case.name} differs from {first.name} in more")
    return out


def _kept(case: Case) -> tuple[str, str, int, int]:
    """What every case of a shape sweep shares."""
    return case.model, case.dtype, case.shape.dim, case.shape.hidden


def row_fields(case: Case) -> dict[str, Any]:
    """The fields of a compile-sweep row that say which shape it is (row schema in ``compare.timing.compile_sweep``)."""
    s = case.shape
    return {"tokens": s.tokens, "model": case.model, "dim": s.dim, "hidden": s.hidden, "dtype": case.dtype}
