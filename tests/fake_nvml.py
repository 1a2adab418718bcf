"""Fakes of NVML for ``tests/test_gpu_timing.py``, at its two levels.

- :class:`FakeNvml`: a device (``compare.timing.nvml.NvmlDevice``) that follows a script over ``time.perf_counter``
  (``compare.timing.nvml.ScriptedDevice``, shared with ``scripts/gpu_timing_check.py --fake``), and besides counts
  its reads, refuses the quantities it is told to with an NVML error, raises a plain error on one chosen read, and
  can hold its reads until an event is set (a driver call that hangs, for up to 5 s).
- :class:`FakeLibNvml`: the C library itself as ``open_device`` sees it through ``ctypes``: attributes named as NVML's
  functions, each taking ctypes pointers and writing through them, returning an ``nvmlReturn_t``; any function can
  be made to return an error code or be absent, and every call is logged.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compare.timing.nvml import NVML_CLOCK_MEM, NVML_CLOCK_SM, NvmlError, Phase, ScriptedDevice


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


class _Fn:
    """One fake C function: ctypes sets ``argtypes``/``restype`` on it as on a real one."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call
        self.argtypes: Any = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)


class FakeLibNvml:
    """The NVML C library, faked for ``open_device(load=...)``. ``codes``: function -> the code it returns instead
    of success; ``missing``: functions the library lacks. Values: a device named ``name`` at ``handle``, SM and
    memory clocks, power (mW), temperature, throttle bitmask, energy counter (mJ) and the driver's version.
    ``log``: every call's name."""

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
        self.codes = dict(codes or {})
        self.log: list[str] = []
        self._values = {NVML_CLOCK_SM: sm_mhz, NVML_CLOCK_MEM: mem_mhz}
        self._name, self._power, self._temp = name, power_mw, temperature_c
        self._throttle, self._energy, self._driver = throttle, energy_mj, driver
        fns: dict[str, Callable[..., int]] = {
            "nvmlInit_v2": lambda: 0,
            "nvmlShutdown": lambda: 0,
            "nvmlDeviceGetHandleByIndex_v2": self._handle,
            "nvmlDeviceGetName": self._name_of,
            "nvmlDeviceGetClockInfo": lambda h, kind, out: self._put(out, self._values[kind]),
            "nvmlDeviceGetPowerUsage": lambda h, out: self._put(out, self._power),
            "nvmlDeviceGetTemperature": lambda h, sensor, out: self._put(out, self._temp),
            "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h, out: self._put(out, self._throttle),
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h, out: self._put(out, self._throttle),
            "nvmlDeviceGetTotalEnergyConsumption": lambda h, out: self._put(out, self._energy),
            "nvmlSystemGetDriverVersion": self._driver_of,
        }
        self._fns = {name: _Fn(self._logged(name, fn)) for name, fn in fns.items() if name not in missing}
        self._fns["nvmlErrorString"] = _Fn(lambda code: f"planted error {code}".encode())

    def _logged(self, name: str, fn: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.log.append(name)
            code = self.codes.get(name)
            return code if code is not None else fn(*args)

        return call

    @staticmethod
    def _put(out: Any, value: int) -> int:
        out.contents.value = value
        return 0

    def _handle(self, index: int, out: Any) -> int:
        if index != 0:
            return 2  # NVML_ERROR_INVALID_ARGUMENT: one device here
        out.contents.value = 0x5EED
        return 0

    def _name_of(self, handle: Any, buf: Any, length: int) -> int:
        buf.value = self._name.encode()[: length - 1]
        return 0

    def _driver_of(self, buf: Any, length: int) -> int:
        buf.value = self._driver.encode()[: length - 1]
        return 0

    def __getattr__(self, name: str) -> _Fn:
        fns = self.__dict__.get("_fns", {})
        if name not in fns:
            raise AttributeError(name)
        fn: _Fn = fns[name]
        return fn

    def loader(self) -> Callable[[str], FakeLibNvml]:
        """A ``load`` for ``open_device`` that hands out this library, whatever name it is asked for."""
        return lambda _name: self
