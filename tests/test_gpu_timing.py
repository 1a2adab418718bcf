"""The GPU timing modes, checked here through fakes: NVML telemetry around timed blocks (``compare.timing.nvml``) and
CUDA-graph capture of a step (``torch_impl.cuda_graphs``).

The watch is driven as the shared timer drives it (``start``, ``block`` after each timed block, ``stop`` in a
``finally``) over a scripted device whose clocks, throttle bits and power change at set times of a fake clock that
the watch's sampling thread moves in lockstep with the test (:class:`_Lockstep`): blocks are reported with their
bounds after the fact and every sample is taken when it is due, so which samples fall in which block is set by the
script, not by how long a call takes or how busy the machine is. The calls through pynvml are checked against fakes
of its functions (no NVIDIA driver here), and ``open_device`` on this machine must answer :class:`Unavailable`, not
raise. The ``gpu`` tests run the real NVML and a real capture on a CUDA machine (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from compare.formats.codec import FieldError, from_json, to_json
from compare.timing import nvml, timer
from compare.timing.nvml import (
    NVML_LIBRARY,
    THREAD_NAME,
    LibraryDevice,
    NvmlError,
    NvmlWatch,
    Spread,
    Telemetry,
    Unavailable,
    open_device,
    reason_names,
)
from tests.fake_nvml import FakeNvml, FakePynvml, Phase, ScriptedDevice
from torch_impl.cuda_graphs import NO_CUDA, Captured, NotCaptured, capture

#: Two phases: full clocks, then (from 0.093 s on) a thermal slowdown, lower clocks and power, and a sync-boost note.
COOL = Phase(after_s=0.0, sm_clock_mhz=1977, mem_clock_mhz=2619, power_w=311.7, temperature_c=47)
HOT = Phase(
    after_s=0.093, sm_clock_mhz=1417, mem_clock_mhz=2619, power_w=283.3, temperature_c=83, throttle_reasons=0x40 | 0x10
)


class _Lockstep:
    """Fake time for a watch's sampling thread, the clock of the watch and of its scripted device: the thread's waits
    between samples take no real time and move this clock by what they wait, but never past the horizon the test has
    run it to (:meth:`run_until`). So every sample falls exactly when it is due, and which samples lie in which block
    is the script's on any machine (with the real clock a busy machine delays the thread's samples: a block's
    count of samples, its energy's error and a planted fault's read all depended on it). The watch's events are
    :attr:`Event`: waited on in the sampling thread they wait on this clock; elsewhere (``start`` waiting for the
    first sample) they are real events."""

    def __init__(self) -> None:
        self.now = 0.0
        self._horizon = 0.0
        self._parked_at: float | None = None  # the horizon the sampling thread waits beyond, None while it samples
        self._cv = threading.Condition()
        lockstep = self

        class Event(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                if threading.current_thread().name != THREAD_NAME:
                    return super().wait(timeout)
                return lockstep._wait(self, timeout)

            def set(self) -> None:
                super().set()
                with lockstep._cv:
                    lockstep._cv.notify_all()

        self.Event = Event

    def __call__(self) -> float:
        return self.now

    def _wait(self, event: threading.Event, timeout: float | None) -> bool:
        """The sampling thread's wait: at once to ``now + timeout`` where the horizon allows it, else (parked) until
        the test moves the horizon or ``event`` is set; True if it was set."""
        with self._cv:
            due = math.inf if timeout is None else self.now + timeout
            while not event.is_set() and due > self._horizon:
                self._parked_at = self._horizon
                self._cv.notify_all()
                self._cv.wait()
            self._parked_at = None
            if event.is_set():
                return True
            self.now = due
            return False

    def run_until(self, t_s: float, timeout_s: float = 30.0) -> None:
        """Let the sampling thread take every sample due by ``t_s``; return once it waits beyond it (or has ended)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._horizon = t_s
            self._cv.notify_all()
            while self._parked_at != t_s and _watch_threads():
                assert time.monotonic() < deadline, f"the sampling thread did not reach {t_s} s of fake time"
                self._cv.wait(0.01)


