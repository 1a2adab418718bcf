"""Every jax backend that runs here against the float64 golden on the committed heavy-tailed ``odd`` cases
(``2x33x160``, Student-t inputs; where XLA's float32 tanh may deviate under capped instruction sets): in the slow
tier and the capped-ISA pass (a compile at a new shape each; 30 s of ``make test`` with cold caches under the AVX2
caps)."""

from __future__ import annotations

import pytest

from tests.parity_backends import backend_parity_tests, heavy_tailed

pytestmark = pytest.mark.slow

test_forward_parity, test_gradient_parity_fwd_bwd, _ = backend_parity_tests("jax", cases=heavy_tailed)
