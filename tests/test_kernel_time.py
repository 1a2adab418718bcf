"""A step's kernel time with overlapping intervals merged, split by kind, beside the step's wall time
(``compare.kernels.busy``; filled by ``torch_impl.profiling.summarize_events`` and ``jax_impl.profiling``).

Pure checks of the interval union, the record and the split; real profiles of a small eager torch step and a small
jitted JAX step on this machine's CPU; and controls on hand-made events: kernels that overlap (two CUDA streams,
two XLA:CPU pool threads) are busy for less than their summed time.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from compare.formats.codec import from_json, to_json
from compare.kernels import summary as ks
from compare.kernels.busy import CONSISTENT_MARGIN, SPLIT_GROUPS, KernelTime, merged_us, split

#: The profiled shapes: odd, so that no dimension is a vector width.
ROWS, DIM, HIDDEN = 257, 129, 131


def _kt(busy_us: float = 90.0, summed_us: float = 100.0) -> KernelTime:
    return KernelTime(
        busy_us=busy_us,
        summed_us=summed_us,
        by_kind_us={"gemm": 60.0, "fused": 10.0, "elementwise": 15.0, "reduction": 5.0, "copy": 7.0, "custom": 3.0},
        profiled_step_us=123.0,
        source="XLA trace",
    )


# ---- pure: the union, the record, the split ---------------------------------------------------------------------


@pytest.mark.quick
def test_merged_us_counts_overlaps_once() -> None:
    assert merged_us([]) == 0.0
    assert merged_us([(3.0, 10.5)]) == 7.5
    assert merged_us([(1.0, 4.0), (3.0, 9.0)]) == 8.0  # overlapping: [1, 9]
    assert merged_us([(1.0, 11.0), (3.0, 5.0), (7.0, 9.0)]) == 10.0  # nested: the outer one alone
    assert merged_us([(1.0, 2.5), (5.0, 8.0), (13.0, 17.0)]) == 1.5 + 3.0 + 4.0  # disjoint: the sum
    assert merged_us([(13.0, 17.0), (1.0, 3.0), (5.0, 8.0), (2.0, 6.0), (16.0, 19.0)]) == 7.0 + 6.0  # unsorted
    assert merged_us([(5.0, 7.0), (7.0, 11.0)]) == 6.0  # touching: one run, no gap
    assert merged_us([(3.0, 3.0), (3.0, 3.0)]) == 0.0  # instantaneous events
    assert merged_us(iter([(1.0, 4.0), (2.0, 3.0)])) == 3.0  # any iterable, read once


@pytest.mark.quick
def test_merged_us_refuses_a_reversed_interval() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        merged_us([(1.0, 2.0), (9.0, 5.0)])


@pytest.mark.quick
def test_kernel_time_round_trip() -> None:
    kt = _kt()
    d = to_json(kt)
    assert json.loads(json.dumps(d)) == d
    assert from_json(KernelTime, d) == kt and to_json(from_json(KernelTime, d)) == d
    bare = from_json(KernelTime, {"busy_us": 3, "summed_us": 5})  # optional fields absent: their defaults
    assert bare == KernelTime(3, 5) and bare.profiled_step_us is None and bare.by_kind_us == {}
    with pytest.raises(ValueError, match=r"by_kind_us\.gemm"):
        from_json(KernelTime, {**d, "by_kind_us": {"gemm": "fast"}})
    with pytest.raises(ValueError, match="busy_us"):
        from_json(KernelTime, {"summed_us": 5.0})


def _summary(kernel_time: dict[str, Any] | None) -> dict[str, Any]:
    kernels = [ks.kernel_entry("aten::mm", 2, time_us=40.0), ks.kernel_entry("aten::gelu", 1, time_us=7.0)]
    return ks.summary("torch.profiler", "cpu", kernels, [], steps=3, kernel_time=kernel_time)


@pytest.mark.quick
def test_summary_carries_kernel_time_and_old_summaries_still_load() -> None:
    kernels = _summary(None)["kernels"]
    entry = ks.kernel_time_entry(kernels, [(0.0, 30.0), (25.0, 40.0), (50.0, 57.0)], 1, 60.0, "torch.profiler CPU ops")
    assert entry == {
        "busy_us": 47.0,
        "summed_us": 47.0,
        "by_kind_us": {"gemm": 40.0, "elementwise": 7.0},
        "profiled_step_us": 60.0,
        "source": "torch.profiler CPU ops",
    }
    s = _summary(entry)
    ks.check_summary(s)
    k = from_json(ks.Kernels, s)
    assert k.kernel_time == from_json(KernelTime, entry)
    assert from_json(ks.Kernels, to_json(k)) == k and to_json(k)["kernel_time"] == entry
    assert "busy 47.0 us, summed 47.0 us, profiled step 60.0 us" in k.describe()

    old = _summary(None)
    del old["kernel_time"]  # a summary (or a result file's kernels) written before the field existed
    ks.check_summary(old)
    k_old = from_json(ks.Kernels, old)
    assert k_old.kernel_time is None and "kernel_time" not in to_json(k_old)  # written back as it was
    assert from_json(ks.Kernels, to_json(k_old)) == k_old


@pytest.mark.quick
def test_kernel_time_only_where_every_kernel_is_timed() -> None:
    untimed = [ks.kernel_entry("aten::mm", 1, time_us=40.0), ks.kernel_entry("aten::gelu", 1)]
    assert ks.kernel_time_entry(untimed, [(0.0, 40.0)], 1, None, "x") is None
    assert ks.kernel_time_entry([], [], 1, None, "x") is None
    with pytest.raises(ValueError, match="0 steps"):
        ks.kernel_time_entry(untimed, [], 0, None, "x")


@pytest.mark.quick
def test_check_summary_rejects_a_bad_kernel_time() -> None:
    good = to_json(_kt())
    with pytest.raises(ValueError, match="unknown kinds"):
        ks.check_summary(_summary({**good, "by_kind_us": {"matmul": 1.0}}))
    with pytest.raises(ValueError, match="busy_us"):
        ks.check_summary(_summary({k: v for k, v in good.items() if k != "busy_us"}))
    with pytest.raises(ValueError, match="negative"):
        ks.check_summary(_summary({**good, "busy_us": -1.0}))


@pytest.mark.quick
def test_consistent_flags_busy_time_beyond_the_wall_time() -> None:
    """The negative control: busy 30 % above the wall time is flagged, 5 % above is within the margin."""
    wall_s = 200e-6
    assert CONSISTENT_MARGIN == 0.10
    assert not _kt(busy_us=260.0).consistent(wall_s)
    assert _kt(busy_us=210.0).consistent(wall_s)
    assert _kt(busy_us=150.0).consistent(wall_s)
    assert not _kt(busy_us=210.0).consistent(wall_s, margin=0.01)  # a tighter margin flags it
    assert not _kt(busy_us=1.0).consistent(float("nan"))


@pytest.mark.quick
def test_split_shares_add_up_and_overhead_keeps_its_sign() -> None:
    kt = _kt(busy_us=90.0)
    out = split(kt, wall_s=150e-6)
    # shares of the kinds' summed times (100 us), applied to the merged busy time (90 us)
    assert out["gemm_share"] == pytest.approx(0.60) and out["gemm_s"] == pytest.approx(54e-6)
    assert out["fused_share"] == pytest.approx(0.10)
    assert out["unfused_share"] == pytest.approx(0.20)  # elementwise 15 + reduction 5
    assert out["collective_share"] == 0.0
    assert out["other_share"] == pytest.approx(0.10)  # copy 7 + custom 3
    assert sum(out[f"{g}_share"] for g in SPLIT_GROUPS) == pytest.approx(1.0)
    assert sum(out[f"{g}_s"] for g in SPLIT_GROUPS) == pytest.approx(out["busy_s"]) == pytest.approx(90e-6)
    assert out["overhead_s"] == pytest.approx(60e-6)
    over = split(kt, wall_s=80e-6)  # the profiled kernels took longer than the step did unprofiled
    assert over["overhead_s"] == pytest.approx(-10e-6)  # negative, not clamped
    empty = split(KernelTime(0.0, 0.0), wall_s=1e-3)
    assert all(empty[f"{g}_share"] == 0.0 for g in SPLIT_GROUPS) and empty["overhead_s"] == 1e-3


@pytest.mark.quick
def test_split_groups_hold_every_kind_once() -> None:
    grouped = [kind for kinds in SPLIT_GROUPS.values() for kind in kinds]
    assert sorted(grouped) == sorted(ks.KINDS)


# ---- controls on hand-made events: overlaps merged ----------------------------------------------------------------


@pytest.mark.quick
def test_overlapping_cuda_kernels_are_busy_for_less_than_their_sum() -> None:
    """Two kernels on two streams overlapping by 6 us in each of two steps: busy 14 us per step, summed 20."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from torch_impl import profiling

    events: list[FunctionEvent] = []

    def ev(name: str, start: float, end: float, *, cuda: str = "") -> None:
        events.append(
            FunctionEvent(
                len(events),
                name,
                thread=1,
                start_us=start,
                end_us=end,
                device_type=DeviceType.CUDA if cuda else DeviceType.CPU,
                is_user_annotation=name == profiling.STEP_NAME,
                activity_type=cuda or "cpu_op",
            )
        )

    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
    gelu = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
    for t0 in (0.0, 100.0):
        ev(profiling.STEP_NAME, t0, t0 + 50)
        ev(gemm, t0 + 5, t0 + 17, cuda="kernel")
        ev(gelu, t0 + 11, t0 + 19, cuda="kernel")  # another stream: starts before the GEMM ends
    s = profiling.summarize_events(events, "cuda:0")
    ks.check_summary(s)
    kt = s["kernel_time"]
    assert kt == {
        "busy_us": 14.0,
        "summed_us": 20.0,
        "by_kind_us": {"gemm": 12.0, "elementwise": 8.0},
        "profiled_step_us": 50.0,
        "source": "torch.profiler CUDA kernels",
    }
    assert split(from_json(KernelTime, kt), wall_s=60e-6)["gemm_s"] == pytest.approx(14e-6 * 12 / 20)