@pytest.fixture
def lockstep(monkeypatch: pytest.MonkeyPatch) -> _Lockstep:
    """A :class:`_Lockstep` clock, its events the ones the watch makes (``compare.timing.nvml``'s ``threading``)."""
    clock = _Lockstep()
    monkeypatch.setattr(
        nvml, "threading", SimpleNamespace(Event=clock.Event, Thread=threading.Thread, Lock=threading.Lock)
    )
    return clock


def _started(device: FakeNvml, entrants: int, clock: _Lockstep, **settings: Any) -> tuple[NvmlWatch, float]:
    """A watch over ``device`` (made with ``clock=clock``) on the lockstep ``clock``, started (its first sample is
    taken at the script's origin ``t0``): the blocks a test reports at ``t0 + x`` lie after that first sample, as
    the timer's blocks do, and ``clock.run_until(t0 + x)`` takes the samples due until then."""
    watch = NvmlWatch(device, clock=clock, **settings)
    watch.start(entrants)
    return watch, device.origin_s


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


# --- the watch over a scripted device -------------------------------------------------------------------------


@pytest.mark.standard
def test_samples_are_attributed_to_the_entrant_whose_block_holds_them_and_the_slowdown_is_named(
    lockstep: _Lockstep,
) -> None:
    """Entrant 0's block lies in the cool phase, entrant 1's in the hot one: each sees only its own phase's clocks,
    power and reasons (a negative control in one: no bit, not throttled); entrant 2 has no block (None). Energy
    per call is the scripted power x block time / calls within 2% (a continuous counter: the linear interpolation
    between samples is exact up to the counter's 1 mJ step and a read's few microseconds)."""
    watch, t0 = _started(FakeNvml([COOL, HOT], clock=lockstep), 3, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t0 + 0.185)
        watch.block(0, t0 + 0.011, t0 + 0.081, calls=7)
        watch.block(1, t0 + 0.103, t0 + 0.173, calls=9)
    finally:
        records = watch.stop()
    cool, hot, none = records
    assert none is None
    assert cool is not None and hot is not None
    # 70 ms blocks sampled every 2 ms, on the lockstep clock: 35 samples each, exactly
    assert cool["samples"] == hot["samples"] == 35, (cool["samples"], hot["samples"])
    assert cool["sm_clock_mhz"] == {"min": 1977, "median": 1977, "max": 1977}
    assert hot["sm_clock_mhz"] == {"min": 1417, "median": 1417, "max": 1417}
    assert cool["power_w"]["median"] == pytest.approx(311.7) and hot["temperature_c"]["max"] == 83
    assert (cool["throttled"], cool["throttle_reasons"], cool["clock_notes"]) == (False, [], [])
    assert (hot["throttled"], hot["throttle_reasons"], hot["clock_notes"]) == (
        True,
        ["HwThermalSlowdown"],
        ["SyncBoost"],
    )
    assert cool["energy_per_call_j"] == pytest.approx(311.7 * 0.070 / 7, rel=0.02)
    assert hot["energy_per_call_j"] == pytest.approx(283.3 * 0.070 / 9, rel=0.02)
    assert cool["energy_reliable"] and hot["energy_reliable"], cool["energy_note"]
    assert "interpolated linearly" in cool["energy_note"] and cool["source"] == "fake-nvml"
    assert (cool["blocks"], cool["calls"], cool["device"]) == (1, 7, "Scripted GPU")
    assert _watch_threads() == []


@pytest.mark.standard
def test_idle_and_application_clock_bits_are_notes_not_throttling(lockstep: _Lockstep) -> None:
    """Negative control: a device that reports only GpuIdle and ApplicationsClocksSetting all along is not
    throttled; the bits are listed as clock notes."""
    calm = Phase(0.0, 1593, 2619, 97.3, 41, throttle_reasons=0x1 | 0x2)
    watch, t0 = _started(FakeNvml([calm], clock=lockstep), 1, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t0 + 0.047)
        watch.block(0, t0 + 0.003, t0 + 0.043, calls=3)
    finally:
        (rec,) = watch.stop()
    assert rec is not None
    assert (rec["throttled"], rec["throttle_reasons"]) == (False, [])
    assert rec["clock_notes"] == ["ApplicationsClocksSetting", "GpuIdle"]


