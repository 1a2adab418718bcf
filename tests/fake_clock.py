"""A fake clock for the shared timer (``compare.timing.timer.CLOCK``, which every timing and every decision taken from
one reads): time passes only when a test's simulated step says it took its seconds, so what the timer measures, and
what it decides from that (block sizes, sample counts, a budget's cuts), is exact on any machine, busy or not.

Where a test needs the real clock it says why (it measures the machine: the ``quiet`` tier)."""

from __future__ import annotations

import pytest

from compare.timing import timer

#: The resolution the timer is told its clock has under a fake one: Linux's ``perf_counter`` (1 ns), so that no
#: decision reads this machine's clock either.
RESOLUTION_S = 1e-9


class FakeClock:
    """The timer's clock in a test: it reads ``now``, which moves only by :meth:`spin`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def spin(self, seconds: float) -> None:
        """A simulated call (or stall, or flush) took ``seconds``."""
        self.now += seconds


def install(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A :class:`FakeClock` as the timer's clock for the test (undone after it), its resolution :data:`RESOLUTION_S`."""
    clock = FakeClock()
    monkeypatch.setattr(timer, "CLOCK", clock)
    monkeypatch.setattr(timer, "CLOCK_RESOLUTION_S", RESOLUTION_S)
    return clock