def _write_trace(path: Path, events: list[dict[str, Any]]) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


@pytest.mark.quick
def test_overlapping_xla_events_are_merged(tmp_path: Path) -> None:
    """A hand-made XLA trace of 2 steps: a GEMM and a tanh on two pool threads overlapping by 4 us each step."""
    from jax_impl import profiling

    def kernel(op: str, ts: float, dur: float, tid: int) -> dict[str, Any]:
        return {"ph": "X", "name": op, "ts": ts, "dur": dur, "tid": tid, "args": {"hlo_module": "m", "hlo_op": op}}

    events = []
    for t0 in (1000.0, 2000.0):
        events.append({"ph": "X", "name": profiling.STEP_NAME, "ts": t0, "dur": 40.0, "tid": 1})
        events += [kernel("dot", t0 + 3, 10.0, 2), kernel("tanh", t0 + 9, 5.0, 3)]
    events.append({"ph": "X", "name": "end: dot", "ts": 1013.0, "dur": 0.5, "tid": 2})  # no hlo_op: not a kernel
    trace = _write_trace(tmp_path / "t.trace.json.gz", events)
    read = profiling.trace_intervals(trace)
    assert read.kernels[("m", "dot")] == [(1003.0, 1013.0), (2003.0, 2013.0)]
    assert read.steps == [(1000.0, 1040.0), (2000.0, 2040.0)]
    assert profiling.trace_events(trace) == {("m", "dot"): [10.0, 10.0], ("m", "tanh"): [5.0, 5.0]}
    run = profiling.TracedRun(trace, profiling.trace_events(trace), read)
    kernels = [ks.kernel_entry("dot", 1, kind="gemm", time_us=10.0), ks.kernel_entry("tanh", 1, time_us=5.0)]
    kt, note = profiling.traced_kernel_time(kernels, [("m", "dot"), ("m", "tanh")], run, runs=2)
    assert kt is not None and note == ""
    assert (kt["busy_us"], kt["summed_us"], kt["profiled_step_us"]) == (11.0, 15.0, 40.0)
    # one step range missing: no profiled step time, said so; the busy time stands
    short = profiling.TracedRun(trace, run.events, profiling.TraceIntervals(read.kernels, read.steps[:1]))
    kt_short, note_short = profiling.traced_kernel_time(kernels, [("m", "dot"), ("m", "tanh")], short, runs=2)
    assert kt_short is not None and kt_short["profiled_step_us"] is None and kt_short["busy_us"] == 11.0
    assert note_short == f"no profiled step time: 1 '{profiling.STEP_NAME}' ranges in the trace for 2 steps"
    # a kernel untimed: no kernel time at all
    untimed = [kernels[0], {**kernels[1], "time_us": None}]
    assert profiling.traced_kernel_time(untimed, [("m", "dot")], run, runs=2) == (None, "")