@pytest.mark.standard
def test_energy_is_unreliable_for_a_window_under_ten_periods_and_for_a_counter_that_never_moves(
    lockstep: _Lockstep,
) -> None:
    """Three entrants: a block of 5 periods (unreliable, said why), one of 25 (reliable: the control), and on a
    second device whose counter updates every 97 s (so never, here) a long block: one distinct value, unreliable,
    and 0 J per call."""
    watch, t0 = _started(FakeNvml([COOL], clock=lockstep), 2, lockstep, period_s=0.004)
    try:
        lockstep.run_until(t0 + 0.137)
        watch.block(0, t0 + 0.007, t0 + 0.027, calls=3)
        watch.block(1, t0 + 0.031, t0 + 0.131, calls=11)
    finally:
        short, long_ = watch.stop()
    assert short is not None and long_ is not None
    assert not short["energy_reliable"] and "under 10 sampling periods" in short["energy_note"], short["energy_note"]
    assert long_["energy_reliable"], long_["energy_note"]
    assert short["energy_per_call_j"] == pytest.approx(311.7 * 0.020 / 3, rel=0.05)

    frozen, t1 = _started(FakeNvml([COOL], energy_update_s=97.0, clock=lockstep), 1, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t1 + 0.053)
        frozen.block(0, t1 + 0.003, t1 + 0.049, calls=5)
    finally:
        (still,) = frozen.stop()
    assert still is not None
    assert not still["energy_reliable"] and "1 distinct value" in still["energy_note"], still["energy_note"]
    assert still["energy_per_call_j"] == 0.0


@pytest.mark.standard
def test_a_counter_held_between_updates_is_off_by_at_most_its_update_and_sampling_periods(lockstep: _Lockstep) -> None:
    """The counter's resolution caveat, measured: with updates every 7 ms and samples every 3 ms, each end of a
    block reads a value stale by at most update + sampling period, so the error of a block's energy is bounded by
    the power times that."""
    update, period, span = 0.007, 0.003, 0.131
    watch, t0 = _started(FakeNvml([COOL], energy_update_s=update, clock=lockstep), 1, lockstep, period_s=period)
    try:
        lockstep.run_until(t0 + 0.145)
        watch.block(0, t0 + 0.009, t0 + 0.009 + span, calls=13)
    finally:
        (rec,) = watch.stop()
    assert rec is not None
    joules = rec["energy_per_call_j"] * 13
    assert abs(joules - 311.7 * span) <= 311.7 * (update + period) + 1e-3, joules


@pytest.mark.standard
def test_no_energy_counter_leaves_energy_absent_with_the_reason(lockstep: _Lockstep) -> None:
    watch, t0 = _started(FakeNvml([COOL], energy=False, clock=lockstep), 1, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t0 + 0.031)
        watch.block(0, t0 + 0.003, t0 + 0.029, calls=3)
    finally:
        (rec,) = watch.stop()
    assert rec is not None
    assert (rec["energy_per_call_j"], rec["energy_reliable"]) == (None, False)
    assert rec["energy_note"] == "not measured: the scripted device has no energy counter"


@pytest.mark.standard
def test_a_refused_read_is_recorded_and_the_other_quantities_go_on(lockstep: _Lockstep) -> None:
    device = FakeNvml([COOL], failing={"temperature_c": 15}, clock=lockstep)
    watch, t0 = _started(device, 1, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t0 + 0.031)
        watch.block(0, t0 + 0.003, t0 + 0.029, calls=3)
    finally:
        (rec,) = watch.stop()
    assert rec is not None
    assert rec["temperature_c"] is None and rec["sm_clock_mhz"]["median"] == 1977
    (error,) = rec["read_errors"]
    assert error.startswith("temperature_c: fake read of temperature_c failed with NVML error 15"), error
    assert device.calls["temperature_c"] >= 3


