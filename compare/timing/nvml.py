"""GPU telemetry around timed blocks, read through NVML: clocks, power, temperature, throttle reasons and energy.

NVML is called through NVIDIA's own binding, ``pynvml`` (the ``nvidia-ml-py`` package: pure Python, it loads
``libnvidia-ml.so.1`` only when NVML is initialised, so this module imports on any machine). Three layers:

- :func:`open_device`: a GPU through pynvml, each failing call an :class:`NvmlError` naming the function and NVML's
  code; "no GPU here" (no driver, NVML failing to initialise, no such device) is :class:`Unavailable`, never raised;
- :class:`NvmlDevice`, the per-device reads the watch makes, so that a scripted device (``tests/fake_nvml.py``, used
  by the tests and by ``scripts/gpu_timing_check.py --fake``) stands in for a GPU;
- :class:`NvmlWatch`, which the shared timer calls around every timed block: a background thread samples the device
  every ``period_s`` (each sample stamped with ``time.perf_counter()``, the timer's clock), and each sample is
  attributed to the entrant (backend) whose block contains it. The timed thread itself reads nothing from the
  device: ``block`` only notes the block's bounds, so the telemetry costs the timing a wake-up of the sampling
  thread now and then, not a driver call per block.

What one entrant's :class:`Telemetry` says, and what it cannot see:

- ``sm_clock_mhz`` / ``mem_clock_mhz``: the *current* clocks at the moment of each read
  (``nvmlDeviceGetClockInfo``), not an average over the period; a dip between two samples is not seen;
- ``power_w``: ``nvmlDeviceGetPowerUsage``; on Ampere (except GA100) and later GPUs (Hopper included) NVML returns
  the power averaged over the last second, so a block shorter than a second reads a blend of it and what ran before;
- ``temperature_c``: the GPU core sensor;
- ``throttle_reasons``: the slowdown bits of ``nvmlDeviceGetCurrentClocksEventReasons`` (``...ThrottleReasons`` on
  a driver older than that name) seen in any of the entrant's samples (power cap, hardware slowdown, thermal, power
  brake): ``throttled`` is true when there is one. The bits that are not slowdowns (GPU idle, application clocks
  setting, sync boost, display clock setting) are listed apart as ``clock_notes``;
- ``energy_per_call_j``: from the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver
  loaded, Volta and later), read by the sampling thread with each sample; an entrant's energy is the sum over its
  blocks of the counter's increase between the block's start and end, each interpolated linearly between the two
  samples that bracket it, divided by the entrant's calls. The driver updates the counter at its own rate, which
  may be slower than the sampling, so a window only a few updates long is unreliable: ``energy_reliable`` is false
  when the entrant's blocks add up to under 10 sampling periods or the counter took fewer than 2 distinct values
  over them.

A sample falls in a block only if its timestamp lies in the block's [start, end]: a block shorter than
``period_s`` may get none (its clocks and power are then None, its energy is still interpolated, and unreliable).
All entrants share one GPU: the device-wide power and energy of a block are the block's only while nothing else
runs on the GPU.
"""

from __future__ import annotations

import bisect
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import pynvml

from compare.formats.codec import to_json

#: The library pynvml loads on Linux (installed by every NVIDIA driver), named in the "no driver" reason.
NVML_LIBRARY = "libnvidia-ml.so.1"