# ---- real profiles on this machine's CPU --------------------------------------------------------------------------


@pytest.mark.standard
def test_torch_cpu_profile_has_a_kernel_time() -> None:
    """An eager MLP-like step (two matmuls around a GELU) under ``torch.profiler``: busy time from the leaf ops,
    within the profiled step's wall time, split into GEMMs and elementwise work."""
    import torch

    from torch_impl import profiling

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, DIM, generator=gen)
    w1 = torch.randn(DIM, HIDDEN, generator=gen)
    w2 = torch.randn(HIDDEN, DIM, generator=gen)

    def step() -> torch.Tensor:
        return torch.nn.functional.gelu(x @ w1) @ w2

    s = profiling.profile_step(step, lambda out: None, device="cpu", opaque=())
    ks.check_summary(s)
    print(ks.describe(s))
    kt = from_json(KernelTime, s["kernel_time"])
    assert kt.source == "torch.profiler CPU ops"
    assert kt.profiled_step_us is not None and kt.profiled_step_us > 0
    assert 0 < kt.busy_us <= kt.profiled_step_us * 1.05
    assert kt.busy_us <= kt.summed_us * (1 + 1e-9)  # a union is never longer than its parts
    assert kt.by_kind_us["gemm"] > 0 and kt.by_kind_us["elementwise"] > 0
    assert kt.summed_us == pytest.approx(sum(k["time_us"] for k in s["kernels"]))
    assert sum(kt.by_kind_us.values()) == pytest.approx(kt.summed_us)
    assert kt.consistent(kt.profiled_step_us * 1e-6)  # busy within the step's own wall time
    shares = split(kt, kt.profiled_step_us * 1e-6)
    assert shares["gemm_share"] > 0 and shares["unfused_share"] > 0 and shares["overhead_s"] >= 0


