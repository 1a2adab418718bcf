"""The GPU build: every registered backend's Triton kernels compiled for a GPU target without one (planned, cached
and run here, compiled in triton-side worker processes), and its table."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends", "run")
