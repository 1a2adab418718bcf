"""The backend contract and the registry: one frozen line per backend (and probe), the tensor-parallel contract;
backends themselves live in torch_impl and jax_impl and load lazily."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem")
