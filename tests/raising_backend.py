"""A test-only backend that is available but fails while preparing (stands in for an out-of-memory backend)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared


class RaisingBackend:
    name = "raising"

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, golden: object, mode: str) -> Prepared:
        raise MemoryError("simulated out of memory")


BACKEND = RaisingBackend()
