""" "Fastest" that means it: interleaved timing with an exact paired test (and its A/A control, synthetic and on this
machine under induced load), cheats that must fail on fresh inputs, and the implausible status."""

from __future__ import annotations

import functools
import math
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from compare.backends.registry import BACKENDS, spec
from compare.problem.cases import PRESETS
from compare.report.summary import summary_section
from compare.results import environment
from compare.run import exitcodes
from compare.run.harness import run
from compare.run.options import RunOptions
from compare.timing import timer
from compare.timing.significance import (
    ALPHA,
    FASTER,
    PAIRED,
    SLOWER,
    UNPAIRED,
    WITHIN_NOISE,
    compare_timing,
    signed_rank_greater,
)
from compare.timing.timer import INTERLEAVED, Entrant, Timing, TimingConfig, measure_interleaved, quartiles
from tests import cheat_backends, fake_clock
from tests.fake_clock import FakeClock

pytestmark = pytest.mark.quick

TINY = PRESETS["tiny"].case("float32")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The timer's clock, advanced only by the simulated steps (``tests.fake_clock``): the tests that take it decide on
    the timer's arithmetic, never on this machine's speed or load (a real spin of 0.1 ms failed on a busy CI
    machine)."""
    return fake_clock.install(monkeypatch)


# --- the paired test ------------------------------------------------------------------------------------------


def test_signed_rank_is_exact_on_small_samples() -> None:
    assert signed_rank_greater([1.0] * 8)[1] == pytest.approx(1 / 256)  # every sign positive: 1 of 2^8
    assert signed_rank_greater([-1.0] * 8)[1] == 1.0
    # W+ = 1+2+3 of ranks 1..4 (d = 1, 2, 3, -4): 3 of the 16 sign patterns reach 6 or more... count them
    d = [0.1, 0.2, 0.3, -0.4]
    w, p = signed_rank_greater(d)
    sums = [sum(r for r, s in zip((1, 2, 3, 4), signs, strict=True) if s) for signs in _patterns(4)]
    assert w == 6 and p == pytest.approx(sum(x >= 6 for x in sums) / 16)
    assert signed_rank_greater([0.0, 0.0])[1] == 1.0  # no information


def _patterns(n: int) -> Iterator[tuple[bool, ...]]:
    for k in range(2**n):
        yield tuple(bool(k >> i & 1) for i in range(n))


class _Machine:
    """A synthetic loaded machine: a block's time is the step's own times a load factor that comes and goes in
    bursts (a busy neighbour: 40x slower while it runs, bimodal samples) and drifts slowly; time advances with
    every block, so neighbouring blocks see the same load."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.now, self.busy_until, self.calm_until = rng, 0.0, 0.0, rng.expovariate(1 / 0.05)

    def block(self, base_s: float) -> float:
        if self.now >= self.calm_until and self.now >= self.busy_until:  # a burst starts
            self.busy_until = self.now + self.rng.expovariate(1 / 0.02)
            self.calm_until = self.busy_until + self.rng.expovariate(1 / 0.05)
        factor = 40.0 if self.now < self.busy_until else 1.0
        drift = 1.0 + 0.5 * math.sin(self.now / 0.3)
        t = base_s * factor * drift * self.rng.lognormvariate(0.0, 0.05)
        self.now += t
        return t


def _timings(machine: _Machine, bases: tuple[float, float], rounds: int, interleaved: bool, rng: random.Random):
    """Two timings of steps with the given base times: interleaved in random order per round, or in two windows."""
    samples: list[list[float]] = [[], []]
    if interleaved:
        for _ in range(rounds):
            order = [0, 1]
            rng.shuffle(order)
            for i in order:
                samples[i].append(machine.block(bases[i]))
    else:
        for i in (0, 1):
            samples[i] = [machine.block(bases[i]) for _ in range(rounds)]
    out = []
    for s in samples:
        q1, med, q3 = quartiles(sorted(s))
        out.append(
            Timing(
                med,
                q3 - q1,
                min(s),
                max(s),
                len(s),
                1,
                math.nan,
                1,
                tuple(s),
                design=INTERLEAVED if interleaved else timer.CONTIGUOUS,
                group="g#0" if interleaved else "",
                rounds=tuple(range(rounds)) if interleaved else (),
            )
        )
    return out


