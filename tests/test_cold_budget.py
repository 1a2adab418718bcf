"""Cold-cache timing, the run's time budget, the interpreted-parity cache and the ETA (issue: the timer of the
field). Fakes stand in for a cache: a flush that sets a flag, a step that is slower while the flag is set; the
negative controls are a flush that evicts nothing and a step that ignores it."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from compare.backends.registry import Availability, BackendSpec, Prepared, register, unregister
from compare.formats.codec import FieldError, from_json, to_json
from compare.problem import datacache
from compare.problem.cases import PRESETS, InputError
from compare.problem.golden import Problem
from compare.report.render import files
from compare.report.summary import untimed_reason
from compare.results.document import Results
from compare.run import harness, parity_cache
from compare.run.budget import FLOOR, SHARES, Budget, split
from compare.run.options import RunOptions
from compare.run.progress import eta
from compare.run.shape_sweep import budgeted_sweep
from compare.timing import llc, timer
from compare.timing.budget_record import PHASES, BudgetRecord
from tests.fake_nvml import Phase, ScriptedDevice
from tests.numpy_backend import NumpyPlain

pytestmark = pytest.mark.quick


class _Cache:
    """A pretend last-level cache: ``flush`` empties it, a step fills it; a step on an empty cache pays ``miss_s``.
    Time passes on the fake clock (:func:`fake_clock`), so what the timer measures is exact on any machine, busy or
    not."""

    def __init__(self, miss_s: float, evicts: bool = True) -> None:
        self.warm, self.miss_s, self.evicts, self.flushes = False, miss_s, evicts, 0

    def flush(self) -> None:
        self.flushes += 1
        _CLOCK.t += 0.003  # a flush's own time, which no sample may include
        if self.evicts:
            self.warm = False

    def step(self) -> int:
        _CLOCK.t += 0.0007 if self.warm else 0.0007 + self.miss_s
        self.warm = True
        return 1


def _cold_of(cache: _Cache) -> timer.Timing:
    (got,) = timer.measure_cold(
        [timer.Entrant(cache.step, lambda outs: None, 0.0)], cache.flush, group="g", min_samples=7, budget_s=0.0
    )
    assert isinstance(got, timer.Timing)
    return got


def test_a_cold_sample_is_one_call_after_a_flush_whose_time_is_left_out(fake_clock: _FakeClock) -> None:
    cache = _Cache(miss_s=0.004)
    t = _cold_of(cache)
    assert t.design == timer.COLD and t.calls_per_sample == 1 and t.n == 7 and cache.flushes == 7
    # every sample paid the miss, none the flush's 3 ms on top
    assert t.median_s == pytest.approx(0.0047), t.median_s


def test_control_a_flush_that_evicts_nothing_gives_warm_times(fake_clock: _FakeClock) -> None:
    cache = _Cache(miss_s=0.004, evicts=False)
    cache.warm = True
    t = _cold_of(cache)
    assert t.median_s == pytest.approx(0.0007), t.median_s  # the same timer: without an eviction the samples are warm


def test_cold_rounds_keep_every_entrant_and_a_failing_step_is_its_own_error(fake_clock: _FakeClock) -> None:
    cache = _Cache(miss_s=0.0)

    def broken() -> int:
        raise RuntimeError("boom")

    got = timer.measure_cold(
        [timer.Entrant(cache.step, lambda o: None, 0.0), timer.Entrant(broken, lambda o: None, 0.0)],
        cache.flush,
        group="g",
        min_samples=5,
        budget_s=0.0,
    )
    assert isinstance(got[0], timer.Timing) and got[0].n == 5 and isinstance(got[1], RuntimeError)


def test_the_last_level_cache_is_read_from_the_os_listing(tmp_path: Path) -> None:
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "491520K")]):  # fmt: skip
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    got = llc.cpu_last_level(tmp_path)
    assert got is not None and (got.level, got.bytes) == (3, 491520 * 1024)
    assert llc.flush_bytes(got) == llc.FLUSH_MULTIPLE * 491520 * 1024
    assert llc.flush_bytes(None) == llc.MIN_FLUSH_BYTES
    # this machine lists one too, and the record round-trips
    here = llc.cpu_last_level()
    assert here is None or from_json(llc.CacheSize, to_json(here)) == here


def test_the_host_flush_writes_its_whole_buffer() -> None:
    f = llc.HostFlush(3 * 2**20 + 5)
    before = int(f._buf.sum())
    f()
    assert int(f._buf.sum()) == before + f._buf.size and f.bytes >= 3 * 2**20


def test_budget_parts_floor_and_cuts() -> None:
    b = Budget(100.0)
    assert b.part("timing", 4) == pytest.approx(SHARES["timing"] * 100 / 4, rel=1e-3)
    b.start -= 1000  # long past its end: a phase still gets its floor
    assert b.part("timing", 4) == pytest.approx(FLOOR * SHARES["timing"] * 100 / 4)
    b.cut("x")
    b.cut("x")
    rec = b.record()
    assert rec.cuts == ("x",) and rec.overrun_s > 0 and from_json(BudgetRecord, to_json(rec)) == rec
    with pytest.raises(ValueError, match="positive"):
        Budget(0.0)


def test_a_budget_counts_each_phases_seconds_and_the_rest_is_what_it_cannot_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seconds spent inside ``Budget.phase`` (on a fake clock) are that phase's, summed over its entries, an exception
    included; the record keeps them in order, reads back the same, and its rest is the time outside every phase. A
    document without phases (written before they were kept) reads as none; an unknown phase is refused by name."""
    from compare.run import budget as budget_mod

    assert set(SHARES) == set(PHASES)  # every phase with a share has a name in the report, and no other
    now = [1000.0]
    monkeypatch.setattr(budget_mod, "CLOCK", lambda: now[0])
    b = Budget(100.0)
    with b.phase("timing"):
        now[0] += 5.0
    with pytest.raises(RuntimeError), b.phase("profile"):
        now[0] += 2.0
        raise RuntimeError("a failing profile still spent its time")
    with b.phase("timing"):
        now[0] += 5.0
    now[0] += 3.0  # outside every phase: the rest
    rec = b.record()
    assert (
        list(rec.phases.items()) == [("timing", 10.0), ("profile", 2.0)] and rec.spent_s == 15.0 and rec.rest_s == 3.0
    )
    assert from_json(BudgetRecord, to_json(rec)) == rec
    assert from_json(BudgetRecord, {"total_s": 1.0, "spent_s": 2.0, "cuts": []}).phases == {}
    assert "phases" not in to_json(BudgetRecord(1.0, 2.0))  # an old document is written back as it was
    with pytest.raises(FieldError, match=r"phases \['warmup'\] are not budget phases"):
        from_json(BudgetRecord, {"total_s": 1.0, "spent_s": 2.0, "cuts": [], "phases": {"warmup": 1.0}})
    with pytest.raises(ValueError, match="unknown budget phase 'warmup'"), b.phase("warmup"):
        pass


