"""Profiled kernels: names, classification (GEMM, elementwise, collective, ...) and the per-step summary."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats",)
