"""Every torch-compile backend that runs here against the float64 golden on the committed ``tiny`` and ``tokens``
cases it implements (``tests/parity_backends.py``); the heavy-tailed ``odd`` ones are
``tests/test_parity_torch_compile_odd.py``'s."""

from __future__ import annotations

import pytest

from tests.parity_backends import backend_parity_tests, heavy_tailed

pytestmark = pytest.mark.quick

test_forward_parity, test_gradient_parity_fwd_bwd, test_gradient_parity_bwd_alone = backend_parity_tests(
    "torch-compile", cases=lambda c: not heavy_tailed(c)
)
