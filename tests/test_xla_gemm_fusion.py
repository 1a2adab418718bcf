"""``jax-xla-gemm-fusion``: XLA reads its flags once per process, so the backend runs only where the process started
with them, on a GPU; anywhere else it is unavailable and says why (never a silent plain jax-xla under its name)."""

from __future__ import annotations

import pytest

from compare.backends.registry import spec
from jax_impl import device
from jax_impl.backends.xla_gemm_fusion import FLAGS, missing_flags

pytestmark = pytest.mark.quick


def test_the_flags_it_needs_are_read_off_xla_flags() -> None:
    assert missing_flags("") == list(FLAGS)
    assert missing_flags(" ".join(("--xla_dump_to=/x", *FLAGS))) == []
    assert missing_flags(FLAGS[0]) == list(FLAGS[1:])
    assert missing_flags(FLAGS[0].replace("true", "false")) == list(FLAGS)  # the flag turned off is no flag


@pytest.mark.skipif(device.platform() == "gpu", reason="on a GPU it runs where its flags are set (gpu_check.sh)")
def test_off_a_gpu_it_is_unavailable_saying_why() -> None:
    a = spec("jax-xla-gemm-fusion").availability()
    assert not a.ok and a.reason.startswith("GPU only") and all(flag in a.reason for flag in FLAGS), a.reason