@pytest.mark.standard
def test_aa_on_a_synthetic_loaded_machine_interleaved_holds_the_nominal_rate_and_separate_windows_do_not() -> None:
    """The A/A control in simulation (2000 trials, 20 rounds each, bursts of 40x and drift): the paired rule calls
    the same step different at no more than its nominal rate (2 x ALPHA: either direction); the unpaired rule on
    two separate windows, the design before, does far more often (the negative control: the simulation can tell)."""
    trials = 2000
    rng = random.Random(7)
    alarms = {True: 0, False: 0}
    for interleaved in (True, False):
        for _ in range(trials):
            a, b = _timings(_Machine(rng), (1e-3, 1e-3), 20, interleaved, rng)
            v = compare_timing(a, b)
            assert v.design == (PAIRED if interleaved else UNPAIRED)
            alarms[interleaved] += v.significant
    nominal = 2 * ALPHA
    # binomial(2000, 0.02): mean 40, sd 6.3; 40 + 4 sd = 65
    assert alarms[True] <= trials * nominal + 4 * math.sqrt(trials * nominal), alarms
    assert alarms[False] > 5 * trials * nominal, alarms  # the old design fails its A/A control here
    print(f"synthetic A/A: interleaved {alarms[True]}/{trials}, separate windows {alarms[False]}/{trials}")


def test_the_paired_rule_still_sees_a_real_difference_under_the_same_load() -> None:
    rng = random.Random(11)
    found = sum(
        compare_timing(*_timings(_Machine(rng), (1e-3, 1.3e-3), 20, True, rng)).verdict == SLOWER for _ in range(200)
    )
    assert found >= 150, found  # 30% slower, 20 rounds, through 40x bursts: seen in most trials


def test_measure_interleaved_varies_the_order_and_records_rounds(clock: FakeClock) -> None:
    """Two steps of 0.2 ms on the fake clock, twice the 0.1 ms block, 12 rounds: the whole sequence of calls (warm-up,
    sizing, rounds), which this test reads by position, is the same on any machine (with a real 0.1 ms sleep, a
    warm-up call delayed by a busy core lengthened the sizing blocks, which shifted it)."""
    calls: list[str] = []

    def step(name: str):
        def fn() -> str:
            calls.append(name)
            clock.spin(2e-4)
            return name

        return fn

    out = measure_interleaved(
        [Entrant(step("a"), lambda _o: None, 0.0), Entrant(step("b"), lambda _o: None, 0.0)],
        group="g#1",
        warmup=1,
        min_samples=12,
        max_samples=12,
        budget_s=0.0,
        min_sample_s=1e-4,
    )
    ta, tb = out
    assert isinstance(ta, Timing) and isinstance(tb, Timing)
    assert ta.rounds == tb.rounds == tuple(range(12)) and ta.group == tb.group == "g#1"
    firsts = calls[2:]  # after the two warm-up calls: rounds of blocks; who went first in each round varies
    assert ta.calls_per_sample == 1
    leaders = {firsts[2 * r] for r in range(12)}
    assert leaders == {"a", "b"}
    assert compare_timing(ta, tb).design == PAIRED
    # two runs never pair: another group id, the unpaired rule
    assert compare_timing(ta, replace(tb, group="g#2")).design == UNPAIRED


def test_a_failing_entrant_leaves_the_rotation_and_the_others_are_timed() -> None:
    n = {"k": 0}

    def flaky() -> int:
        n["k"] += 1
        if n["k"] > 3:
            raise RuntimeError("broke in round 2")
        return 1

    out = measure_interleaved(
        [Entrant(flaky, lambda _o: None, 0.0), Entrant(lambda: 2, lambda _o: None, 0.0)],
        group="g",
        warmup=1,
        min_samples=5,
        budget_s=0.0,
        min_sample_s=1e-5,
    )
    assert isinstance(out[0], RuntimeError) and not isinstance(out[1], BaseException)


# --- the A/A control on this machine, under induced load ------------------------------------------------------


