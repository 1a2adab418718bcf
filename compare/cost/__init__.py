"""The cost model: modelled FLOPs, bytes and kernels per backend plan, the communication model of tensor parallelism,
and the ceiling records."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends", "timing")
