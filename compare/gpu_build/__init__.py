"""The GPU build: every registered backend's Triton kernels compiled for a GPU target without one (planned, cached
and run here, compiled in triton-side worker processes); its table's layout is in results, its rendering in report."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends", "results", "run", "report")
