"""Fakes of NVML for ``tests/test_gpu_timing.py``, at its two levels.

- :class:`FakeNvml`: a device (``compare.timing.nvml.NvmlDevice``) that follows a script over ``time.perf_counter``
  (:class:`ScriptedDevice`, shared with ``scripts/gpu_timing_check.py --fake``), and besides counts
  its reads, refuses the quantities it is told to with an NVML error, raises a plain error on one chosen read, and
  can hold its reads until an event is set (a driver call that hangs, for up to 5 s).
- :class:`FakePynvml`: NVML as ``open_device`` and ``driver_version`` see it, through ``pynvml``: its functions,
  replaced on the module for one test (``install``); any function can be made to raise an NVML error or be absent
  from the driver's library, and every call is logged.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from compare.timing.nvml import SOURCE_FAKE, NvmlError


@dataclass(frozen=True)
class Phase:
    """What a :class:`ScriptedDevice` reports from ``after_s`` seconds past its origin on, until the next phase.
    ``throttle_reasons`` is a bitmask of ``compare.timing.nvml.THROTTLE_BITS``; ``power_w`` also drives the energy
    counter."""

    after_s: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    power_w: float
    temperature_c: int
    throttle_reasons: int = 0


class ScriptedDevice:
    """A device that reads its values from a script of :class:`Phase` over ``clock()`` (``time.perf_counter`` by
    default, the watch's clock): the phase in force is the last one whose ``origin_s + after_s`` has passed (the
    first one before that). Its energy counter is ``energy_start_mj`` plus the integral of the phases' power since
    ``origin_s``, held between updates every ``energy_update_s`` (0: continuous), as a driver's counter is; with
    ``energy=False`` it has none. Stateless between reads, so any thread may read it."""

    source = SOURCE_FAKE

    def __init__(
        self,
        phases: Sequence[Phase],
        *,
        name: str = "Scripted GPU",
        origin_s: float | None = None,
        energy: bool = True,
        energy_update_s: float = 0.0,
        energy_start_mj: int = 71_993,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not phases:
            raise ValueError("a scripted device needs at least one phase")
        if energy_update_s < 0:
            raise ValueError(f"energy_update_s must be 0 or more, got {energy_update_s}")
        self.phases = tuple(sorted(phases, key=lambda p: p.after_s))
        self._name, self._clock = name, clock
        self.origin_s = clock() if origin_s is None else origin_s
        self._energy, self._update_s, self._start_mj = energy, energy_update_s, energy_start_mj

    def phase(self, t_s: float) -> Phase:
        """The phase in force at clock time ``t_s``."""
        out = self.phases[0]
        for p in self.phases[1:]:
            if t_s >= self.origin_s + p.after_s:
                out = p
        return out

    def _now(self) -> Phase:
        return self.phase(self._clock())

    def energy_at(self, t_s: float) -> int:
        """The counter's value (mJ) at clock time ``t_s``: the power integrated from the origin to the last update."""
        span = max(0.0, t_s - self.origin_s)
        if self._update_s > 0:
            span = math.floor(span / self._update_s + 1e-9) * self._update_s  # 1e-9: 0.6 / 0.3 is 1.999...
        joules, edges = 0.0, [max(0.0, p.after_s) for p in self.phases[1:]]
        start = 0.0
        for p, end in zip(self.phases, [*edges, math.inf], strict=True):
            if span <= start:
                break
            joules += p.power_w * (min(span, end) - start)
            start = max(start, end)
        return self._start_mj + int(joules * 1000.0)

    def name(self) -> str:
        return self._name

    def sm_clock_mhz(self) -> int:
        return self._now().sm_clock_mhz

    def mem_clock_mhz(self) -> int:
        return self._now().mem_clock_mhz

    def power_mw(self) -> int:
        return round(self._now().power_w * 1000.0)

    def temperature_c(self) -> int:
        return self._now().temperature_c

    def throttle_reasons(self) -> int:
        return self._now().throttle_reasons

    def energy_mj(self) -> int | None:
        return self.energy_at(self._clock()) if self._energy else None

    def energy_absent_reason(self) -> str | None:
        return None if self._energy else "the scripted device has no energy counter"

    def close(self) -> None:
        return None


