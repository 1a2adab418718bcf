"""The canonical (out, in) weights map to torch (out, in) and Flax (in, out) and give the same outputs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from compare.problem.weights import linear_weight

pytestmark = pytest.mark.quick


@pytest.mark.standard
def test_mapping_on_a_non_square_weight() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3)).astype(np.float32)  # (out=5, in=3)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    lin = torch.nn.Linear(3, 5, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(linear_weight(w, "torch")))
    flax_lin = nnx.Linear(3, 5, use_bias=False, rngs=nnx.Rngs(0))
    flax_lin.kernel.set_value(jnp.asarray(linear_weight(w, "flax")))
    assert flax_lin.kernel[...].shape == (3, 5) and lin.weight.shape == (5, 3)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(lin(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(flax_lin(jnp.asarray(x))), want, rtol=1e-5)
    # the map is its own inverse: a flax-layout gradient comes back to (out, in)
    assert np.array_equal(linear_weight(linear_weight(w, "flax"), "flax"), w)


def test_bad_layout_and_rank_are_refused() -> None:
    with pytest.raises(ValueError, match="known: torch, flax"):
        linear_weight(np.zeros((2, 2)), "keras")  # type: ignore[arg-type]  # deliberately not a layout
    with pytest.raises(ValueError, match="2-D"):
        linear_weight(np.zeros((2, 2, 2)), "torch")
