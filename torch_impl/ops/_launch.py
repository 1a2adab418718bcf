"""A profiler range around each Triton launch, where the profiler cannot see the kernel itself.

Compiled on a GPU, a launch is a device kernel that ``torch.profiler`` records by name. Under Triton's CPU
interpreter it is Python running numpy, which the profiler sees only as a blur of host copies: each launch is then
wrapped in ``record_function("triton::<kernel>")``, which ``torch_impl.profiling`` counts as one ``custom`` kernel
(and nothing inside it). The range covers the launch only, so the framework ops around it (the recompute GEMMs of a
backward, say) are still counted one by one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.profiler import record_function

from triton_impl.env import interpreted

#: Prefix of every launch range's name.
PREFIX = "triton::"


@contextlib.contextmanager
def launch(kernel: str) -> Iterator[None]:
    """Wrap one launch of ``kernel`` (its function name) in a profiler range when interpreting."""
    if not interpreted():
        yield
        return
    with record_function(PREFIX + kernel):
        yield