def test_a_short_budget_cuts_the_sweep_to_its_ends_and_says_so() -> None:
    case = PRESETS["tiny"].case("float32")
    b = Budget(1.0)
    swept, tokens, per_shape, _ = budgeted_sweep([case], [1, 8, 64, 512], 1.0, b)
    assert swept == [case] and tokens == [1, 512] and per_shape < 1.0
    assert any("tokens [1, 512]" in c for c in b.cuts) and any("per shape" in c for c in b.cuts)
    roomy = Budget(1e6)
    assert budgeted_sweep([case], [1, 8, 64], 0.2, roomy)[:3] == ([case], [1, 8, 64], 0.2) and roomy.cuts == []


def test_a_late_sweep_keeps_one_dtype_per_shape_and_says_so() -> None:
    """A run past the sweep's share (its parity and compiles overran the budget) sweeps the first dtype of each
    model and shape; the control: on time, every dtype is swept."""
    f32, bf16 = PRESETS["tiny"].case("float32"), PRESETS["tiny"].case("bfloat16")
    odd = PRESETS["odd"].case("bfloat16")
    late = Budget(10.0, start=time.monotonic() - 9.0)
    swept, tokens, _, _ = budgeted_sweep([f32, bf16, odd], [1, 8, 64], 0.2, late)
    assert swept == [f32, odd] and tokens == [1, 64]
    assert any("one dtype per model and shape" in c and "left out geglu 96->328 bfloat16 " in c for c in late.cuts)
    on_time = Budget(1e6)
    assert budgeted_sweep([f32, bf16], [1, 8], 0.2, on_time)[0] == [f32, bf16] and on_time.cuts == []


def test_eta_takes_the_deadline_when_the_pace_overstates() -> None:
    assert eta(1, 16, 60.0) == pytest.approx(900.0)
    assert eta(1, 16, 60.0, until_deadline=20.0) == 20.0
    assert eta(8, 16, 60.0, until_deadline=-5.0) == pytest.approx(60.0)  # past the deadline: the pace again


