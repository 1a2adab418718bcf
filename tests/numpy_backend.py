"""A test-only single-device backend with no framework: the plain same-dtype computation in numpy
(``compare.problem.reference``), honest (it computes every answer, also on fresh inputs), so a process that runs it
starts in well under a second. ``FUSION_COMPARE_TEST_STEP_S`` makes every step sleep that long first, so a test can
land a signal inside a cell; ``FUSION_COMPARE_TEST_MARK_DIR`` makes every ``prepare`` leave a file there named by the
Ray node and the process that runs it (``<node id>.<pid>``; ``local.<pid>`` outside Ray), so a test can kill the
worker or remove the node in flight; ``FUSION_COMPARE_TEST_DIE_AFTER=N`` makes the process kill itself (SIGKILL) at
its N-th step, a worker that dies mid-measurement (``tests/test_ab.py``). The fault-injection suite
(``tests/faults.py``), the Ray engine's tests (``tests/test_ray_sweep.py``) and the A/B tests run it."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.problem.golden import Problem
from compare.problem.reference import Arith, compute


def blas_plain(dtype: str) -> Arith:
    """The plain computation with numpy's float32 GEMM (the machine's BLAS: another honest accumulation order, as
    ``tests/variants.py``'s) in place of the fixed-order one, which costs about 25 ms a step on ``tiny``: the fault
    and Ray tests' runs spend their CPU on the tool, not on this stand-in."""
    return Arith(dtype, gemm=lambda a, b: np.asarray(a, np.float32) @ np.asarray(b, np.float32))


NAME = "numpy-plain"
STEP_ENV = "FUSION_COMPARE_TEST_STEP_S"
MARK_ENV = "FUSION_COMPARE_TEST_MARK_DIR"
DIE_ENV = "FUSION_COMPARE_TEST_DIE_AFTER"
SPEC = BackendSpec(
    name=NAME,
    framework="numpy",
    target="tests.numpy_backend",
    about="a test's framework-free backend: the plain computation in numpy",
    models=("linear", "geglu", "swiglu", "gelu-mlp"),
)


class NumpyPlain:
    name = NAME

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        case = problem.case
        pause = float(os.environ.get(STEP_ENV, "0") or 0)
        die_after, steps = int(os.environ.get(DIE_ENV, "0") or 0), [0]
        mark = os.environ.get(MARK_ENV)
        if mark:
            ray = sys.modules.get("ray")
            node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else "local"
            (Path(mark) / f"{node}.{os.getpid()}").touch()

        def step_on(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            steps[0] += 1
            if steps[0] == die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if pause:
                time.sleep(pause)
            dy = inputs["dy"] if mode != "fwd" else None
            out = compute(case.model, inputs["x"], problem.params, dy, blas_plain(case.dtype))
            keep = {"fwd": {"y"}, "bwd": set(out) - {"y"}, "fwd+bwd": set(out)}[mode]
            return {k: v for k, v in out.items() if k in keep}

        def step() -> dict[str, np.ndarray]:
            return step_on(problem.inputs)

        def bind(inputs: dict[str, np.ndarray], _slot: int) -> Callable[[], dict[str, np.ndarray]]:
            return lambda: step_on(inputs)

        return Prepared(step=step, sync=lambda outs: None, to_numpy=lambda out: dict(out), bind=bind)


BACKEND = NumpyPlain()
