"""The results document: typed, frozen records of every cell, the environment and the tensor-parallel extras, with
their JSON form; the A/B document; and the GPU build table's layout."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends", "timing", "gate", "kernels", "cost")
