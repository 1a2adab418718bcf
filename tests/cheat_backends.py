"""Three cheats: backends whose ``prepare`` computes the answer from the :class:`~compare.problem.golden.Problem` it is
handed
and returns it, rounded to the dtype, at every step (and on any inputs). Right on the first call, right on the last
timed call, faster than any real step: only the check on fresh inputs (``compare.gate.fresh``) can see them.

- ``cheat-golden``: ``golden_for(problem.case).ref``;
- ``cheat-file``: the committed golden file itself (``compare.problem.golden.load_file``);
- ``cheat-compute``: ``compare.problem.reference.compute(..., Arith.exact())`` on the problem's own inputs and weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.problem.golden import Problem, golden_for, load_file
from compare.problem.reference import Arith, compute, round_to_dtype
from compare.run.cell import MODE_TENSORS


def _from_golden(problem: Problem) -> dict[str, np.ndarray]:
    return dict(golden_for(problem.case).ref)


def _from_file(problem: Problem) -> dict[str, np.ndarray]:
    return dict(load_file(problem.case).ref)


def _computed(problem: Problem) -> dict[str, np.ndarray]:
    return compute(problem.case.model, problem.x, problem.params, problem.dy, Arith.exact())


class Cheat:
    def __init__(self, name: str, answer: Callable[[Problem], dict[str, np.ndarray]]) -> None:
        self.name = name
        self.answer = answer

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        want = MODE_TENSORS[mode]
        dtype = problem.case.dtype
        stored = {k: round_to_dtype(v, dtype) for k, v in self.answer(problem).items() if want(k)}

        def step() -> dict[str, np.ndarray]:
            return stored

        def fresh(inputs: dict[str, np.ndarray]) -> Any:  # it implements the interface, and still answers from memory
            return stored

        return Prepared(
            step=step,
            sync=lambda _outs: None,
            to_numpy=lambda out: {k: np.asarray(v, dtype=np.float64) for k, v in out.items()},
            fresh=fresh,
        )


CHEATS = {
    "cheat-golden": Cheat("cheat-golden", _from_golden),
    "cheat-file": Cheat("cheat-file", _from_file),
    "cheat-compute": Cheat("cheat-compute", _computed),
}


def spec(name: str) -> BackendSpec:
    """A registry line for one cheat (``BackendSpec.load`` imports this module and reads ``CHEATS[name]``)."""
    return _CheatSpec(
        name=name, framework="torch", target="tests.cheat_backends", about="a cheat: returns the stored answer"
    )


class _CheatSpec(BackendSpec):
    def load(self) -> Any:
        return CHEATS[self.name]
