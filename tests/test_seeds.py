"""A verdict that holds for the user's seed: over 10 seeds of ``tiny`` (every model, every dtype, fwd+bwd; ``odd`` in
``tests/test_seeds_odd.py``), no real backend fails, and a backend deviates on a tensor on every seed or on none.

The fast real backends of each framework run here (torch-eager, jax-xla); the others are judged on the committed
seed-0 cases (``tests/test_parity.py``), on this CPU and under capped instruction sets."""

from __future__ import annotations

import pytest

from tests.seed_sweep import compiled_once_per_shape, seed_test

pytestmark = pytest.mark.standard

__all__ = ["compiled_once_per_shape"]  # the module's JAX compilation cache (autouse)

test_no_real_backend_fails_and_a_deviation_holds_on_every_seed = seed_test("tiny")
