"""A jitted JAX step's kernel table has a time per kernel (``jax_impl.profiling.profile_jit``), read off XLA's trace
of the real step as ``jax_impl.dispatch_profile`` reads jax-unfused's replays: so the fusion table splits what fusion
saved into GEMM time and time outside GEMMs for JAX backends too (``compare.report.cost.kernel_time_split``).

The times mean what ``torch.profiler``'s do: per step, all of a kernel's launches together, in microseconds. On CPU
XLA may run independent kernels at once on its thread pool, so they can add up to more than the step's wall time,
but not to many times it. If any kernel of the table has no event in the trace, no kernel gets a time.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import jax
import pytest

from compare.backends.registry import Prepared, spec
from compare.formats.codec import from_json
from compare.kernels import summary as ks
from compare.problem.cases import PRESETS
from compare.problem.golden import golden_for
from compare.report.cost import kernel_time_split
from compare.results.document import Result
from jax_impl import profiling

pytestmark = pytest.mark.quick

TINY = PRESETS["tiny"]
#: GEMM kernels per step of the tiny GeGLU MLP: gate, up, down; and the backward's two per projection.
GEMMS = {"fwd": 3, "fwd+bwd": 9}
#: Kernel time per step may exceed the step's wall time (XLA:CPU runs independent kernels at once on its pool, and
#: the profiler adds its own cost), but not by more than this.
SANE_FACTOR = 4.0


def _result(s: dict[str, Any]) -> Result:
    """A jax-xla result on the tiny forward with the kernel table ``s``."""
    case = TINY.case("float32")
    kernels = from_json(ks.Kernels, s)
    return Result("jax-xla", case.model, case.dtype, case.shape, case.name, "fwd", "ok", kernels=kernels)


@functools.cache
def _prepared(mode: str) -> Prepared:
    problem = golden_for(TINY.case("float32")).problem
    return spec("jax-xla").load().prepare(problem, mode)


@functools.cache
def _summary(mode: str) -> dict[str, Any]:
    p = _prepared(mode)
    assert p.profile is not None
    s = p.profile(None)
    ks.check_summary(s)
    print(ks.describe(s))
    return s


def _wall_us(p: Prepared, calls: int = 15) -> float:
    """The step's median wall time per call (us), each call synced."""
    p.sync(p.step())
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        p.sync(p.step())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


@pytest.mark.standard
@pytest.mark.compile
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_every_kernel_of_a_jitted_step_is_timed(mode: str) -> None:
    s = _summary(mode)
    kernels = s["kernels"]
    assert kernels and all(k["time_us"] is not None and k["time_us"] > 0 for k in kernels), kernels
    assert sum(k["count"] for k in kernels if k["kind"] == "gemm") == GEMMS[mode]
    assert "kernel times: XLA's trace of 3 steps" in s["notes"]
    assert s["trace"] is None  # no trace folder asked for: the trace went to a temporary one


@pytest.mark.standard
@pytest.mark.compile
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_kernel_times_add_up_to_about_the_steps_wall_time(mode: str) -> None:
    p = _prepared(mode)
    before = _wall_us(p)
    s = _summary(mode)
    wall = max(before, _wall_us(p))  # the machine's load at the time of the profile, within a few ms either side
    total = sum(k["time_us"] for k in s["kernels"])
    gemm = sum(k["time_us"] for k in s["kernels"] if k["kind"] == "gemm")
    print(f"{mode}: kernels {total:.0f} us per step (GEMMs {gemm:.0f} us); wall time {wall:.0f} us per call")
    assert 0 < gemm < total < SANE_FACTOR * wall


@pytest.mark.standard
@pytest.mark.compile
def test_the_fusion_table_can_split_a_jitted_steps_time() -> None:
    """``kernel_time_split`` (GEMM time, time outside GEMMs) is defined for jax-xla's profile, in seconds."""
    s = _summary("fwd")
    split = kernel_time_split(_result(s))
    assert split is not None
    gemm_s, outside_s = split
    assert gemm_s == pytest.approx(1e-6 * sum(k["time_us"] for k in s["kernels"] if k["kind"] == "gemm"))
    assert 0 < outside_s < gemm_s + outside_s < 1.0


@pytest.mark.standard
@pytest.mark.compile
def test_a_kernel_missing_from_the_trace_leaves_every_time_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: the same profile, with one kernel's events dropped from what the trace gives."""
    timed = _summary("fwd")  # the profile as it is (cached before the patch)
    dropped: list[str] = []
    read = profiling.trace_events

    def without_one(trace_file: str | None) -> dict[profiling.Site, list[float]]:
        events = read(trace_file)
        site = next(site for site in sorted(events) if not site[1].startswith("ynn_fusion"))  # one non-GEMM kernel
        dropped.append(site[1])
        return {k: v for k, v in events.items() if k != site}

    monkeypatch.setattr(profiling, "trace_events", without_one)
    p = _prepared("fwd")
    assert p.profile is not None
    s = p.profile(None)
    assert dropped and s["kernels"] == [{**k, "time_us": None} for k in timed["kernels"]]  # the same table, untimed
    expected = 3 * s["kernels_per_step"]  # one event per kernel in each of the 3 traced steps
    assert f"no kernel times: {expected - 3} of {expected} kernel events found in the trace" in s["notes"]
    assert kernel_time_split(_result(s)) is None  # and the fusion table leaves the split out


def test_kernel_times_rule() -> None:
    """:func:`profiling.kernel_times` on hand-made events: a row's events summed over its instructions and divided by
    the runs; a row with no event, or an instruction with an event too many, and no row has a time."""
    counts = {"gemm": 2, "act": 1}
    sites = [(("m", "dot.1"), "gemm"), (("m", "dot.2"), "gemm"), (("m", "tanh"), "act")]
    events = {("m", "dot.1"): [10.0, 12.0], ("m", "dot.2"): [20.0, 22.0], ("m", "tanh"): [3.0, 5.0], ("x", "y"): [9.0]}
    ok = profiling.kernel_times(counts, sites, events, runs=2)
    assert ok.times == {"gemm": 32.0, "act": 4.0}
    assert ok.note("2 steps") == "kernel times: XLA's trace of 2 steps"
    missing = profiling.kernel_times(counts, sites, {k: v for k, v in events.items() if k[1] != "tanh"}, runs=2)
    assert missing.times is None and (missing.seen, missing.expected) == (4, 6)
    assert missing.note("2 steps") == "no kernel times: 4 of 6 kernel events found in the trace"
    extra = profiling.kernel_times(counts, sites, {**events, ("m", "tanh"): [3.0, 5.0, 4.0]}, runs=2)
    assert extra.times is None and (extra.seen, extra.expected) == (7, 6)
    assert profiling.kernel_times(counts, sites, {}, runs=2).times is None  # no trace (or no Chrome trace in it)


def test_hlo_module_name_is_the_traces_hlo_module() -> None:
    """Trace events are matched to the table's instructions by the module's name (``jit_<function>``) and theirs."""

    def step(x: jax.Array) -> jax.Array:
        return jax.numpy.tanh(x @ x)

    x = jax.numpy.ones((4, 4))
    module = profiling.parse_hlo(jax.jit(step).lower(x).compile().as_text())
    assert module.name == "jit_step"
    table = profiling.hlo_kernel_table(module)
    assert set(table.sites.values()) == set(range(len(table.kernels)))
    assert sum(k["count"] for k in table.kernels) == len(table.sites)
