"""``tests/test_seeds.py`` on the ``odd`` preset: 10 seeds, every model and dtype, fwd+bwd; no real backend fails and
a deviation holds on every seed or on none."""

from __future__ import annotations

import pytest

from tests.seed_sweep import compiled_once_per_shape, seed_test

pytestmark = pytest.mark.standard

__all__ = ["compiled_once_per_shape"]  # the module's JAX compilation cache (autouse)

test_no_real_backend_fails_and_a_deviation_holds_on_every_seed = seed_test("odd")
