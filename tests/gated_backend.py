"""A test-only backend: torch-eager whose every step first waits for the test's permission (a file), so a test can
interrupt a run while this cell is certainly in flight, with no race against the clock.

The test names a folder in ``FUSION_COMPARE_TEST_GATE``; the step creates ``started`` there, then waits until
``release`` appears (or ``WAIT_S`` passes: then it raises, so a broken test fails as an error cell instead of
hanging). With ``FUSION_COMPARE_TEST_GATE_DTYPE`` set, only the cases of that dtype are gated (the cells of a case
finish together, so a test gates a later case to interrupt a run after an earlier one has finished).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.problem.golden import Problem

NAME = "gated"
GATE_ENV = "FUSION_COMPARE_TEST_GATE"
DTYPE_ENV = "FUSION_COMPARE_TEST_GATE_DTYPE"
WAIT_S = 300.0
SPEC = BackendSpec(
    name=NAME,
    framework="torch",
    target="tests.gated_backend",
    about="torch-eager whose step waits for the test's release file",
)


def wait_for_release(gate: Path) -> None:
    """Say the step has started, then block until the test releases it."""
    (gate / "started").touch()
    deadline = time.monotonic() + WAIT_S
    while not (gate / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate / 'release'} did not appear within {WAIT_S:.0f} s")
        time.sleep(0.02)


class GatedBackend:
    name = NAME

    def availability(self) -> Availability:
        return spec("torch-eager").availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        gate = Path(os.environ[GATE_ENV])
        prepared = spec("torch-eager").load().prepare(problem, mode)
        if os.environ.get(DTYPE_ENV, problem.case.dtype) != problem.case.dtype:
            return prepared
        inner = prepared.step

        def step() -> Any:
            wait_for_release(gate)
            return inner()

        return dataclasses.replace(prepared, step=step)


BACKEND = GatedBackend()
