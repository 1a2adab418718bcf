"""The shared timer (compile apart, a full sync per sample, interleaved rounds) and the significance rules that compare
two timings."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem")
