"""The routing of a mixture-of-experts step: the experts its router chose, read beside the tensors the gate judges.

A MoE backend's step output carries its router's choice, ``routing`` (``[T, k]`` integers over the flattened tokens,
each row largest score first), beside ``y``, ``dx`` and ``d<param>`` (``Prepared.to_numpy``); it is not a tensor to
judge, so :func:`split` takes it apart before the gate sees the tensors.
"""

from __future__ import annotations

import numpy as np

#: The name of a routed step's experts in its output.
ROUTING = "routing"


def split(tensors: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """``(the tensors to judge, the routing or None)`` of a step's output read as named arrays."""
    if ROUTING not in tensors:
        return tensors, None
    rest = {k: v for k, v in tensors.items() if k != ROUTING}
    return rest, np.asarray(tensors[ROUTING])
