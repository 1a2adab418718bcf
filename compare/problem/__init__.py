"""What is computed: the cases and presets, the golden data and its float64 reference, the plain same-dtype
computation, bit-fixed arithmetic, the disk cache of generated data and the reader of checkpoint weights."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats",)