@pytest.mark.standard
def test_the_thread_stops_in_stop_also_when_block_raised_or_the_sampler_failed(lockstep: _Lockstep) -> None:
    """After ``stop()`` no sampling thread is alive: after a refused ``block`` (the timer's ``finally``), and after
    a reader's plain exception in the thread (it ends the sampling, and the records say so)."""
    watch = NvmlWatch(FakeNvml([COOL]), period_s=0.002)
    watch.start(2)
    with pytest.raises(ValueError, match="entrant 5 is not one of the 2"):
        try:
            watch.block(5, 0.0, 1.0, calls=3)
        finally:
            watch.stop()
    assert _watch_threads() == []

    broken, t0 = _started(FakeNvml([COOL], explode_on=("power_mw", 3), clock=lockstep), 1, lockstep, period_s=0.002)
    try:
        lockstep.run_until(t0 + 0.023)
        broken.block(0, t0, t0 + 0.021, calls=3)
    finally:
        (rec,) = broken.stop()
    assert _watch_threads() == []
    assert rec is not None
    assert "sampling stopped early: RuntimeError: planted failure in read 3 of power_mw" in rec["read_errors"]


@pytest.mark.standard
def test_stop_is_bounded_when_a_read_hangs() -> None:
    """A driver call that never returns: ``stop`` gives up on the thread after its join timeout and says so; the
    thread is a daemon and ends once the read returns (here: the test releases it)."""
    release = threading.Event()
    device = FakeNvml([COOL], hold=release)
    watch = NvmlWatch(device, period_s=0.002, join_timeout_s=0.05)
    watch.start(1)
    try:
        t = time.perf_counter()
        watch.block(0, t, t + 0.001, calls=1)
        assert device.holding.wait(timeout=2.0)  # the sampling thread is inside a read that does not return
    finally:
        before = time.perf_counter()
        (rec,) = watch.stop()
        waited = time.perf_counter() - before
        release.set()
    assert waited < 1.0
    assert rec is not None and "the sampling thread did not stop within 0.05 s" in rec["read_errors"]
    for thread in _watch_threads():
        assert thread.daemon
        thread.join(timeout=5.0)
    assert _watch_threads() == []


@pytest.mark.quick
def test_the_watch_refuses_misuse() -> None:
    watch = NvmlWatch(FakeNvml([COOL]), period_s=0.002)
    with pytest.raises(RuntimeError, match="before start"):
        watch.block(0, 0.0, 1.0, calls=1)
    assert watch.stop() == []  # not running: nothing watched (a caller's finally must not mask the timer's error)
    watch.start(1)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            watch.start(1)
        with pytest.raises(ValueError, match="ends after it starts"):
            watch.block(0, 2.0, 1.0, calls=1)
        with pytest.raises(ValueError, match="at least one call"):
            watch.block(0, 1.0, 2.0, calls=0)
    finally:
        assert watch.stop() == [None]
    assert watch.stop() == []
    with pytest.raises(ValueError, match="period_s must be positive"):
        NvmlWatch(FakeNvml([COOL]), period_s=0.0)
    assert _watch_threads() == []


@pytest.mark.standard
def test_the_shared_timer_drives_the_watch_through_its_protocol() -> None:
    """``measure_interleaved`` with the watch: one record per entrant, as many blocks as samples and as many calls
    as the blocks held (the watch is typed as the timer's ``Watch``: mypy checks that it is one)."""
    watch: timer.Watch = NvmlWatch(FakeNvml([COOL]), period_s=0.002)
    entrants = [timer.Entrant(fn=lambda: sum(range(97)), sync=lambda _outs: None, first_call_s=0.0) for _ in range(2)]
    try:
        out = timer.measure_interleaved(
            entrants, group="watch#1", warmup=1, min_samples=5, max_samples=5, budget_s=0.0, watch=watch
        )
    finally:
        records = watch.stop()
    assert len(records) == 2
    for result, rec in zip(out, records, strict=True):
        assert not isinstance(result, BaseException) and rec is not None
        t = result
        assert (rec["blocks"], rec["calls"]) == (t.n, t.n * t.calls_per_sample)
        assert rec["blocked_s"] == pytest.approx(sum(t.samples_s) * t.calls_per_sample)
    assert _watch_threads() == []