@pytest.mark.standard
@pytest.mark.compile
def test_jax_cpu_profile_has_a_kernel_time() -> None:
    """A jitted dot and tanh under XLA's trace. Where XLA:CPU leaves a kernel without events, the documented
    outcome is asserted instead: no kernel time, the reason in the notes."""
    import jax
    import jax.numpy as jnp

    from jax_impl import profiling

    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (ROWS, DIM))
    w = jax.random.normal(kw, (DIM, HIDDEN))

    @jax.jit
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    s = profiling.profile_jit(f, (x, w), lambda: f(x, w))
    ks.check_summary(s)
    print(ks.describe(s))
    if any(k["time_us"] is None for k in s["kernels"]):
        assert s["kernel_time"] is None and "no kernel times:" in s["notes"], s["notes"]
        return
    kt = from_json(KernelTime, s["kernel_time"])
    assert kt.source == "XLA trace"
    assert kt.profiled_step_us is not None, s["notes"]  # the step annotation is in the trace
    assert 0 < kt.busy_us <= kt.profiled_step_us * 1.05
    assert kt.busy_us <= kt.summed_us * (1 + 1e-9)
    assert kt.by_kind_us["gemm"] > 0
    assert sum(kt.by_kind_us.values()) == pytest.approx(kt.summed_us)
