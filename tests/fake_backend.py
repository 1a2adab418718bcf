"""A backend defined entirely in a test module: it registers itself with one registry line (in the test) and must
then appear everywhere a backend appears, with no other edit. It runs the eager module through its own file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory

NAME = "fake-eager"
#: The one registry line a new backend needs.
SPEC = BackendSpec(
    name=NAME,
    framework="torch",
    target="tests.fake_backend",
    about="a test's stand-in for a new backend",
    plan="eager",
    shape_sweep=({},),
)


class FakeBackend:
    name = NAME

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        return spec("torch-eager").load().prepare(problem, mode)

    def shape_sweep(self, make: GoldenFactory, tokens: Sequence[int], *, budget_s: float) -> list[dict[str, Any]]:
        rows = spec("torch-eager").load().shape_sweep(make, tokens, budget_s=budget_s)
        return [{**r, "backend": NAME} for r in rows]


BACKEND = FakeBackend()