# --- the scripted device and the record -----------------------------------------------------------------------


@pytest.mark.quick
def test_the_scripted_counter_integrates_the_phases_power_and_holds_between_updates() -> None:
    now = [100.0]
    phases = [Phase(0.0, 1977, 2619, 311.7, 47), Phase(0.5, 1417, 2619, 173.3, 79, throttle_reasons=0x4)]
    device = ScriptedDevice(phases, origin_s=100.0, energy_start_mj=71_993, clock=lambda: now[0])
    assert device.energy_at(99.0) == 71_993
    assert device.energy_at(101.0) == 71_993 + int((311.7 * 0.5 + 173.3 * 0.5) * 1000)
    now[0] = 100.7
    assert (device.sm_clock_mhz(), device.power_mw(), device.throttle_reasons()) == (1417, 173_300, 0x4)
    held = ScriptedDevice(phases, origin_s=100.0, energy_update_s=0.3, clock=lambda: now[0])
    assert held.energy_at(100.29) == held.energy_at(100.0) and held.energy_at(100.31) == held.energy_at(100.59)
    assert held.energy_mj() == held.energy_at(100.6)


@pytest.mark.quick
def test_reason_names_follow_the_nvml_bits() -> None:
    assert reason_names(0) == []
    assert reason_names(0x1 | 0x40 | 0x80) == ["GpuIdle", "HwThermalSlowdown", "HwPowerBrakeSlowdown"]
    assert reason_names(0x4 | 0x8 | 0x20 | 0x100 | 0x400) == [
        "SwPowerCap",
        "HwSlowdown",
        "SwThermalSlowdown",
        "DisplayClockSetting",
        "Unknown0x400",
    ]


@pytest.mark.quick
def test_telemetry_round_trips_through_json_and_reads_a_minimal_record() -> None:
    full = Telemetry(
        device="NVIDIA H200",
        source="nvml",
        samples=37,
        period_s=0.01,
        blocks=3,
        calls=117,
        blocked_s=0.4133,
        sm_clock_mhz=Spread(1755, 1980, 1980),
        mem_clock_mhz=Spread(2619, 2619, 2619),
        power_w=Spread(301.3, 611.7, 689.9),
        temperature_c=Spread(51, 57.5, 63),
        throttle_reasons=("HwThermalSlowdown", "SwPowerCap"),
        clock_notes=("GpuIdle",),
        energy_per_call_j=2.0713,
        energy_reliable=True,
        energy_note="from the counter",
        read_errors=("temperature_c: planted",),
    )
    d = to_json(full)
    assert d["throttled"] is True and d["throttle_reasons"] == ["HwThermalSlowdown", "SwPowerCap"]
    back = from_json(Telemetry, json.loads(json.dumps(d)))
    assert back == full and to_json(back) == d
    minimal = from_json(Telemetry, {"device": "NVIDIA H200", "source": "nvml", "samples": 0})
    assert minimal == Telemetry(device="NVIDIA H200", source="nvml", samples=0)
    assert not minimal.throttled and minimal.sm_clock_mhz is None and minimal.energy_per_call_j is None
    with pytest.raises(FieldError, match=r"sm_clock_mhz\.median: is a str"):
        from_json(Telemetry, {**d, "sm_clock_mhz": {"min": 1, "median": "x", "max": 3}})
    with pytest.raises(FieldError, match="samples: is missing"):
        from_json(Telemetry, {"device": "NVIDIA H200", "source": "nvml"})


