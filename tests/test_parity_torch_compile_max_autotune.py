"""torch-compile-max-autotune against the float64 golden on every committed case it implements
(``tests/parity_backends.py``): a group of its own, since each case is an autotuned compile."""

from __future__ import annotations

import pytest

from tests.parity_backends import backend_parity_tests

pytestmark = pytest.mark.quick

test_forward_parity, test_gradient_parity_fwd_bwd, test_gradient_parity_bwd_alone = backend_parity_tests(
    "torch-compile-max-autotune"
)