class FakeNvml(ScriptedDevice):
    """A scripted device with faults. ``failing``: quantity (a read's method name) -> the NVML error code its
    reads fail with; ``explode_on``: (method name, n): the n-th call of it raises ``RuntimeError`` (not an NVML
    error: a bug in a reader); ``hold``: while not set, every read after the first ``hold_after`` waits for it."""

    def __init__(
        self,
        phases: Sequence[Phase],
        *,
        failing: Mapping[str, int] | None = None,
        explode_on: tuple[str, int] | None = None,
        hold: threading.Event | None = None,
        hold_after: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(phases, **kwargs)
        self.failing = dict(failing or {})
        self.explode_on, self.hold, self.hold_after = explode_on, hold, hold_after
        self.calls: Counter[str] = Counter()
        #: set once a read is held (the watch's thread is then inside a "driver call")
        self.holding = threading.Event()
        self._lock = threading.Lock()

    def _enter(self, quantity: str) -> None:
        with self._lock:
            self.calls[quantity] += 1
            n = self.calls[quantity]
        if self.hold is not None and n > self.hold_after:
            self.holding.set()
            self.hold.wait(timeout=5.0)
        if self.explode_on == (quantity, n):
            raise RuntimeError(f"planted failure in read {n} of {quantity}")
        code = self.failing.get(quantity)
        if code is not None:
            raise NvmlError(f"fake read of {quantity}", code, "planted")

    def sm_clock_mhz(self) -> int:
        self._enter("sm_clock_mhz")
        return super().sm_clock_mhz()

    def mem_clock_mhz(self) -> int:
        self._enter("mem_clock_mhz")
        return super().mem_clock_mhz()

    def power_mw(self) -> int:
        self._enter("power_mw")
        return super().power_mw()

    def temperature_c(self) -> int:
        self._enter("temperature_c")
        return super().temperature_c()

    def throttle_reasons(self) -> int:
        self._enter("throttle_reasons")
        return super().throttle_reasons()

    def energy_mj(self) -> int | None:
        self._enter("energy_mj")
        return super().energy_mj()


class FakePynvml:
    """pynvml's functions over one fake GPU (index 0, named ``name``). ``codes``: function -> the NVML error code it
    raises; ``missing``: functions the driver's library lacks (they raise ``NVML_ERROR_FUNCTION_NOT_FOUND``, as
    pynvml's do then). Values: SM and memory clocks, power (mW), temperature, throttle bitmask, energy counter (mJ)
    and the driver's version; a read through any handle but the one handed out, or of another clock or sensor, is
    ``NVML_ERROR_INVALID_ARGUMENT``. ``log``: every call's name."""

    #: the device handle it hands out (pynvml's is a ctypes pointer; the project only passes it back)
    HANDLE = object()

    def __init__(
        self,
        *,
        codes: Mapping[str, int] | None = None,
        missing: Sequence[str] = (),
        name: str = "NVIDIA Fake H200",
        sm_mhz: int = 1977,
        mem_mhz: int = 2619,
        power_mw: int = 311_713,
        temperature_c: int = 47,
        throttle: int = 0x41,
        energy_mj: int = 8_675_309,
        driver: str = "580.95.05",
    ) -> None:
        self.codes, self.missing = dict(codes or {}), set(missing)
        self.log: list[str] = []
        clocks = {pynvml.NVML_CLOCK_SM: sm_mhz, pynvml.NVML_CLOCK_MEM: mem_mhz}
        temperatures = {pynvml.NVML_TEMPERATURE_GPU: temperature_c}
        self._fns: dict[str, Callable[..., Any]] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetHandleByIndex": self._handle,
            "nvmlDeviceGetName": self._on_device(lambda: name),
            "nvmlDeviceGetClockInfo": self._on_device(lambda kind: self._pick(clocks, kind)),
            "nvmlDeviceGetPowerUsage": self._on_device(lambda: power_mw),
            "nvmlDeviceGetTemperature": self._on_device(lambda sensor: self._pick(temperatures, sensor)),
            "nvmlDeviceGetCurrentClocksEventReasons": self._on_device(lambda: throttle),
            "nvmlDeviceGetCurrentClocksThrottleReasons": self._on_device(lambda: throttle),
            "nvmlDeviceGetTotalEnergyConsumption": self._on_device(lambda: energy_mj),
            "nvmlSystemGetDriverVersion": lambda: driver,
        }

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
        """Put the fake functions on the ``pynvml`` module until the test ends; returns this fake."""
        for name in self._fns:
            monkeypatch.setattr(pynvml, name, self._logged(name))
        return self

    def _logged(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.log.append(name)
            if name in self.missing:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            code = self.codes.get(name)
            if code is not None:
                raise pynvml.NVMLError(code)
            return self._fns[name](*args)

        return call

    @staticmethod
    def _pick(values: Mapping[int, int], key: int) -> int:
        if key not in values:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return values[key]

    def _on_device(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def call(handle: Any, *args: Any) -> Any:
            if handle is not self.HANDLE:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return read(*args)

        return call

    def _handle(self, index: int) -> Any:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # one device here
        return self.HANDLE
