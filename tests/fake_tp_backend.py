"""A tensor-parallel backend and runtime defined in a test module, framework-free (numpy), for the launcher's tests.

Its group is one process (``devices`` launch); its step is the plain same-dtype computation, on the case's inputs or,
in ``bind``, on the inputs it is handed. ``FAKE_TP_FAULT`` (``crash@MODE``, ``hang@MODE``, ``raise@MODE``) makes its
``prepare`` die, hang or raise on cells of that mode, so the tests can watch the launcher turn each into an error
result and go on; ``nofresh@MODE`` leaves ``Prepared.bind`` unset there (the worker must refuse to judge it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.backends.tp import Collective, Group, Launch, TPParts
from compare.problem.golden import Problem
from compare.problem.reference import compute
from tests.numpy_backend import blas_plain

NAME = "fake-tp"
SPEC = BackendSpec(
    name=NAME,
    framework="numpy",
    target="tests.fake_tp_backend",
    about="a test's framework-free tensor-parallel backend",
    models=("geglu", "swiglu", "gelu-mlp"),
    runtime="tests.fake_tp_backend",
    comm="megatron",
    launches=("devices",),
)
LAUNCHES = ("devices",)


class OneProcess:
    """A group of one process: every collective is the identity."""

    nproc = 1
    rank = 0
    backend = "numpy, one process"

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def barrier(self) -> None:
        pass

    def max_all(self, values: Sequence[float]) -> list[float]:
        return list(values)

    def gather(self, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [obj]

    def close(self) -> None:
        pass


def init(launch: Launch) -> Group:
    return OneProcess(launch.world_size)


def _fault(mode: str) -> None:
    kind, _, where = os.environ.get("FAKE_TP_FAULT", "").partition("@")
    if where != mode:
        return
    if kind == "crash":
        os._exit(9)
    if kind == "hang":
        time.sleep(3600)
    if kind == "raise":
        raise RuntimeError(f"fake-tp was told to fail on {mode}")


class FakeTP:
    name = NAME

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        _fault(mode)
        case = problem.case
        keep = {"fwd": lambda k: k == "y", "bwd": lambda k: k != "y", "fwd+bwd": lambda k: True}[mode]

        def step_on(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            dy = inputs["dy"] if mode != "fwd" else None
            out = compute(case.model, inputs["x"], problem.params, dy, blas_plain(case.dtype))
            return {k: v for k, v in out.items() if keep(k) and (k == "y" or k == "dx" or k[1:] in problem.params)}

        def step() -> dict[str, np.ndarray]:
            return step_on(problem.inputs)

        payload = case.shape.tokens * case.shape.dim * 4
        count = {"fwd": 1, "bwd": 1, "fwd+bwd": 2}[mode]
        tp = TPParts(
            collectives=lambda: [Collective("all-reduce", count, count * payload, "fake")],
            comm_only=lambda: np.zeros(1),
            compute_only=step,
            setup_s={"weights": 0.0},
            layout="numpy stand-in",
        )

        def bind(inputs: dict[str, np.ndarray], _slot: int) -> Callable[[], dict[str, np.ndarray]]:
            return lambda: step_on(inputs)

        bound = None if os.environ.get("FAKE_TP_FAULT") == f"nofresh@{mode}" else bind
        return Prepared(step=step, sync=lambda outs: None, to_numpy=lambda out: dict(out), tp=tp, bind=bound)


BACKEND = FakeTP()