class _Interpreted(NumpyPlain):
    """The numpy backend, declared interpreted (parity only): its cells go through the parity cache."""

    name = "numpy-interpreted"
    calls = 0

    def availability(self) -> Availability:
        return Availability(True, timed=False)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        _Interpreted.calls += 1
        return replace(super().prepare(problem, mode), timed=False)


BACKEND = _Interpreted()
SPEC = BackendSpec(name="numpy-interpreted", framework="numpy", target=__name__, about="a test's interpreted backend")


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))
    register(SPEC)
    yield SPEC
    unregister(SPEC.name)


def _run(spec: BackendSpec, reuse: bool = True, budget: Budget | None = None, watch: Any = None, **kw: Any) -> Results:
    case = PRESETS["tiny"].case("float32")
    options = RunOptions(reuse_parity=reuse, **kw)
    return harness.run([case], [spec], ["fwd"], options, budget=budget, watch=watch)


@pytest.mark.standard
def test_an_interpreted_verdict_is_reused_on_the_same_code_and_missed_on_another(
    interpreted: BackendSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Interpreted.calls = 0
    first = _run(interpreted).results[0]
    assert first.status == "ok" and "parity_cache" not in first.extras and _Interpreted.calls == 1
    again = _run(interpreted).results[0]
    assert _Interpreted.calls == 1, "a hit must not prepare the step again"
    assert again.extras["parity_cache"]["key"] == parity_cache.key(interpreted, PRESETS["tiny"].case("float32"), "fwd")
    assert again.parity == first.parity and again.status == first.status
    report = files(Results(results=(again,)))["DETAILS.md"]
    assert "parity reused from the interpreted-parity cache" in report
    # a changed kernel source is another key: the cell runs again
    real = datacache.source_digest
    monkeypatch.setattr(datacache, "source_digest", lambda paths: real(paths) + "-edited")
    third = _run(interpreted).results[0]
    assert _Interpreted.calls == 2 and "parity_cache" not in third.extras
    # the run's own flag turns reuse off
    monkeypatch.setattr(datacache, "source_digest", real)
    assert "parity_cache" not in _run(interpreted, reuse=False).results[0].extras and _Interpreted.calls == 3


@pytest.mark.standard
def test_an_error_is_not_cached(interpreted: BackendSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, problem: Problem, mode: str) -> Prepared:
        raise RuntimeError("transient")

    monkeypatch.setattr(_Interpreted, "prepare", broken)
    assert _run(interpreted).results[0].status == "error"
    monkeypatch.undo()
    monkeypatch.setenv(datacache.ENV, datacache.os.environ.get(datacache.ENV, "off"))
    case = PRESETS["tiny"].case("float32")
    assert parity_cache.lookup(interpreted, case, "fwd") is None


@pytest.mark.standard
def test_a_budgeted_run_times_warm_and_cold_and_states_its_cuts(
    monkeypatch: pytest.MonkeyPatch, fake_clock: _FakeClock
) -> None:
    """A step of 1 ms and a flush of 20 ms under an 8 s budget, on the fake clock: warm and cold samples both fit, and
    the record says where the time went. (With the real step and flush, whether the cold samples fit depended on
    the machine's speed and its cache: a 2-core VM's flush writes 1.5 GB per cold sample.)"""
    monkeypatch.setattr(harness, "cold_flush", lambda _: (llc.cpu_last_level(), _NoFlush(0.02)))
    doc = _run(_ticking("numpy-1ms", 0.001), cache_mode="both", budget=Budget(8.0))
    (r,) = doc.results
    assert r.status == "ok" and r.timing is not None and r.cold is not None
    assert r.timing.design == timer.INTERLEAVED and r.cold.design == timer.COLD and r.cold.n >= 5
    assert doc.cold is not None and doc.cold.flush_bytes >= llc.MIN_FLUSH_BYTES
    assert doc.budget is not None and doc.budget.total_s == 8.0
    again = from_json(Results, to_json(doc))
    assert again.cold == doc.cold and again.budget == doc.budget and again.results[0].cold == r.cold
    text = "\n".join(files(doc).values())  # the one page and its details
    assert "cold median" in text and "Cold caches ('both')" in text and "Time budget: 8 s" in text
    # where the time went: the timed samples and the profiles each counted, the rest what no phase could cut
    spent = dict(doc.budget.phases)
    assert set(spent) == {"timing", "profile"} and spent["timing"] > 0, spent
    assert sum(spent.values()) + doc.budget.rest_s == pytest.approx(doc.budget.spent_s, abs=2e-3)
    assert "Where it went: timed samples " in text and "the rest (first calls and compiles" in text


def test_a_bad_cache_mode_is_refused_by_name() -> None:
    with pytest.raises(InputError, match="cache mode"):
        harness.run([PRESETS["tiny"].case("float32")], [], ["fwd"], RunOptions(cache_mode="lukewarm"))


def test_the_kernel_time_cells_mark_a_profile_slower_than_the_step() -> None:
    from compare.kernels.busy import KernelTime
    from compare.kernels.summary import Kernels
    from compare.report.render import _kernel_cells
    from compare.results.document import Result

    t = timer.Timing(1e-3, 1e-5, 1e-3, 1e-3, 5, 1, 0.1, 1, (1e-3,) * 5)
    k = Kernels("torch.profiler", "cpu", 2, kernel_time=KernelTime(800.0, 800.0, {"gemm": 600.0, "elementwise": 200.0}))
    base = Result("b", "geglu", "float32", PRESETS["tiny"].shape, "c", "fwd", "ok", timing=t, kernels=k)
    busy, split, over = _kernel_cells(base)
    assert busy == "800 us" and split == "gemm 75%, unfused 25%" and over == "200 us"
    slow = replace(k, kernel_time=KernelTime(1300.0, 1300.0, {"gemm": 1300.0}))
    busy, _, over = _kernel_cells(replace(base, kernels=slow))
    assert "> wall" in busy and over.startswith("-")
    assert _kernel_cells(replace(base, kernels=None)) == ["-", "-", "-"]
    assert np.isfinite(t.median_s)


@pytest.mark.standard
@pytest.mark.parametrize("throttle", [0x40, 0])
def test_a_throttled_window_is_marked_in_the_timing_table_and_a_quiet_one_is_not(throttle: int) -> None:
    from compare.timing import nvml
    from tests.numpy_backend import SPEC as NUMPY

    device = ScriptedDevice([Phase(0.0, 1977, 2619, 431.5, 67, throttle)], name="Scripted H200")
    register(NUMPY)
    try:
        doc = _run(NUMPY, cache_mode="warm", watch=lambda: nvml.NvmlWatch(device, period_s=0.002))
    finally:
        unregister(NUMPY.name)
    (r,) = doc.results
    tele = from_json(nvml.Telemetry, r.extras["telemetry"])
    assert tele.samples > 0 and tele.sm_clock_mhz is not None and tele.sm_clock_mhz.median == 1977
    assert tele.throttled == bool(throttle)
    text = files(doc)["DETAILS.md"]
    assert ("**throttled**: HwThermalSlowdown" in text) == bool(throttle) and "SM clock 1977 MHz" in text


@pytest.mark.standard
def test_cuda_graphs_on_a_machine_without_cuda_say_why_not() -> None:
    from compare.backends.registry import spec

    doc = harness.run([PRESETS["tiny"].case("float32")], [spec("torch-eager")], ["fwd"], RunOptions(cuda_graphs=True))
    (r,) = doc.results
    assert r.status == "ok" and r.extras["cuda_graph"].startswith("not captured: no CUDA device")
    assert "CUDA graph: not captured" in files(doc)["DETAILS.md"]


def test_the_eta_of_cells_that_finish_in_groups_reads_the_stages_times() -> None:
    """A case's cells of one mode settle together: after the first of two like groups (8 cells each, 30 s), the time
    left is one more group and the compile-cost sweep's part, not the pace per cell's 15 x 30 s / 8."""
    import io

    from compare.run.progress import Display, run_stages

    t = [0.0]
    case = PRESETS["tiny"].case("float32")
    cells = [(c, "fwd", f"b{i}") for c in (case, replace(case, seed=1)) for i in range(8)]
    stages = run_stages(cells)
    out = io.StringIO()
    with Display(16, stream=out, live=False, clock=lambda: t[0], tick_s=None) as d:
        d.expect(stages, 16)
        d.after(lambda: 7.0)
        for s in stages[: len(stages) // 2]:
            d.stage(s.kind, s.case, s.mode, s.backend)
            t[0] += 30.0 / (len(stages) // 2)
            if s.kind == "judging":  # each cell said as its verdict is made
                d.cell(s.backend, "ok")
    assert "about 37" in out.getvalue().splitlines()[7], out.getvalue()


@pytest.mark.quick
def test_a_groups_part_gives_each_kind_its_floor_before_halves() -> None:
    """``budget.split``: the cold samples' floor (each after a flush several times a step) is met first where the
    part allows it, the rest split in halves; a part below both floors splits in their proportion; one kind alone
    gets the whole part. The control: plain halves of the same part would leave the cold floor unmet."""
    part, warm_min, cold_min = 4.0, 1.0, 2.5  # a large case on a CPU with a large cache: the flush dominates
    warm, cold = split(part, warm_min, cold_min)
    assert cold >= cold_min and warm >= warm_min and warm + cold == pytest.approx(part)
    assert part / 2 < cold_min  # halves would have cut every cold sample
    warm, cold = split(1.75, warm_min, cold_min)
    assert warm + cold == pytest.approx(1.75) and cold / warm == pytest.approx(cold_min / warm_min)
    assert split(3.0, 0.0, cold_min) == (0.0, 3.0) and split(3.0, warm_min, 0.0) == (3.0, 0.0)


def test_no_sweep_variant_starts_past_the_sweeps_deadline_and_each_is_said() -> None:
    """``run_shape_sweep`` with a deadline already passed starts nothing and names every variant it left out; the
    control: without one, the same backend's variant runs."""
    from compare.backends.registry import BackendSpec

    ran: list[dict[str, Any]] = []

    class _Swept:
        name = "test-swept"

        def availability(self) -> Availability:
            return Availability(True)

        def shape_sweep(self, make: Any, tokens: Any, *, budget_s: float, **variant: Any) -> list[dict[str, Any]]:
            ran.append(variant)
            return []

    spec = BackendSpec(
        name="test-swept",
        target="tests.test_cold_budget",
        framework="numpy",
        about="x",
        shape_sweep=({"dynamic": False},),
    )
    case = PRESETS["tiny"].case("float32")
    cuts: list[str] = []
    import compare.run.shape_sweep as shapes_mod

    orig = BackendSpec.load
    try:
        BackendSpec.load = lambda self: _Swept()  # type: ignore[method-assign]
        shapes_mod.run_shape_sweep([case], [1, 2], 0.01, lambda s: None, [spec], time.monotonic() - 1, cuts.append)
        assert ran == [] and cuts == [
            "compile-cost sweep: test-swept (dynamic=False) at float32 left out (the sweep's share of the budget "
            "was spent)"
        ]
        shapes_mod.run_shape_sweep([case], [1, 2], 0.01, lambda s: None, [spec], None, cuts.append)
        assert ran == [{"dynamic": False}] and len(cuts) == 1
    finally:
        BackendSpec.load = orig  # type: ignore[method-assign]


@pytest.mark.standard
def test_prepare_parity_fills_the_cache_a_run_reuses_and_leaves_timed_backends_alone(
    interpreted: BackendSpec, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``prepare --parity`` judges the interpreted backends only (the timed one beside it is not run: a run times
    it) and keeps their verdicts; the run after it prepares nothing again and its row says it came from the cache.
    The control: without ``--parity`` nothing is judged."""
    from compare.cli import main
    from tests import numpy_backend

    def timed_prepare(problem: Problem, mode: str) -> Prepared:
        raise AssertionError("prepare --parity ran a timed backend")

    monkeypatch.setattr(main, "BACKENDS", {SPEC.name: SPEC, numpy_backend.NAME: numpy_backend.SPEC})
    monkeypatch.setattr(numpy_backend.BACKEND, "prepare", timed_prepare)
    argv = ["prepare", "--preset", "tiny", "--dtype", "float32"]
    _Interpreted.calls = 0
    assert main.main(argv) == 0 and _Interpreted.calls == 0  # the control: goldens only
    assert main.main([*argv, "--parity"]) == 0
    out = capsys.readouterr().out
    assert f"interpreted parity: {SPEC.name} " in out and "ok (judged now)" in out and numpy_backend.NAME not in out
    assert _Interpreted.calls == 1
    assert main.main([*argv, "--parity"]) == 0 and "ok (found in the cache)" in capsys.readouterr().out
    row = _run(interpreted).results[0]
    assert _Interpreted.calls == 1 and "parity_cache" in row.extras


class _FakeClock:
    """The timer's and the budget's clock in a test (:func:`fake_clock`): it moves only when a :class:`_Ticking` step
    says it took its seconds, so every decision of the budget is the same on any machine, busy or not."""

    t = 0.0

    def __call__(self) -> float:
        return self.t


_CLOCK = _FakeClock()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> _FakeClock:
    from compare.run import budget

    monkeypatch.setattr(timer, "CLOCK", _CLOCK)
    monkeypatch.setattr(budget, "CLOCK", _CLOCK)
    return _CLOCK


class _Ticking(NumpyPlain):
    """The numpy backend whose every call takes ``step_s`` on the fake clock (its real time is read by no decision)."""

    def __init__(self, name: str, step_s: float) -> None:
        self.name, self.step_s = name, step_s

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        base = super().prepare(problem, mode)
        assert base.bind is not None
        bind = base.bind

        def ticking(run: Any) -> Any:
            def step() -> Any:
                _CLOCK.t += self.step_s
                return run()

            return step

        return replace(base, step=ticking(base.step), bind=lambda inputs, slot: ticking(bind(inputs, slot)))


class _TickSpec(BackendSpec):
    def load(self) -> Any:
        return _TICKING[self.name]


_TICKING: dict[str, _Ticking] = {}


def _ticking(name: str, step_s: float, twin_of: str = "") -> BackendSpec:
    """A registry line for a :class:`_Ticking` backend (``twin_of``: outside the core comparison)."""
    _TICKING[name] = _Ticking(name, step_s)
    return _TickSpec(name=name, framework="numpy", target="tests.test_cold_budget", about="a test", twin_of=twin_of)


@pytest.mark.standard
@pytest.mark.parametrize(("budget_s", "over"), [(4.0, True), (100.0, False)])
def test_the_core_comparison_gets_the_paired_tests_rounds_and_an_overrun_is_said(
    fake_clock: _FakeClock, budget_s: float, over: bool
) -> None:
    """Two core backends of 0.1 s a step and a twin (``twin_of``) under a 4 s budget (the group's timing part:
    1.2 s, against 2.2 s for the core's warm-up, sizing and 8 rounds): both core backends are timed with at least
    the paired test's rounds, the run says by how much it went over, and the twin is cut; the control, a 100 s
    budget, times all three and says no overrun. (The budget before this cut the core to 5 samples.)"""
    from compare.timing.significance import MIN_PAIRS

    specs = [_ticking("tick-a", 0.1), _ticking("tick-b", 0.1), _ticking("tick-twin", 0.1, twin_of="tick-a")]
    doc = harness.run([PRESETS["tiny"].case("float32")], specs, ["fwd"], budget=Budget(budget_s))
    rows = {r.backend: r for r in doc.results}
    for name in ("tick-a", "tick-b"):
        t = rows[name].timing
        assert rows[name].status == "ok" and t is not None and t.n >= MIN_PAIRS, (name, t)
    cuts = doc.budget.cuts if doc.budget else ()
    assert any("over its part" in c and "tick-a, tick-b" in c for c in cuts) == over, cuts
    assert (rows["tick-twin"].timing is None) == over and rows["tick-twin"].status == "ok"


class _Profiled(_Ticking):
    """The ticking backend with a full and a quick profile that say which one ran (each an empty summary)."""

    ran: ClassVar[list[str]] = []

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        def profile(path: Path | None) -> dict[str, Any]:
            _Profiled.ran.append("full")
            return {}

        def quick(path: Path | None) -> dict[str, Any]:
            _Profiled.ran.append("quick")
            return {}

        return replace(super().prepare(problem, mode), profile=profile, quick_profile=quick)


@pytest.mark.standard
@pytest.mark.parametrize(
    ("step_s", "budget_s", "want"), [(0.001, None, "full"), (0.1, 4.0, "quick"), (0.001, 60.0, "full")]
)
def test_a_step_too_slow_for_its_part_of_the_profile_share_is_profiled_quick_and_the_cut_is_said(
    monkeypatch: pytest.MonkeyPatch, fake_clock: _FakeClock, step_s: float, budget_s: float | None, want: str
) -> None:
    """A 100 ms step under a 4 s budget whose profile share is 2% (its part: at most 0.08 s, less than the 0.5 s five
    calls take; its timing part, 1.2 s, fits the 0.8 s of its floor, so it is timed) is profiled on its quick
    profile, and the budget's cuts say so; the controls: no budget, or a fast step under a large one, profile in full
    and cut nothing of the profile. (With the real shares a lone cell that is timed always fits its profile part: a
    quick profile needs several cells, or a late start, to share the profile part.) On the fake clock: on a busy
    machine the real 100 ms step was left no profile at all."""
    from tests import numpy_backend

    monkeypatch.setitem(SHARES, "profile", 0.02)
    monkeypatch.setattr(numpy_backend, "BACKEND", _Profiled("numpy-profiled", step_s))
    register(numpy_backend.SPEC)
    _Profiled.ran = []
    try:
        doc = _run(numpy_backend.SPEC, profile=True, budget=Budget(budget_s) if budget_s else None)
    finally:
        unregister(numpy_backend.SPEC.name)
    assert doc.results[0].status == "ok" and _Profiled.ran == [want]
    said = [c for c in (doc.budget.cuts if doc.budget else ()) if "profiled on one step" in c]
    assert bool(said) == (want == "quick"), said


@pytest.mark.standard
@pytest.mark.parametrize(("budget_s", "want"), [(1.0, []), (None, ["full"])])
def test_a_step_the_budget_leaves_untimed_is_neither_profiled_nor_its_memory_recorded(
    monkeypatch: pytest.MonkeyPatch, fake_clock: _FakeClock, budget_s: float | None, want: list[str]
) -> None:
    """A twin's 200 ms step under a 1 s budget (its group's part of the timing share: at most 0.3 s, less than its
    warm-up and five samples) is not timed beyond its first calls; then it is not run again to profile it or record
    its memory, and the cuts say both; its parity stands. The control: no budget, the same step profiled in full and
    its memory asked for. (A backend of the core comparison is never left untimed: see above.)"""
    from tests import numpy_backend

    monkeypatch.setattr(numpy_backend, "BACKEND", _Profiled("numpy-profiled", 0.2))
    twin = replace(numpy_backend.SPEC, twin_of="torch-eager")
    register(twin)
    _Profiled.ran = []
    try:
        doc = _run(twin, profile=True, memory=True, budget=Budget(budget_s) if budget_s else None)
    finally:
        unregister(twin.name)
    (r,) = doc.results
    assert r.status == "ok" and _Profiled.ran == want, (r.status, r.reason, _Profiled.ran)
    assert r.memory is not None
    cuts = doc.budget.cuts if doc.budget else ()
    said = [c for c in cuts if "not profiled and memory not recorded" in c]
    if budget_s:
        assert r.timing is None and any("not timed beyond its first calls" in c for c in cuts), cuts
        assert len(said) == 1 and r.memory.saved_reason and "time budget" in r.memory.saved_reason, (said, r.memory)
        # its row says why it was not timed, not its backend's note
        assert untimed_reason(r).startswith("cut by the time budget (a twin, 0.2"), untimed_reason(r)
    else:
        assert r.timing is not None and not said and "time budget" not in (r.memory.saved_reason or "")
        assert "untimed" not in r.extras


@pytest.mark.standard
def test_torchs_quick_profile_counts_the_same_kernels_per_step_as_its_full_one() -> None:
    """The quick profile (one warm-up call, one profiled step) reads the same kernels per step as the full one (one
    skipped, one warm-up, three profiled); only its time rests on one step."""
    from compare.backends.registry import spec
    from compare.problem.golden import golden_for

    case = PRESETS["tiny"].case("float32")
    p = spec("torch-eager").load().prepare(golden_for(case).problem, "fwd")
    assert p.profile is not None and p.quick_profile is not None
    full, quick = p.profile(None), p.quick_profile(None)
    assert [(k["name"], k["count"]) for k in quick["kernels"]] == [(k["name"], k["count"]) for k in full["kernels"]]
    assert quick["kernels"] and quick["kernel_time"]["busy_us"] > 0


class _SlowAfterCompile(NumpyPlain):
    """The numpy backend whose second call (the first after its "compile") takes ``slow_s`` and every other call
    ``fast_s``: the slow read a step can give right after a compile."""

    name = "numpy-slow-after-compile"
    slow_s, fast_s = 0.3, 0.01

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        base = super().prepare(problem, mode)
        assert base.bind is not None
        bind, calls = base.bind, [0]

        def ticking(run: Any) -> Any:
            def step() -> dict[str, np.ndarray]:
                calls[0] += 1
                _CLOCK.t += self.slow_s if calls[0] == 2 else self.fast_s
                return run()

            return step

        return replace(base, step=ticking(base.step), bind=lambda inputs, slot: ticking(bind(inputs, slot)))


@pytest.mark.standard
@pytest.mark.parametrize(("fast_s", "timed"), [(0.01, True), (0.3, False)])
def test_a_step_slow_once_after_its_compile_is_read_again_and_timed(
    monkeypatch: pytest.MonkeyPatch, fake_clock: _FakeClock, fast_s: float, timed: bool
) -> None:
    """Under a 4 s budget (a lone group's timing part: 1.2 s, 0.15 s a floor call) a twin's step whose first call
    after its compile takes 0.3 s (within ``RECHECK`` times of 0.15 s) is read once more, found fast and timed; the
    control: a step slow on every call is cut, and its cut names its 0.3 s. With a single read both were cut. (A
    twin: a backend of the core comparison is never cut.)"""
    from tests import numpy_backend

    backend = _SlowAfterCompile()
    backend.fast_s = fast_s
    monkeypatch.setattr(numpy_backend, "BACKEND", backend)
    twin = replace(numpy_backend.SPEC, twin_of="torch-eager")
    register(twin)
    try:
        doc = _run(twin, budget=Budget(4.0))
    finally:
        unregister(twin.name)
    (r,) = doc.results
    cuts = [c for c in (doc.budget.cuts if doc.budget else ()) if "not timed beyond its first calls" in c]
    assert r.status == "ok" and (r.timing is not None) == timed and bool(cuts) != timed, (r.timing, cuts)
    assert timed or re.search(r"\(0\.3\d* s a step\)", cuts[0]), cuts


class _NoFlush:
    """A flush that evicts nothing (its eviction is not what these tests are about) and takes ``seconds`` on the fake
    clock (:func:`fake_clock`)."""

    bytes, about = llc.MIN_FLUSH_BYTES, "a test's no-op flush"

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def __call__(self) -> None:
        _CLOCK.t += self.seconds


@pytest.mark.standard
def test_the_cold_part_pays_the_cheapest_steps_first_rather_than_none(
    monkeypatch: pytest.MonkeyPatch, fake_clock: _FakeClock
) -> None:
    """Two steps of 80 and 100 ms under a 9 s budget (their group's part: 2.7 s; the warm floor of the core
    comparison, 1.98 s, is paid first, so the cold part is 0.72 s): an even split (0.36 s each) paid neither one's
    five cold calls; now the cheaper step (0.4 s) gets its cold samples and the other's cut says why. Both are timed
    warm. On the fake clock."""
    specs = [_ticking("numpy-80ms", 0.08), _ticking("numpy-100ms", 0.1)]
    monkeypatch.setattr(harness, "cold_flush", lambda _: (None, _NoFlush()))
    doc = harness.run(
        [PRESETS["tiny"].case("float32")], specs, ["fwd"], RunOptions(cache_mode="both"), budget=Budget(9.0)
    )
    got = {r.backend: r for r in doc.results}
    assert all(r.status == "ok" and r.timing is not None for r in got.values()), got
    assert got["numpy-80ms"].cold is not None and got["numpy-100ms"].cold is None, got
    cuts = [c for c in (doc.budget.cuts if doc.budget else ()) if "no cold samples" in c]
    assert len(cuts) == 1 and cuts[0].startswith("numpy-100ms") and "once its 1 cheaper step is paid" in cuts[0], cuts


@pytest.mark.standard
def test_the_fresh_input_check_is_counted_as_parity_not_as_the_profiles(fake_clock: _FakeClock) -> None:
    """The step on fresh inputs (the anti-cheat check, never cut) runs after the profile and memory record; its time
    is the rest's, not the ``profile`` phase's: a 0.3 s step with neither profile nor memory asked for leaves that
    phase at 0 and the rest at least its first call and its fresh-input call (0.6 s). (Counted in the phase, an
    interpreted step's fresh check made "profiles and memory" 45 s of a 127 s run.) On the fake clock: with a real
    0.3 s sleep the phase's bookkeeping was timed too, and its bar (0.1 s) was this machine's speed."""
    doc = _run(_ticking("numpy-300ms", 0.3), budget=Budget(60.0))
    assert doc.results[0].status == "ok" and doc.results[0].timing is not None and doc.budget is not None
    spent = dict(doc.budget.phases)
    # the rest: the record's seconds are rounded to the millisecond
    assert spent["profile"] == 0.0 and doc.budget.rest_s >= 0.6 - 1e-3, (spent, doc.budget.rest_s)
