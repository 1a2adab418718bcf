"""The last-level cache (LLC): how large it is, and a flush that evicts it between two timed calls.

A warm-cache timing flatters exactly the memory-bound steps fusion is about: after the first call a working set
smaller than the last-level cache (``cpu-mlp``'s float32 weights are 28 MiB; an H200's L2 is 50 MB, ``blog-mlp``'s
bf16 weights 14 MB) is read from the cache, not from memory. The cold timing (``compare.timing.timer.measure_cold``)
runs a :class:`Flush` before every timed call and leaves its time out.

The size comes from the device: on CPU the largest unified or data cache the OS lists for CPU 0
(``/sys/devices/system/cpu/cpu0/cache/index*/``, else ``os.sysconf``'s ``SC_LEVEL{3,2}_CACHE_SIZE``); on a GPU
the framework's adapter reads L2 from the device properties and hands its own flush (a device buffer written by a
kernel), since a host buffer does not touch a GPU's L2. The flush writes :data:`FLUSH_MULTIPLE` times the cache:
one pass the size of the cache does not evict all of it (set-associative caches with adaptive replacement keep
some old lines), several do.

What it cannot see: a VM's cache is the host socket's and shared with its other guests (the size read here is the
socket's, so the cold figure is an upper bound on a quiet host's cold time and warm figures can be colder than
their name under a noisy neighbour); the flush evicts the CPU's caches, not a NUMA node's or a TLB's warmth
beyond what its pages displace. Standard library and numpy only.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from compare.timing import timer

#: Bytes a flush writes, as a multiple of the last-level cache.
FLUSH_MULTIPLE = 3
#: The smallest flush, whatever the cache reads (a machine that lists no cache still gets one that evicts an L2).
MIN_FLUSH_BYTES = 64 * 2**20
#: The cache modes of ``--cache``: warm only, cold only, or both (the report's timing table has a column each).
CACHE_MODES: tuple[str, ...] = ("warm", "cold", "both")
_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class CacheSize:
    """A device's last-level cache: its ``level`` (3 for an L3, 2 for a GPU's L2), ``bytes`` and where the figure
    was read (``source``)."""

    level: int
    bytes: int
    source: str


def _sysfs_size(raw: str) -> int:
    """``"491520K"`` -> bytes (sysfs writes K, M or a plain number of bytes)."""
    raw = raw.strip()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(raw[-1:].upper(), 1)
    return int(raw[:-1] if scale > 1 else raw) * scale


def cpu_last_level(sysfs: Path = _SYSFS) -> CacheSize | None:
    """The CPU's last-level cache as the OS lists it (the highest level that holds data); None where nothing is
    listed (then :func:`flush_bytes` falls back to :data:`MIN_FLUSH_BYTES`)."""
    best: CacheSize | None = None
    if sysfs.is_dir():
        for index in sorted(sysfs.glob("index*")):
            try:
                kind = (index / "type").read_text().strip()
                level = int((index / "level").read_text())
                size = _sysfs_size((index / "size").read_text())
            except (OSError, ValueError):  # an entry that cannot be read is not a cache we can size
                continue
            if kind in ("Unified", "Data") and (best is None or level > best.level):
                best = CacheSize(level, size, f"{index}/size")
    if best is not None:
        return best
    for level in (3, 2):
        name = f"SC_LEVEL{level}_CACHE_SIZE"
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):  # not defined on this platform
            continue
        if size > 0:
            return CacheSize(level, size, f"os.sysconf({name})")
    return None


def flush_bytes(cache: CacheSize | None) -> int:
    """Bytes a flush writes: :data:`FLUSH_MULTIPLE` x the cache, at least :data:`MIN_FLUSH_BYTES`."""
    return max(MIN_FLUSH_BYTES, FLUSH_MULTIPLE * (cache.bytes if cache is not None else 0))


class Flush(Protocol):
    """Evicts the device's last-level cache when called, and returns only once that is done (it syncs itself)."""

    #: bytes it writes per call, and what it is (for the report)
    bytes: int
    about: str

    def __call__(self) -> None: ...


class HostFlush:
    """A host buffer of ``nbytes`` read and written by one pass per call (``buf += 1`` on int64: each line is loaded
    and dirtied, where a plain fill may use streaming stores that bypass the cache). Its pages are touched once when
    it is mapped, so the first timed flush does not pay the page faults; :meth:`release` unmaps it between timings
    (the harness's golden data and judging never run beside it: 1.5 GB on a VM whose OS lists a 480 MB L3), and the
    next call maps it again.

    The buffer is a plain anonymous mapping, not numpy's allocator: numpy asks the kernel for huge pages on large
    arrays (``madvise``), and a kernel that then compacts memory to find them (its THP ``defrag`` setting) took
    0.67 s to hand over 96 MiB on a 2-core VM, against 0.13 s in 4 KiB pages, paid once per process that times
    cold. A flush evicts the cache the same in either page size."""

    def __init__(self, nbytes: int) -> None:
        self._n = max(8, nbytes // 8 * 8)
        self._map: mmap.mmap | None = None
        self._buf: np.ndarray | None = None
        self._mapped()
        self.bytes = self._n
        self.about = f"a {self.bytes / 2**20:.0f} MiB host buffer read and written before each call"

    def _mapped(self) -> np.ndarray:
        if self._buf is None:
            self._map = mmap.mmap(-1, self._n)
            self._buf = np.frombuffer(self._map, dtype=np.int64)
            self._buf += 1
        return self._buf

    def __call__(self) -> None:
        buf = self._mapped()
        buf += 1

    def release(self) -> None:
        """Unmap the buffer (its memory goes back to the system) until the next call."""
        self._buf = None  # the array's hold on the mapping goes first
        if self._map is not None:
            self._map.close()
            self._map = None


@dataclass(frozen=True)
class ColdSetup:
    """How cold timings were made (``results.json``'s ``cold``): the cache mode asked for, the cache that was sized
    (None: the OS lists none), the bytes and kind of the flush, and its median seconds (left out of every sample)."""

    mode: str
    cache: CacheSize | None
    flush_bytes: int
    flush_about: str
    flush_s: float


def time_flush(flush: Flush, calls: int = 3) -> float:
    """Median seconds of ``calls`` flushes (what each cold sample leaves out), by the timer's clock
    (:data:`compare.timing.timer.CLOCK`): the budget plans the cold samples from it and the timer's rounds spend it,
    so both read one clock (a test's fake one too)."""
    times = []
    for _ in range(calls):
        t0 = timer.CLOCK()
        flush()
        times.append(timer.CLOCK() - t0)
    return sorted(times)[len(times) // 2]