#: The clock event reasons that slow the clocks down against what the workload asks for: any of them makes an
#: entrant ``throttled``. The others (:data:`CLOCK_NOTES`: idle, application clocks, sync boost, display clock) are
#: notes.
SLOWDOWNS: frozenset[str] = frozenset(
    {"SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}
)
CLOCK_NOTES: tuple[str, ...] = ("GpuIdle", "ApplicationsClocksSetting", "SyncBoost", "DisplayClockSetting")
#: The clock event (throttle) reason bits, named as in the results (pynvml's ``nvmlClocksEventReason<name>``).
THROTTLE_BITS: dict[int, str] = {getattr(pynvml, f"nvmlClocksEventReason{n}"): n for n in (*CLOCK_NOTES, *SLOWDOWNS)}

#: Energy is unreliable when an entrant's blocks add up to fewer sampling periods than this.
MIN_ENERGY_PERIODS = 10
SOURCE_NVML, SOURCE_FAKE = "nvml", "fake-nvml"


def reason_names(mask: int) -> list[str]:
    """The names of the reason bits set in ``mask``, in bit order; an unnamed bit as ``Unknown0x...``."""
    bits = [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
    return [THROTTLE_BITS.get(bit, f"Unknown{bit:#x}") for bit in bits]


class NvmlError(RuntimeError):
    """An NVML call failed: ``function`` is the pynvml function, ``code`` NVML's ``nvmlReturn_t``. pynvml's own
    error carries the code only; the name says which of the watch's reads failed."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function} failed with NVML error {code} ({message})")
        self.function, self.code = function, code


def _call(function: str, *args: Any) -> Any:
    """``pynvml.<function>(*args)``, its ``NVMLError`` raised as an :class:`NvmlError` (a function the driver's
    library lacks fails with ``NVML_ERROR_FUNCTION_NOT_FOUND``)."""
    try:
        return getattr(pynvml, function)(*args)
    except pynvml.NVMLError as exc:
        raise NvmlError(function, exc.value, str(exc)) from exc


# --- the device protocol and its two implementations ---------------------------------------------------------


class NvmlDevice(Protocol):
    """The per-device reads the watch makes, each raising :class:`NvmlError` when the device refuses it: the product
    name ("NVIDIA H200"), clocks (MHz), power (mW), temperature (degrees C), throttle reasons (a bitmask of
    :data:`THROTTLE_BITS`) and the total-energy counter (mJ since the driver loaded; None when the device has none,
    ``energy_absent_reason`` says why). ``close`` releases the device (``nvmlShutdown`` for a real one), idempotent.
    ``source`` says what answers: ``"nvml"`` (a GPU through the driver) or ``"fake-nvml"`` (a script)."""

    source: str

    def name(self) -> str: ...

    def sm_clock_mhz(self) -> int: ...

    def mem_clock_mhz(self) -> int: ...

    def power_mw(self) -> int: ...

    def temperature_c(self) -> int: ...

    def throttle_reasons(self) -> int: ...

    def energy_mj(self) -> int | None: ...

    def energy_absent_reason(self) -> str | None: ...

    def close(self) -> None: ...


#: The clock event reasons under their current name, then under the name older drivers have.
THROTTLE_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
ENERGY_FUNCTION = "nvmlDeviceGetTotalEnergyConsumption"


class LibraryDevice:
    """One GPU through NVML (made by :func:`open_device`). The name is read once, when it is opened."""

    source = SOURCE_NVML

    def __init__(self, handle: Any, index: int, name: str, energy_reason: str | None) -> None:
        self._handle, self.index = handle, index
        self._name, self._energy_reason = name, energy_reason
        self._throttle_fn = THROTTLE_FUNCTIONS[0]
        self._closed = False
        self._close_lock = threading.Lock()

    def _read(self, function: str, *args: Any) -> int:
        return int(_call(function, self._handle, *args))

    def name(self) -> str:
        return self._name

    def sm_clock_mhz(self) -> int:
        return self._read("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM)

    def mem_clock_mhz(self) -> int:
        return self._read("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM)

    def power_mw(self) -> int:
        return self._read("nvmlDeviceGetPowerUsage")

    def temperature_c(self) -> int:
        return self._read("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)

    def throttle_reasons(self) -> int:
        """Through the current name; on a driver without it, through the older one from then on."""
        try:
            return self._read(self._throttle_fn)
        except NvmlError as exc:
            if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND or self._throttle_fn == THROTTLE_FUNCTIONS[1]:
                raise
        self._throttle_fn = THROTTLE_FUNCTIONS[1]
        return self._read(self._throttle_fn)

    def energy_mj(self) -> int | None:
        return None if self._energy_reason is not None else self._read(ENERGY_FUNCTION)

    def energy_absent_reason(self) -> str | None:
        return self._energy_reason

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        _call("nvmlShutdown")


@dataclass(frozen=True)
class Unavailable:
    """No NVML device to watch, and why (a sentence the results can carry as it is)."""

    reason: str


def _energy_probe(handle: Any) -> str | None:
    """None when the device's energy counter reads; otherwise why it does not (unsupported before Volta)."""
    try:
        _call(ENERGY_FUNCTION, handle)
    except NvmlError as exc:  # the counter's absence is recorded, never raised
        if exc.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return f"this driver's NVML has no {ENERGY_FUNCTION}"
        if exc.code == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return f"the device has no total-energy counter ({exc}; it needs Volta or later)"
        return f"the energy counter does not read: {exc}"
    return None


def open_device(index: int = 0) -> LibraryDevice | Unavailable:
    """GPU ``index`` through NVML, initialised (call ``close()`` when done), or :class:`Unavailable` with the
    reason: no library (no driver), NVML failing to initialise, no such device, or its name not reading. Never
    raises for any of these."""
    if index < 0:
        raise ValueError(f"a GPU index is 0 or more, got {index}")
    try:
        _call("nvmlInit")
    except NvmlError as exc:
        if exc.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return Unavailable(f"{NVML_LIBRARY} not found: no NVIDIA driver on this machine ({exc})")
        return Unavailable(f"NVML did not initialise: {exc}")
    try:
        handle = _call("nvmlDeviceGetHandleByIndex", index)
        name = str(_call("nvmlDeviceGetName", handle))
    except NvmlError as exc:
        reason = f"NVML device {index} cannot be opened: {exc}"
        try:
            _call("nvmlShutdown")
        except NvmlError as shut:  # both failures go into the reason
            reason += f"; and then {shut}"
        return Unavailable(reason)
    return LibraryDevice(handle, index, name, _energy_probe(handle))


def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvmlSystemGetDriverVersion``), None where NVML does not load or answer (no
    driver: a machine without an NVIDIA GPU). Never raises for that."""
    try:
        _call("nvmlInit")
    except NvmlError:
        return None
    try:
        return str(_call("nvmlSystemGetDriverVersion")) or None
    except NvmlError:
        return None
    finally:
        with contextlib.suppress(NvmlError):  # the version is read; a failing shutdown changes nothing of it
            _call("nvmlShutdown")


# --- the per-entrant record ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The minimum, median and maximum of one quantity over an entrant's samples (in the field's unit)."""

    min: float
    median: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread | None:
        """The spread of ``values``; None when there are none."""
        if not values:
            return None
        return Spread(min=min(values), median=statistics.median(values), max=max(values))


@dataclass(frozen=True)
class Telemetry:
    """What the GPU did during one entrant's timed blocks (module docstring for how each field is obtained).

    ``samples``: the samples whose timestamp fell in one of its ``blocks`` (``calls`` calls, ``blocked_s`` seconds
    in all); clocks in MHz, power in W, temperature in degrees C, each a :class:`Spread` or None when no sample fell
    in a block; ``energy_per_call_j`` in J, None when there is no counter (``energy_note`` says why);
    ``read_errors``: each read that failed during the watch, once per quantity, with NVML's error."""

    device: str
    source: str
    samples: int
    period_s: float = 0.0
    blocks: int = 0
    calls: int = 0
    blocked_s: float = 0.0
    sm_clock_mhz: Spread | None = None
    mem_clock_mhz: Spread | None = None
    power_w: Spread | None = None
    temperature_c: Spread | None = None
    throttle_reasons: tuple[str, ...] = ()
    clock_notes: tuple[str, ...] = ()
    energy_per_call_j: float | None = None
    energy_reliable: bool = False
    energy_note: str = ""
    read_errors: tuple[str, ...] = ()
    #: written after the fields (``compare.formats.codec``)
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("throttled",)

    @property
    def throttled(self) -> bool:
        """True when a slowdown reason (:data:`SLOWDOWNS`) was seen in one of the entrant's samples."""
        return any(r in SLOWDOWNS for r in self.throttle_reasons)


# --- the watch -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sample:
    """One read of the device: ``t_s`` is the midpoint of the energy read (``clock()``), None for a failed read."""

    t_s: float
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    power_mw: int | None
    temperature_c: int | None
    throttle_reasons: int | None
    energy_mj: int | None


@dataclass(frozen=True)
class _Block:
    entrant: int
    start_s: float
    end_s: float
    calls: int


THREAD_NAME = "nvml-watch"


class NvmlWatch:
    """Telemetry per entrant over the shared timer's blocks (module docstring), through an :class:`NvmlDevice`.

    The timer calls ``start(entrants)`` before the first timed block, ``block(entrant, start_s, end_s, calls)``
    after each (``time.perf_counter()`` values) and ``stop()`` after the last, in a ``finally``: ``stop`` always
    ends the sampling thread (a daemon, joined for at most ``join_timeout_s``) and returns one :class:`Telemetry`
    dict per entrant (None for one without a block). The thread's first sample is taken before ``start`` returns
    and its last one after ``stop`` is called (outside the timed blocks), so every block is bracketed by energy
    reads; the timed thread itself never waits on the device beyond ``join_timeout_s``. At most ``max_samples``
    samples are kept (the sampler then stops, and the records say so). The device is the caller's: the watch does
    not close it.
    """

    def __init__(
        self,
        device: NvmlDevice,
        *,
        period_s: float = 0.01,
        join_timeout_s: float = 2.0,
        max_samples: int = 200_000,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, got {max_samples}")
        self._device, self._period_s, self._join_timeout_s = device, period_s, join_timeout_s
        self._max_samples, self._clock = max_samples, clock
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._entrants = 0
        self._samples: list[_Sample] = []
        self._blocks: list[_Block] = []
        self._errors: dict[str, str] = {}
        self._notes: list[str] = []
        self._name = ""
        self._energy_reason: str | None = None

    def _failed(self, quantity: str, exc: Exception) -> None:
        with self._lock:
            self._errors.setdefault(quantity, f"{quantity}: {exc}")

    def _read_int(self, quantity: str, read: Callable[[], int | None]) -> int | None:
        try:
            return read()
        except NvmlError as exc:  # a refused read is recorded per quantity; the others go on
            self._failed(quantity, exc)
            return None

    def _read(self) -> _Sample:
        """One sample: the energy counter first (its read's midpoint stamps the sample), then the rest."""
        d = self._device
        t0 = self._clock()
        energy = None if self._energy_reason is not None else self._read_int("energy_mj", d.energy_mj)
        t1 = self._clock()
        return _Sample(
            t_s=0.5 * (t0 + t1),
            sm_clock_mhz=self._read_int("sm_clock_mhz", d.sm_clock_mhz),
            mem_clock_mhz=self._read_int("mem_clock_mhz", d.mem_clock_mhz),
            power_mw=self._read_int("power_mw", d.power_mw),
            temperature_c=self._read_int("temperature_c", d.temperature_c),
            throttle_reasons=self._read_int("throttle_reasons", d.throttle_reasons),
            energy_mj=energy,
        )

    def _keep(self, samples: list[_Sample], s: _Sample, *, last: bool = False) -> bool:
        """Store a sample in this run's list; False once the cap is reached (one place is left for the ``last``)."""
        with self._lock:
            if not last and len(samples) >= self._max_samples - 1:
                self._notes.append(f"sampling stopped at its cap of {self._max_samples} samples")
                return False
            samples.append(s)
            return True

    def _run(self, stop: threading.Event, ready: threading.Event, samples: list[_Sample]) -> None:
        """The sampling thread of one run (its own events and list, so that a thread stuck past its ``stop`` never
        writes into a later run): a first sample (then ``ready``), a sample every period on a fixed schedule, and a
        last one once ``stop`` is set. The first and the last bracket every block: ``start`` waits for the first,
        ``stop`` is called after the last block."""
        try:
            try:
                self._keep(samples, self._read())
            finally:
                ready.set()
            due = self._clock()
            sampling = True
            while True:
                due += self._period_s
                if stop.wait(max(0.0, due - self._clock()) if sampling else None):
                    self._keep(samples, self._read(), last=True)
                    return
                sampling = self._keep(samples, self._read())
        except Exception as exc:  # a failure of the sampler ends it and is recorded in every entrant's record
            with self._lock:
                self._notes.append(f"sampling stopped early: {type(exc).__name__}: {exc}")

    def start(self, entrants: int) -> None:
        """Begin watching ``entrants`` entrants (numbered from 0): the sampling thread starts, and ``start`` returns
        once it has taken its first sample (or after ``join_timeout_s``, noted in the records)."""
        if self._thread is not None:
            raise RuntimeError("the watch is already running: stop() it before starting it again")
        if entrants < 1:
            raise ValueError(f"a watch needs at least one entrant, got {entrants}")
        self._entrants = entrants
        self._samples, self._blocks, self._errors, self._notes = [], [], {}, []
        self._stop_event = threading.Event()
        try:
            self._name = self._device.name()
        except NvmlError as exc:  # the record names the device as unknown, with the error
            self._name = "unknown device"
            self._failed("name", exc)
        self._energy_reason = self._device.energy_absent_reason()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop_event, ready, self._samples), name=THREAD_NAME, daemon=True
        )
        self._thread.start()
        if not ready.wait(self._join_timeout_s):
            with self._lock:
                self._notes.append(f"the first sample took longer than {self._join_timeout_s} s")

    def block(self, entrant: int, start_s: float, end_s: float, calls: int) -> None:
        """Note one timed block of ``entrant``: ``calls`` calls from ``start_s`` to ``end_s`` (clock seconds).
        Reads nothing from the device."""
        if self._thread is None:
            raise RuntimeError("block() before start()")
        if not 0 <= entrant < self._entrants:
            raise ValueError(f"entrant {entrant} is not one of the {self._entrants} started")
        if not end_s >= start_s:
            raise ValueError(f"a block ends after it starts, got start {start_s} and end {end_s}")
        if calls < 1:
            raise ValueError(f"a block holds at least one call, got {calls}")
        self._blocks.append(_Block(entrant, start_s, end_s, calls))

    def stop(self) -> list[dict[str, Any] | None]:
        """End the sampling thread (always, whatever happened) and return one :class:`Telemetry` dict per entrant,
        None for an entrant without a block. Not running (never started, or stopped already): ``[]``, so that a
        caller's ``finally`` never masks the error that kept the timer from starting the watch."""
        thread, self._thread = self._thread, None
        if thread is None:
            return []
        self._stop_event.set()
        thread.join(timeout=self._join_timeout_s)
        if thread.is_alive():  # stuck in a driver call: it is a daemon, and its later samples are not used
            with self._lock:
                self._notes.append(f"the sampling thread did not stop within {self._join_timeout_s} s")
        with self._lock:
            samples = list(self._samples)
            problems = tuple(sorted(self._errors.values())) + tuple(self._notes)
        return [self._record(i, samples, problems) for i in range(self._entrants)]

    def _record(self, entrant: int, samples: list[_Sample], problems: tuple[str, ...]) -> dict[str, Any] | None:
        blocks = [b for b in self._blocks if b.entrant == entrant]
        if not blocks:
            return None
        times = [s.t_s for s in samples]
        inside: set[int] = set()
        for b in blocks:
            inside.update(range(bisect.bisect_left(times, b.start_s), bisect.bisect_right(times, b.end_s)))
        mine = [samples[i] for i in sorted(inside)]
        mask = 0
        for s in mine:
            mask |= s.throttle_reasons or 0
        names = reason_names(mask)
        calls = sum(b.calls for b in blocks)
        blocked_s = sum(b.end_s - b.start_s for b in blocks)
        energy, reliable, note = self._energy(blocks, samples, calls, blocked_s)
        return to_json(
            Telemetry(
                device=self._name,
                source=self._device.source,
                samples=len(mine),
                period_s=self._period_s,
                blocks=len(blocks),
                calls=calls,
                blocked_s=blocked_s,
                sm_clock_mhz=Spread.of([s.sm_clock_mhz for s in mine if s.sm_clock_mhz is not None]),
                mem_clock_mhz=Spread.of([s.mem_clock_mhz for s in mine if s.mem_clock_mhz is not None]),
                power_w=Spread.of([s.power_mw / 1000.0 for s in mine if s.power_mw is not None]),
                temperature_c=Spread.of([s.temperature_c for s in mine if s.temperature_c is not None]),
                throttle_reasons=tuple(sorted(n for n in names if n in SLOWDOWNS)),
                clock_notes=tuple(sorted(n for n in names if n not in SLOWDOWNS)),
                energy_per_call_j=energy,
                energy_reliable=reliable,
                energy_note=note,
                read_errors=problems,
            )
        )

    def _energy(
        self, blocks: list[_Block], samples: list[_Sample], calls: int, blocked_s: float
    ) -> tuple[float | None, bool, str]:
        """(J per call, reliable, how it was obtained) of an entrant's blocks, from the counter's samples."""
        if self._energy_reason is not None:
            return None, False, f"not measured: {self._energy_reason}"
        points = [(s.t_s, s.energy_mj) for s in samples if s.energy_mj is not None]
        times = [t for t, _ in points]
        total_mj = 0.0
        seen: set[int] = set()
        for b in blocks:
            lo = bisect.bisect_right(times, b.start_s) - 1  # the last read at or before the start
            hi = bisect.bisect_left(times, b.end_s)  # the first read at or after the end
            if lo < 0 or hi >= len(points):
                return None, False, "not measured: a block was not bracketed by two reads of the energy counter"
            seen.update(e for _, e in points[lo : hi + 1])
            total_mj += _interpolate(points, lo, b.end_s, hi) - _interpolate(points, lo, b.start_s, hi)
        if total_mj < 0:
            return None, False, "not measured: the energy counter went backwards (the driver reloaded?)"
        how = (
            f"NVML's total-energy counter (mJ), read with each sample every {self._period_s} s; per block, its "
            "increase between the block's start and end, each interpolated linearly between the reads that bracket "
            f"it; summed over the entrant's {len(blocks)} blocks and divided by its {calls} calls. The driver "
            "updates the counter at its own rate: a window only a few updates long is unreliable"
        )
        short = blocked_s < MIN_ENERGY_PERIODS * self._period_s
        if short or len(seen) < 2:
            why = (
                f"the blocks add up to {blocked_s:.4g} s, under {MIN_ENERGY_PERIODS} sampling periods"
                if short
                else f"the counter took {len(seen)} distinct value over the blocks"
            )
            return total_mj / 1000.0 / calls, False, f"{how}; unreliable here: {why}"
        return total_mj / 1000.0 / calls, True, how


def _interpolate(points: list[tuple[float, int]], lo: int, t_s: float, hi: int) -> float:
    """The counter at ``t_s``, linear between the two reads around it among ``points[lo..hi]`` (times sorted)."""
    times = [t for t, _ in points[lo : hi + 1]]
    j = lo + bisect.bisect_left(times, t_s)
    if j <= lo:
        return float(points[lo][1])
    (t0, e0), (t1, e1) = points[j - 1], points[min(j, hi)]
    if t1 <= t0:
        return float(e1)
    return e0 + (e1 - e0) * (min(t_s, t1) - t0) / (t1 - t0)
