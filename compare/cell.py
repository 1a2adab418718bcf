"""What running one cell (backend, case, mode) needs, in one process or in a tensor-parallel worker group: the
tensors each mode checks, the timing configuration, the plain same-dtype reference the gate measures against, and
the cost model's entry for the cell."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compare import costmodel
from compare.cases import Case
from compare.cost_types import Cost
from compare.golden import golden_for
from compare.parity import Parity, check_all, check_plain
from compare.reference import Arith, compute
from compare.registry import BackendSpec, Prepared

#: Which reference tensors each mode checks.
MODE_TENSORS: dict[str, Callable[[str], bool]] = {
    "fwd": lambda k: k == "y",
    "bwd": lambda k: k != "y",
    "fwd+bwd": lambda k: True,
}


#: A step that beats the measured matmul ceiling by more than this factor cannot have done its FLOPs.
IMPLAUSIBLE_FACTOR = 1.2


def plain_reference(case: Case) -> dict[str, np.ndarray]:
    """The plain same-dtype emulation of ``case`` (outputs and gradients), the parity gate's yardstick.

    Raises :class:`~compare.parity.UnusableCase` when it (or the reference) is not finite in the case dtype."""
    g = golden_for(case)
    plain = compute(case.model, g.x, g.params, g.dy, Arith.plain(case.dtype))
    check_plain(case.name, case.dtype, g.ref, plain)
    return plain


def model_cost(spec: BackendSpec, case: Case, mode: str) -> Cost | None:
    """The cost model's entry (``compare.costmodel.cost``) for a result; None exactly when the backend's registry
    line names no plan (it is not modelled). Any other problem is an error, not a silently missing row."""
    if spec.plan is None:
        return None
    return costmodel.cost(case, spec.name, mode)


def judge(
    prepared: Prepared, output: Any, ref: dict[str, np.ndarray], plain: dict[str, np.ndarray], dtype: str, who: str
) -> Parity:
    """The gate's verdict on one output of a step (``compare.parity.check_all``); a step that returns other tensors
    than the mode checks is an error naming ``who`` (the backend and mode)."""
    got = prepared.to_numpy(output)
    if set(got) != set(ref):
        raise RuntimeError(f"{who} returned tensors {sorted(got)}; expected {sorted(ref)}")
    return check_all(got, ref, plain, dtype)
