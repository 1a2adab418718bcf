"""torch-compile against the float64 golden on the committed heavy-tailed ``odd`` cases (``2x33x160``, Student-t
inputs), every model and dtype: in the slow tier and the capped-ISA pass, since each is a compile at a new shape
(about 2 s cold; 24 of them were 45 s of ``make test`` with cold Inductor caches under the AVX2 caps)."""

from __future__ import annotations

import pytest

from tests.parity_backends import backend_parity_tests, heavy_tailed

pytestmark = pytest.mark.slow

test_forward_parity, test_gradient_parity_fwd_bwd, _ = backend_parity_tests("torch-compile", cases=heavy_tailed)
