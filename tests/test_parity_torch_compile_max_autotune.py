"""torch-compile-max-autotune against the float64 golden on every committed case it implements
(``tests/parity_backends.py``): a group of its own, in the slow tier, since each case is an autotuned compile.

Measured on 2 cores (with other load): 57 tests in 7 min 03 s with cold Inductor caches (10 to 29 s per fwd+bwd
case), 2 min 14 s with warm ones."""

from __future__ import annotations

import pytest

from tests.parity_backends import backend_parity_tests

pytestmark = pytest.mark.slow

test_forward_parity, test_gradient_parity_fwd_bwd, test_gradient_parity_bwd_alone = backend_parity_tests(
    "torch-compile-max-autotune"
)
