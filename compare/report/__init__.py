"""The report, a pure function of the results: every section, the summary, plots and `diff` between two runs."""

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
    "gpu_build",
)
