"""The GPU's last-level cache (L2) flush for the cold-cache timing (``compare.timing.llc``; the ``flush`` probe of
``compare.backends.registry.PROBES``): L2 from the CUDA device's properties, and a device buffer that a kernel reads
and writes before each cold call. A host buffer would not touch a GPU's L2."""

from __future__ import annotations

import torch

from compare.timing.llc import FLUSH_MULTIPLE, MIN_FLUSH_BYTES, CacheSize


class CudaFlush:
    """``buf += 1`` over an int8 buffer of ``nbytes`` on the current CUDA device (each byte read and written: every L2
    line is evicted), then a device sync, so the flush is done when the call returns."""

    def __init__(self, nbytes: int) -> None:
        self._buf = torch.zeros(nbytes, dtype=torch.int8, device="cuda")
        self.bytes = nbytes
        self.about = f"a {nbytes / 2**20:.0f} MiB CUDA buffer read and written before each call"

    def __call__(self) -> None:
        self._buf.add_(1)
        torch.cuda.synchronize()


def device_flush() -> tuple[CacheSize, CudaFlush] | None:
    """The CUDA device's L2 and a flush of :data:`FLUSH_MULTIPLE` times it; None without a CUDA device."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0))
    size = CacheSize(2, l2, "torch.cuda.get_device_properties().L2_cache_size")
    return size, CudaFlush(max(MIN_FLUSH_BYTES, FLUSH_MULTIPLE * l2))