@pytest.fixture
def twin() -> Iterator[str]:
    """torch-eager registered a second time, under another name: the same backend twice."""
    name = "torch-eager-twin"
    BACKENDS[name] = replace(spec("torch-eager"), name=name, baseline=False)
    try:
        yield name
    finally:
        BACKENDS.pop(name, None)


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A busy process on one core (pinned to the first core where the OS allows it), for the length of a test."""
    code = (
        "import os\n"
        "try:\n"
        "    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "except Exception:\n"
        "    pass\n"
        "while True:\n"
        "    pass\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        p.kill()
        p.wait(timeout=10)


AA_TRIALS = 24


@pytest.mark.slow
def test_aa_control_same_backend_twice_under_induced_load(twin: str, busy_core: None) -> None:
    """torch-eager and its twin, timed together on ``tiny`` 24 times with a busy process on one core: called
    significantly different in at most 2 trials (nominal 2%: more than 2 of 24 has probability 1.1%). Before,
    with separate windows and Mann-Whitney, 3 of 20 such pairs were called different on a loaded 2-core machine."""
    cfg = TimingConfig(warmup=2, min_samples=10, budget_s=0.15)
    alarms, ratios = [], []
    for _ in range(AA_TRIALS):
        doc = run([TINY], [spec("torch-eager"), spec(twin)], ["fwd"], RunOptions(cfg))
        rows = {r.backend: r for r in doc.results}
        a, b = rows["torch-eager"].timing, rows[twin].timing
        assert a is not None and b is not None
        v = compare_timing(a, b)
        assert v.design == PAIRED
        ratios.append(v.ratio)
        alarms.append(v.significant)
    print(f"A/A under load: {sum(alarms)} of {AA_TRIALS} called different; ratios {min(ratios):.2f}..{max(ratios):.2f}")
    assert sum(alarms) <= 2, (alarms, ratios)


POWER_TRIALS = 10


def _work(units: int) -> int:
    """``units`` units of one single-threaded pure-Python loop (about 0.1 ms each): work of one kind, in a known
    amount, that no library can thread or cache away."""
    return sum(sum(range(2000)) for _ in range(units))


@pytest.mark.slow
@pytest.mark.quiet
def test_power_a_quarter_more_of_the_same_work_is_found_under_induced_load(busy_core: None) -> None:
    """The A/A control's other half, under the same load (a busy process on one core): a step of 4 units of work
    (twice: A and its twin A') and one of 5 (B: 25% more of the same kind), timed together with the run's timer
    settings, 10 trials of about 0.3 s. In the trials whose noise band (``NOISE_K`` x the two spreads) is narrower
    than the difference, the paired test calls B slower than A in at least 80% (its power at 25%), and A' differs
    from A in at most 2 of the 10 (the control: the count is not simply every trial).

    ``quiet`` as well as ``slow``: the false-alarm bound holds under any load, power does not (the noise band
    widens with the spread: beside other tests on a 2-core machine, load average 5, the relative IQRs reached
    100% and +25% was found in 0 to 3 of 10 trials; a CI run alone found it in 7). Where the band is wider than
    +25% in more than half the trials the machine is too noisy to measure power, and the test says so as a skip
    with every trial's figures. It cannot see the power at smaller differences, under heavier load than one busy
    core, or for multi-threaded steps (the A/A control above runs a real backend)."""
    verdicts, alarms = [], 0
    for trial in range(POWER_TRIALS):
        entrants = [Entrant(functools.partial(_work, k), lambda _o: None, 0.0) for k in (4, 4, 5)]
        out = measure_interleaved(entrants, group=f"power#{trial}", warmup=2, min_samples=10, budget_s=0.1, seed=trial)
        a, twin, b = out
        assert isinstance(a, Timing) and isinstance(twin, Timing) and isinstance(b, Timing), out
        v = compare_timing(a, b)
        assert v.design == PAIRED and v.pairs is not None and v.pairs >= 10, v
        verdicts.append(v)
        alarms += compare_timing(a, twin).significant
    said = "; ".join(f"{v.verdict} x{v.ratio:.2f} (band {v.tol:.2f}, p {v.p_slower:.2g})" for v in verdicts)
    resolved = [v for v in verdicts if v.ratio > 1 + v.tol]
    if len(resolved) < POWER_TRIALS / 2:
        pytest.skip(f"too noisy to measure power: the band was wider than the difference in most trials: {said}")
    found = sum(v.verdict == SLOWER for v in resolved)
    print(f"power at +25%: {found} of {len(resolved)} resolved trials (of {POWER_TRIALS}); A/A {alarms}; {said}")
    assert found >= 0.8 * len(resolved) and alarms <= 2, (found, len(resolved), alarms, said)


# --- cheats ---------------------------------------------------------------------------------------------------


@pytest.fixture
def cheats() -> list:
    return [cheat_backends.spec(n) for n in cheat_backends.CHEATS]


@pytest.mark.standard
@pytest.mark.parametrize("ceilings", [True, False], ids=["ceilings", "no-ceilings"])
def test_every_cheat_fails_on_the_harness_inputs_and_is_never_fastest(cheats: list, ceilings: bool) -> None:
    """Each cheat of ``tests.cheat_backends`` ends as ``parity-fail`` (or ``error``) with the ceilings off as well as
    on, and is never named fastest. Control: torch-eager, the same code honest, passes (and the cache cheats are
    right on their first call: their verdict comes from the calls the harness judged)."""
    # blocks of 0.2 ms, not 2: a cheat's step takes a microsecond, and each call's fresh inputs (a permutation and a
    # gather, outside the clock) cost ten times that, so 2 ms blocks of thousands of calls took a minute per run
    cfg = TimingConfig(warmup=1, min_samples=10, budget_s=0.05, min_sample_s=2e-4)
    doc = run([TINY], [spec("torch-eager"), *cheats], ["fwd", "fwd+bwd"], RunOptions(cfg, ceilings=ceilings))
    by = {(r.backend, r.mode): r for r in doc.results}
    for c in cheats:
        for mode in ("fwd", "fwd+bwd"):
            r = by[(c.name, mode)]
            assert r.status in ("parity-fail", "error"), (c.name, mode, r.status, r.reason)
            if mode == "fwd" or not c.name.startswith("cheat-cache"):  # a cached y's graph is freed: fwd+bwd errs
                assert r.parity is not None and r.parity.tier == "pass"  # right on the golden inputs...
                assert r.status == "parity-fail", (c.name, mode, r.status, r.reason)
                assert r.parity.fresh is not None and r.parity.fresh.tier == "fail"  # ...wrong on the harness's
                assert r.parity.fresh.judged is not None and r.parity.fresh.made is not None
                assert "fresh inputs (seed" in r.reason
    for mode in ("fwd", "fwd+bwd"):
        honest = by[("torch-eager", mode)]
        assert honest.status == "ok", honest.reason
        assert honest.parity is not None and honest.parity.fresh is not None and honest.parity.fresh.tier == "pass"
        assert honest.parity.fresh.made is not None and honest.parity.fresh.made >= cfg.min_samples
        assert honest.extras["deterministic"] is True
    text = summary_section(doc)
    # each line's fastest (the intro also says "Fastest:": splitting the text at the first one read the intro)
    fastest = [x.split(". Fastest: ", 1)[1].split(". Fusion headroom")[0] for x in text.splitlines() if x[:4] == "- **"]
    assert len(fastest) == 2 and all(f.startswith("torch-eager") and "cheat" not in f for f in fastest), fastest
    assert exitcodes.of_statuses(r.status for r in doc.results) == exitcodes.FINDING


#: The adversarial cheats' runs (``tests.cheat_backends.ADVERSARIAL``): blocks of 0.2 ms and 50 samples at least, so
#: that every cell makes at least :data:`MIN_CALLS` calls on the harness's inputs (asserted), on any machine.
ADVERSARIAL_CFG = TimingConfig(warmup=1, min_samples=50, budget_s=0.05, min_sample_s=2e-4)
#: A step stale on a share ``f`` of its calls escapes the every-call check only if none of its ``n`` calls is stale:
#: ``(1 - f) ** n``, 0.52% at f = 10% and n = 50 (below 1e-15 at f = 50%).
MIN_CALLS = 50


@pytest.mark.standard
@pytest.mark.parametrize("ceilings", [True, False], ids=["ceilings", "no-ceilings"])
def test_a_cheat_that_computes_late_or_stale_fails_on_the_calls_checked_at_return(ceilings: bool) -> None:
    """A step that returns copies of its inputs and computes when read, one that computes on a thread of its own
    after returning (its sync a no-op), and steps stale on 10% and 50% of their calls each end as ``parity-fail``
    from the every-call check, with the ceilings on and off, and none is named fastest; torch-eager, the same code
    honest, passes every call. Escape: ``(1 - f) ** calls`` (:data:`MIN_CALLS`), 0 for the others (every call is
    wrong)."""
    names = ["cheat-copy", "cheat-thread", "cheat-stale-10", "cheat-stale-50"]
    specs = [spec("torch-eager"), *(cheat_backends.spec(n) for n in names)]
    doc = run([TINY], specs, ["fwd"], RunOptions(ADVERSARIAL_CFG, ceilings=ceilings))
    by = {r.backend: r for r in doc.results}
    honest = by["torch-eager"]
    assert honest.status == "ok", honest.reason
    assert honest.parity is not None and honest.parity.fresh is not None
    assert honest.parity.fresh.spot_calls == honest.parity.fresh.made, honest.parity.fresh
    for n in names:
        r = by[n]
        assert r.parity is not None and r.parity.fresh is not None and r.parity.fresh.made is not None
        if n.startswith("cheat-stale"):  # the escape rate holds at this many calls (said first: a busy machine
            assert r.parity.fresh.made >= MIN_CALLS, (n, r.parity.fresh.made)  # that times fewer is the cause)
        assert r.status == "parity-fail", (n, r.status, r.reason, r.parity.fresh.made)
        assert "calls checked at return fail" in r.reason, (n, r.reason)
    fastest = [x for x in summary_section(doc).splitlines() if x[:4] == "- **"]
    assert fastest and all("Fastest: torch-eager" in x or "Fastest:" not in x for x in fastest), fastest


@pytest.mark.standard
@pytest.mark.parametrize("ceilings", [True, False], ids=["ceilings", "no-ceilings"])
def test_a_row_value_cache_never_hits_on_a_timed_call_and_is_never_fastest(ceilings: bool) -> None:
    """A cache keyed on each row's values (bare, and padded with throwaway work) answers only rows it has seen: every
    call on the harness's inputs brings rows no call saw, so it never answers a timed call from memory (it counts
    its hits: the golden inputs' second call is its only one) and computes every row, honest and slower than
    torch-eager; it is never found faster than torch-eager. Control: its hit counter does count, on the golden inputs.

    "Never found faster" is the paired test's verdict, not the medians' order: a cache that computes every row runs
    torch-eager's step and more, yet beside heavy load (6 to 8 on 2 cores) its median once came out the quickest,
    and the summary names the quickest median fastest, with its verdict against torch-eager. The verdict keeps its
    false-alarm rate under any load (the A/A controls above)."""
    names = ["cheat-row-cache", "cheat-row-cache-padded"]
    for n in names:
        cheat_backends.ADVERSARIAL[n].hits = 0
    doc = run(
        [TINY],
        [spec("torch-eager"), *(cheat_backends.spec(n) for n in names)],
        ["fwd"],
        RunOptions(ADVERSARIAL_CFG, ceilings=ceilings),
    )
    by = {r.backend: r for r in doc.results}
    for n in names:
        r = by[n]
        assert r.status in ("ok", "parity-fail", "error"), (n, r.status, r.reason)
        assert r.parity is not None and r.parity.fresh is not None and r.parity.fresh.made >= MIN_CALLS
        assert cheat_backends.ADVERSARIAL[n].hits == 1, (n, cheat_backends.ADVERSARIAL[n].hits)
    eager = by["torch-eager"].timing
    assert by["torch-eager"].status == "ok" and eager is not None, by["torch-eager"].reason
    for n in names:
        if by[n].timing is not None:
            v = compare_timing(eager, by[n].timing)
            assert v.design == PAIRED and v.verdict != FASTER, (n, v)


def test_a_backend_that_cannot_run_on_new_inputs_is_an_error(cheats: list) -> None:
    class NoFresh(cheat_backends.Cheat):
        def prepare(self, problem, mode):  # type: ignore[no-untyped-def]
            return replace(super().prepare(problem, mode), bind=None)

    name = "cheat-golden"
    cheat_backends.CHEATS["no-fresh"] = NoFresh("no-fresh", cheat_backends.CHEATS[name].answer)
    try:
        doc = run([TINY], [cheat_backends.spec("no-fresh")], ["fwd"], RunOptions(TimingConfig(warmup=1, budget_s=0.01)))
    finally:
        del cheat_backends.CHEATS["no-fresh"]
    (r,) = doc.results
    assert r.status == "error" and "no bind" in r.reason, r.reason


# --- implausible is a status ----------------------------------------------------------------------------------


@pytest.mark.standard
def test_a_step_faster_than_the_measured_ceiling_is_an_implausible_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real backend against a ceiling set far too low (as a cheat's time would stand against a true one): the
    status is ``implausible``, it is a finding for the exit code, and the summary names no fastest among them."""
    from compare.cost.records import Ceilings
    from compare.run import conductor

    real = conductor.measure_ceilings

    def low(dtypes, budget_s=0.5):  # type: ignore[no-untyped-def]
        c = real(dtypes, budget_s=0.05)
        assert c is not None
        return Ceilings(c.device, {k: replace(v, flops_per_s=1e3) for k, v in c.by_dtype.items()})

    monkeypatch.setattr(conductor, "measure_ceilings", low)
    doc = run([TINY], [spec("torch-eager")], ["fwd"], RunOptions(TimingConfig(warmup=1, budget_s=0.05), ceilings=True))
    (r,) = doc.results
    assert r.status == "implausible" and r.reason.startswith("implausible:"), r.reason
    assert exitcodes.of_statuses([r.status]) == exitcodes.FINDING
    assert "Fastest: nothing timed" in summary_section(doc)


def _timed(samples: list[float]) -> Timing:
    """A one-call-per-sample Timing of ``samples`` (seconds), its statistics as the shared timer computes them."""
    q1, median, q3 = quartiles(samples)
    return Timing(median, q3 - q1, min(samples), max(samples), len(samples), 1, samples[0], 1, tuple(samples))


def test_plausibility_is_judged_on_the_median_not_on_one_fast_sample() -> None:
    """The busy machine's honest jax-xla: one quiet moment gave a fastest sample of 33.7 ms, 1.23x the ceiling,
    against a median of 62 ms (0.67x): it is not implausible. A step whose median beats the line (five of nine
    calls at 20 ms: 2.07x) is, and its reason says it judged the median."""
    from compare.cost.records import Ceiling, Ceilings
    from compare.results.document import Result
    from compare.run.cell import against_ceilings, min_flops

    flops = min_flops(TINY, "fwd")
    assert flops
    ceil = Ceilings("cpu", {"float32": Ceiling(flops / (1.23 * 33.7e-3), 1e10, dtype="float32")})
    ok = Result.for_case("jax-xla", TINY, "fwd", "ok")
    honest = against_ceilings(replace(ok, timing=_timed([33.7e-3, *[62e-3 + i * 1e-4 for i in range(9)]])), ceil, flops)
    assert honest.status == "ok" and honest.implausible == "", honest.reason
    cheat = against_ceilings(replace(ok, timing=_timed([20e-3] * 5 + [62e-3] * 4)), ceil, flops)
    assert cheat.status == "implausible" and cheat.reason.startswith("implausible: its median call"), cheat.reason
    assert "at 2.07x the matmul ceiling" in cheat.reason, cheat.reason


def test_verdict_names_its_design() -> None:
    t = Timing(1.0, 0.01, 0.99, 1.01, 10, 1, 0.0, 1, tuple([1.0] * 10))
    assert compare_timing(t, t).design == UNPAIRED and compare_timing(t, t).verdict == WITHIN_NOISE
    slow = replace(t, median_s=2.0, samples_s=tuple([2.0 + i * 1e-3 for i in range(10)]), min_s=2.0, max_s=2.009)
    fast = replace(t, samples_s=tuple([1.0 + i * 1e-3 for i in range(10)]), max_s=1.009)
    assert compare_timing(fast, slow).verdict == SLOWER and compare_timing(slow, fast).verdict == FASTER


# --- ceilings that are ceilings: real bf16 backends where native 16-bit matmul is slow --------------------------


def _slow(seconds_per_gflop: float):  # type: ignore[no-untyped-def]
    """A matmul route of a CPU without 16-bit GEMM instructions: the right answer, at 1/seconds_per_gflop GFLOP/s."""
    import torch

    def mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.copy_(torch.mm(a.float(), b.float()))
        time.sleep(2 * a.shape[0] * a.shape[1] * b.shape[1] / 1e9 * seconds_per_gflop)
        return out

    return mm


BF16_TIMED = ("torch-eager", "torch-compile", "jax-xla", "jax-unfused")


#: Instruction sets with which a CPU multiplies bf16 natively (``compare.results.environment.ISA_FLAGS``): there,
#: torch's real bf16 steps run on them, whatever the probe is told, and can beat a float32-route ceiling.
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def _run_with_native_bf16_slowed(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from compare.run import conductor
    from torch_impl import ceilings

    monkeypatch.setattr(conductor, "CEILING_PROBES", ("ceilings",))  # torch's routes alone (XLA's probe: below)
    # 0.05 GFLOP/s: called emulated against a float32 route of 0.2 GFLOP/s and more (EMULATED_BELOW), which a load
    # of 6 to 8 on 2 cores brought the real one down to 0.93 (at 0.5 GFLOP/s, as this was, it was then not emulated)
    monkeypatch.setattr(ceilings, "native_matmul", _slow(1 / 0.05))
    case = TINY.__class__(TINY.model, TINY.shape, "bfloat16", TINY.dist, TINY.seed)
    cfg = TimingConfig(warmup=1, min_samples=10, budget_s=0.05)
    return case, cfg, run([case], [spec(n) for n in BF16_TIMED], ["fwd"], RunOptions(cfg, ceilings=True))


@pytest.mark.slow
@pytest.mark.quiet
def test_a_slow_native_bf16_route_makes_the_ceiling_the_float32_route_and_the_control_flags_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native bf16 route made 0.05 GFLOP/s, far slower than float32 (an emulating CPU): the ceiling takes the
    float32 route and the summary says matmul is emulated. The control: with the float32 route slowed as well (to
    5 MFLOP/s), every timed bf16 backend is implausible against the ceiling (so the check can see them).

    Real time on purpose: the float32 route and the backends' steps are this machine's, measured (a fake clock
    would time them at nothing). ``quiet``: what it decides rests on their speed; the margins hold beside heavy load
    (the float32 route must read over 0.2 GFLOP/s, and a tiny bf16 step under 0.35 s)."""
    from torch_impl import ceilings

    case, cfg, doc = _run_with_native_bf16_slowed(monkeypatch)
    c = doc.ceilings.get("bfloat16") if doc.ceilings else None
    assert c is not None and c.matmul_emulated and c.route == "float32", c
    assert "bfloat16 matmul is emulated on this machine" in summary_section(doc)

    monkeypatch.setattr(ceilings, "float32_matmul", _slow(1 / 0.005))  # the control: no fast route left (5 MFLOP/s)
    doc = run([case], [spec(n) for n in BF16_TIMED], ["fwd"], RunOptions(cfg, ceilings=True))
    flagged = {r.backend for r in doc.results if r.status == "implausible"}
    assert flagged == set(BF16_TIMED), [(r.backend, r.status, r.reason) for r in doc.results]


@pytest.mark.skipif(
    bool(set(environment.cpu_isa() or ()) & set(NATIVE_BF16)),
    reason="this CPU multiplies bf16 natively: its real bf16 steps do not slow down with the probe, so an emulating "
    "CPU cannot be simulated here (its float32 GEMMs can be slower than its native bf16 ones, e.g. under "
    "MKL_CBWR=COMPATIBLE, and then a real step rightly beats a float32-route ceiling)",
)
@pytest.mark.quiet  # real steps against a ceiling measured in the same run: a load that comes and goes moves both
def test_no_real_bf16_backend_is_implausible_where_native_16_bit_matmul_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU without native bf16 matmul (its real bf16 steps emulate too), with the probe's native route slowed
    (0.05 GFLOP/s): no real bf16 backend is implausible against the float32-route ceiling."""
    _case, _cfg, doc = _run_with_native_bf16_slowed(monkeypatch)
    assert [(r.backend, r.status) for r in doc.results if r.status != "ok"] == [
        (r.backend, r.status) for r in doc.results if r.status == "deviates"
    ], [(r.backend, r.status, r.reason) for r in doc.results]
    assert all(not r.implausible for r in doc.results)


def test_tensor_parallel_rows_are_checked_against_the_ceiling_of_their_hosts() -> None:
    """A TP row's whole step (every rank's FLOPs) against the ceiling times its hosts: the committed cpu-tp rows are
    plausible against their own run's ceilings and implausible against a ceiling a thousand times lower."""
    from pathlib import Path

    from compare.cost.records import Ceilings
    from compare.problem.cases import PRESETS as P
    from compare.results.document import read_json
    from compare.run.conductor import hold

    doc = read_json(Path(__file__).resolve().parents[1] / "reports" / "cpu-tp" / "results.json")
    assert doc.ceilings is not None
    cases = [P["cpu-mlp"].case("float32")]
    rows = [r for r in doc.results if r.tp is not None and r.timing is not None]
    assert rows and {r.world_size for r in rows} == {1, 2}
    for r in rows:
        assert hold(replace(r, status="ok"), cases[0], doc.ceilings).status == "ok", r.label
    low = Ceilings(
        doc.ceilings.device, {k: replace(c, flops_per_s=c.flops_per_s / 1e3) for k, c in doc.ceilings.by_dtype.items()}
    )
    for r in rows:
        flagged = hold(replace(r, status="ok"), cases[0], low)
        assert flagged.status == "implausible" and flagged.implausible, r.label


def test_a_ceiling_is_the_higher_of_the_libraries_probes() -> None:
    """torch's GEMMs can be far slower than XLA's on the same machine (MKL_CBWR=COMPATIBLE: 31 against 182 GFLOP/s
    here), and a jax-xla step was then called faster than the machine: the ceiling takes the faster library's rate
    and copy bandwidth, and keeps torch's two 16-bit routes (so "emulated" still reads them)."""
    from compare.cost.records import Ceiling

    torch_c = Ceiling(
        50e9,
        20e9,
        (512,) * 3,
        1,
        "bfloat16",
        "cpu",
        native_flops_per_s=2e9,
        float32_route_flops_per_s=50e9,
        route="float32",
    )
    xla_c = Ceiling(150e9, 25e9, (1024,) * 3, 2, "bfloat16", "cpu", route="xla")
    m = torch_c.merged(xla_c)
    assert (m.flops_per_s, m.route, m.matmul_shape, m.bytes_per_s) == (150e9, "xla", (1024,) * 3, 25e9)
    assert m.matmul_emulated and m.native_flops_per_s == 2e9
    assert torch_c.merged(replace(xla_c, flops_per_s=1e9, bytes_per_s=1e9)) == torch_c  # a lower probe changes nothing


def test_steps_of_about_the_same_speed_share_a_block_size() -> None:
    assert timer.shared_block_sizes([9, 10, 13, 1]) == [13, 13, 13, 1]
    assert timer.shared_block_sizes([100, 40, 20, 10]) == [100, 40, 40, 10]
    assert timer.shared_block_sizes([]) == []


def test_a_step_that_stalls_on_every_wake_up_gets_the_block_size_of_its_twin(clock: FakeClock) -> None:
    """Two steps of 0.1 ms; the second pays a 2.5 ms stall whenever the other ran just before it (a thread's wake-up
    under a busy core). Sized from single calls, its blocks would be 1 call long against its twin's 20, and the pair
    would not be exchangeable; sized by growing blocks, both get the same size."""
    last = {"who": ""}

    def step(name: str, stall: float):
        def fn() -> str:
            if last["who"] != name:
                clock.spin(stall)
            last["who"] = name
            clock.spin(1e-4)
            return name

        return fn

    out = measure_interleaved(
        [Entrant(step("a", 0.0), lambda _o: None, 0.0), Entrant(step("b", 2.5e-3), lambda _o: None, 0.0)],
        group="g#stall",
        warmup=3,
        min_samples=5,
        max_samples=5,
        budget_s=0.0,
        min_sample_s=2e-3,
    )
    ta, tb = out
    assert isinstance(ta, Timing) and isinstance(tb, Timing)
    assert ta.calls_per_sample == tb.calls_per_sample >= 15, (ta.calls_per_sample, tb.calls_per_sample)


def test_twins_with_jittery_calls_get_one_block_size(clock: FakeClock) -> None:
    """Two copies of one step whose calls take 0.1 ms times a seeded jitter of up to 1.5x: sized each on its own,
    their blocks came out of different lengths (the fastest of a few calls differs between them); shared, they do
    not."""
    rng = random.Random(3)

    def fn() -> None:
        clock.spin(1e-4 * (1 + 0.5 * rng.random()))

    out = measure_interleaved(
        [Entrant(fn, lambda _o: None, 0.0), Entrant(fn, lambda _o: None, 0.0)],
        group="g#jitter",
        warmup=2,
        min_samples=5,
        max_samples=5,
        budget_s=0.0,
        min_sample_s=5e-3,
    )
    ta, tb = out
    assert isinstance(ta, Timing) and isinstance(tb, Timing)
    assert ta.calls_per_sample == tb.calls_per_sample, (ta.calls_per_sample, tb.calls_per_sample)
