"""Sweeps: running a grid of cells resumably (its grid and store are compare.run's), the engines, retries and the
per-cell worker process."""

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
