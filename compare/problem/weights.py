"""The one place where canonical weights meet framework layouts.

Canonical weights (golden files, ``compare.problem.reference``) use torch ``nn.Linear`` layout ``(out, in)``:
``y = x @ W.T``. Flax ``nnx.Linear`` stores its ``kernel`` as ``(in, out)``: ``y = x @ kernel``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Layout = Literal["torch", "flax"]
LAYOUTS: tuple[str, ...] = ("torch", "flax")


def linear_weight(w: np.ndarray, layout: Layout) -> np.ndarray:
    """Map a canonical ``(out, in)`` weight to ``layout``: torch ``(out, in)``, flax ``(in, out)``.

    A 1-D bias is the same in both. The result is a contiguous copy, safe to hand to a framework.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if w.ndim == 1:
        return np.ascontiguousarray(w)
    if w.ndim != 2:
        raise ValueError(f"a linear weight is 2-D (out, in) or a 1-D bias, got shape {w.shape}")
    return np.ascontiguousarray(w if layout == "torch" else w.T)
