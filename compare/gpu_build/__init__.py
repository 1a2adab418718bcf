"""The GPU build: compile every Triton kernel for a GPU target without one, and its table."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "run")
