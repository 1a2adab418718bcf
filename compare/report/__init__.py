"""The report, a pure function of the results: every section (the compile-cost sweep's and the GPU build table
too), the summary, plots, `diff` between two runs and the A/B report. It imports nothing above results: no
measuring, no command."""

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
)