@pytest.mark.standard
def test_a_watch_record_round_trips(lockstep: _Lockstep) -> None:
    device = FakeNvml([COOL, HOT], clock=lockstep)
    watch, t0 = _started(device, 1, lockstep, period_s=0.002)
    device.origin_s = t0 - 0.087  # the blocks straddle the change of phase
    try:
        lockstep.run_until(t0 + 0.021)
        watch.block(0, t0 + 0.001, t0 + 0.019, calls=3)
    finally:
        (rec,) = watch.stop()
    assert rec is not None
    assert to_json(from_json(Telemetry, json.loads(json.dumps(rec)))) == rec


# --- the pynvml calls, against fakes of its functions and against this machine ---------------------------------


@pytest.mark.quick
def test_open_device_here_answers_unavailable_or_a_device_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine (no NVIDIA driver) the real attempt is :class:`Unavailable` saying the library is missing;
    on a GPU machine it is a device. Either way nothing is raised."""
    try:
        ctypes.CDLL(NVML_LIBRARY)
        present = True
    except OSError:
        present = False
    got = open_device(0)
    if present:
        assert isinstance(got, LibraryDevice | Unavailable)
        if isinstance(got, LibraryDevice):
            got.close()
    else:
        assert isinstance(got, Unavailable)
        assert got.reason.startswith("libnvidia-ml.so.1 not found: no NVIDIA driver on this machine"), got.reason
    FakePynvml(codes={"nvmlInit": 12}).install(monkeypatch)  # NVML_ERROR_LIBRARY_NOT_FOUND, wherever this runs
    missing = open_device(0)
    assert isinstance(missing, Unavailable) and missing.reason == (
        "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine "
        "(nvmlInit failed with NVML error 12 (NVML Shared Library Not Found))"
    )


@pytest.mark.quick
def test_the_device_reads_through_pynvml_and_shuts_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakePynvml().install(monkeypatch)
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice), dev
    assert (dev.name(), dev.sm_clock_mhz(), dev.mem_clock_mhz()) == ("NVIDIA Fake H200", 1977, 2619)
    assert (dev.power_mw(), dev.temperature_c(), dev.throttle_reasons(), dev.energy_mj()) == (
        311_713,
        47,
        0x41,
        8_675_309,
    )
    assert dev.energy_absent_reason() is None and dev.source == "nvml"
    dev.close()
    dev.close()
    assert nvml.log.count("nvmlInit") == 1 and nvml.log.count("nvmlShutdown") == 1


@pytest.mark.quick
def test_a_failing_call_names_the_function_and_the_nvml_code(monkeypatch: pytest.MonkeyPatch) -> None:
    FakePynvml(codes={"nvmlDeviceGetPowerUsage": 15}).install(monkeypatch)
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice)
    try:
        with pytest.raises(NvmlError, match=r"nvmlDeviceGetPowerUsage failed with NVML error 15 \(GPU is lost\)") as e:
            dev.power_mw()
        assert (e.value.function, e.value.code) == ("nvmlDeviceGetPowerUsage", 15)
        assert dev.sm_clock_mhz() == 1977  # the other reads go on
    finally:
        dev.close()


@pytest.mark.quick
def test_init_and_handle_failures_are_unavailable_with_the_reason_and_shut_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakePynvml(codes={"nvmlInit": 9}).install(monkeypatch)
    no_driver = open_device(0)
    assert isinstance(no_driver, Unavailable)
    assert no_driver.reason == "NVML did not initialise: nvmlInit failed with NVML error 9 (Driver Not Loaded)"
    nvml = FakePynvml().install(monkeypatch)
    absent = open_device(3)
    assert isinstance(absent, Unavailable)
    assert "NVML device 3 cannot be opened: nvmlDeviceGetHandleByIndex failed with NVML error 2" in absent.reason
    assert nvml.log[-1] == "nvmlShutdown"
    with pytest.raises(ValueError, match="0 or more"):
        open_device(-1)


@pytest.mark.quick
def test_an_unsupported_energy_counter_is_absent_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    FakePynvml(codes={"nvmlDeviceGetTotalEnergyConsumption": 3}).install(monkeypatch)
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice)
    assert dev.energy_mj() is None
    reason = dev.energy_absent_reason()
    assert reason is not None and "no total-energy counter" in reason and "NVML error 3" in reason, reason
    dev.close()
    FakePynvml(missing=["nvmlDeviceGetTotalEnergyConsumption"]).install(monkeypatch)
    old = open_device(0)
    assert isinstance(old, LibraryDevice)
    assert old.energy_absent_reason() == "this driver's NVML has no nvmlDeviceGetTotalEnergyConsumption"
    old.close()


@pytest.mark.quick
def test_throttle_reasons_fall_back_to_the_older_name_and_a_missing_function_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakePynvml(missing=["nvmlDeviceGetCurrentClocksEventReasons"], throttle=0x8).install(monkeypatch)
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice) and dev.throttle_reasons() == 0x8 and dev.throttle_reasons() == 0x8
    # the newer name is tried once; the older one answers from then on
    assert nvml.log.count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert nvml.log.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2
    dev.close()
    neither = ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"]
    FakePynvml(missing=neither).install(monkeypatch)
    bare = open_device(0)
    assert isinstance(bare, LibraryDevice)
    with pytest.raises(NvmlError, match="nvmlDeviceGetCurrentClocksThrottleReasons failed with NVML error 13"):
        bare.throttle_reasons()
    bare.close()


@pytest.mark.quick
def test_a_failing_throttle_read_is_raised_not_retried_under_the_older_name(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakePynvml(codes={"nvmlDeviceGetCurrentClocksEventReasons": 15}).install(monkeypatch)
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice)
    with pytest.raises(NvmlError, match="nvmlDeviceGetCurrentClocksEventReasons failed with NVML error 15"):
        dev.throttle_reasons()
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in nvml.log
    dev.close()


# --- CUDA graphs ----------------------------------------------------------------------------------------------


class _FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self._log = name, log

    def wait_stream(self, other: _FakeStream) -> None:
        self._log.append(f"{self.name} waits for {other.name}")


class _FakeGraph:
    def __init__(self, log: list[str]) -> None:
        self._log = log
        log.append("CUDAGraph()")

    def replay(self) -> None:
        self._log.append("replay")


class FakeCuda:
    """The part of ``torch.cuda`` that ``capture`` uses, logging each call; ``capture_error`` is raised as the
    capture begins, ``sync_error`` by every ``synchronize``."""

    def __init__(
        self, *, available: bool = True, capture_error: Exception | None = None, sync_error: Exception | None = None
    ) -> None:
        self.log: list[str] = []
        self.available, self.capture_error, self.sync_error = available, capture_error, sync_error
        self.current = _FakeStream("default", self.log)
        self.capturing = False

    def is_available(self) -> bool:
        return self.available

    def Stream(self) -> _FakeStream:
        self.log.append("Stream()")
        return _FakeStream("side", self.log)

    def current_stream(self) -> _FakeStream:
        return self.current

    @contextmanager
    def stream(self, s: _FakeStream) -> Iterator[None]:
        before, self.current = self.current, s
        self.log.append(f"enter stream {s.name}")
        try:
            yield
        finally:
            self.current = before
            self.log.append(f"leave stream {s.name}")

    def CUDAGraph(self) -> _FakeGraph:
        return _FakeGraph(self.log)

    @contextmanager
    def graph(self, g: _FakeGraph) -> Iterator[None]:
        self.log.append("begin capture")
        if self.capture_error is not None:
            raise self.capture_error
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False
            self.log.append("end capture")

    def synchronize(self) -> None:
        self.log.append("synchronize")
        if self.sync_error is not None:
            raise self.sync_error


def _logging_step(cuda: FakeCuda, fail_on: int = 0) -> Callable[[], dict[str, int]]:
    calls = [0]

    def step() -> dict[str, int]:
        calls[0] += 1
        cuda.log.append(f"step {calls[0]} on {cuda.current.name}" + (" capturing" if cuda.capturing else ""))
        if calls[0] == fail_on:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nsecond line")
        return {"call": calls[0]}

    return step


@pytest.mark.quick
def test_capture_warms_up_on_a_side_stream_then_captures_one_call_and_replays_its_static_output() -> None:
    cuda = FakeCuda()
    got = capture(_logging_step(cuda), warmup=3, cuda=cuda)
    assert isinstance(got, Captured), got
    assert cuda.log == [
        "Stream()",
        "side waits for default",
        "enter stream side",
        "step 1 on side",
        "step 2 on side",
        "step 3 on side",
        "leave stream side",
        "default waits for side",
        "CUDAGraph()",
        "begin capture",
        "step 4 on default capturing",
        "end capture",
        "replay",
        "synchronize",
    ]
    assert got.output == {"call": 4}
    assert got.replay() is got.output and got.replay() is got.output
    assert cuda.log[-2:] == ["replay", "replay"] and "step 5" not in " ".join(cuda.log)
    assert "3 warm-up calls on a side stream" in got.note


@pytest.mark.quick
def test_a_capture_that_raises_is_not_captured_naming_the_error() -> None:
    cuda = FakeCuda(capture_error=RuntimeError("operation not permitted when stream is capturing\ndetails"))
    got = capture(_logging_step(cuda), cuda=cuda)
    assert got == NotCaptured(
        "the step could not be captured into a CUDA graph: the capture failed with "
        "RuntimeError: operation not permitted when stream is capturing"
    )
    cuda = FakeCuda()
    during = capture(_logging_step(cuda, fail_on=2), warmup=3, cuda=cuda)
    assert isinstance(during, NotCaptured)
    assert "the 3 warm-up calls on a side stream failed with RuntimeError: CUDA error: operation" in during.reason
    assert "second line" not in during.reason
    broken = FakeCuda(capture_error=ValueError("dynamic shape"), sync_error=RuntimeError("device lost"))
    after = capture(_logging_step(broken), cuda=broken)
    assert isinstance(after, NotCaptured)
    assert after.reason.endswith(
        "ValueError: dynamic shape; the device then failed to sync too (RuntimeError: device lost)"
    )


@pytest.mark.quick
def test_capture_without_cuda_is_not_captured_saying_so() -> None:
    assert capture(lambda: None, cuda=FakeCuda(available=False)) == NotCaptured(NO_CUDA)
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        capture(lambda: None, warmup=0, cuda=FakeCuda())
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the real capture is checked by the gpu test")
    assert capture(lambda: torch.ones(3)) == NotCaptured("no CUDA device: CUDA graphs need one")


# --- on a CUDA machine -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.standard
def test_a_real_capture_replays_what_eager_computes() -> None:
    import torch

    a = torch.randn(257, 263, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(263, 271, device="cuda", dtype=torch.bfloat16)
    eager = (a @ b).clone()
    got = capture(lambda: a @ b)
    assert isinstance(got, Captured), got
    out = got.replay()
    torch.cuda.synchronize()
    # bitwise where cuBLAS picks the same kernel in the graph as eagerly; within bf16 rounding of the sums otherwise
    diff = (out.float() - eager.float()).abs().max().item()
    assert torch.equal(out, eager) or diff <= 2e-2 * eager.float().abs().max().item(), diff


@pytest.mark.gpu
@pytest.mark.standard
def test_the_real_nvml_device_reads_and_is_watched() -> None:
    dev = open_device(0)
    assert isinstance(dev, LibraryDevice), dev
    try:
        assert dev.name() and dev.sm_clock_mhz() > 0 and dev.power_mw() > 0
        watch = NvmlWatch(dev, period_s=0.005)
        watch.start(1)
        try:
            t0 = time.perf_counter()
            time.sleep(0.1)
            watch.block(0, t0, time.perf_counter(), calls=1)
        finally:
            (rec,) = watch.stop()
        assert rec is not None and rec["samples"] >= 3 and rec["source"] == "nvml", rec
    finally:
        dev.close()
