"""Sweeps on a cluster: the Ray engine (sweep --engine ray), each cell a Ray task with the resources it needs, the
golden data checked where it lands, every row labelled with its node; it imports Ray only when that engine is asked
for."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = (
    "formats",
    "problem",
    "backends",
    "timing",
    "gate",
    "kernels",
    "cost",
    "results",
    "run",
    "report",
)
