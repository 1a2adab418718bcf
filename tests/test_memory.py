"""What a step holds in memory (issue 19): the tensors saved for the backward, counted from each framework, checked
against the cost model byte for byte; the peak with its source; the controls (item 5): a backend that secretly keeps
g and u shows exactly their bytes more, one that reports nothing is "not measured", never 0; the GPU readers on
scripted devices."""

from __future__ import annotations

from typing import Any

import pytest

from compare.backends.registry import register, spec, unregister
from compare.cost.model import cost
from compare.formats.codec import FieldError, from_json, to_json
from compare.problem.cases import preset
from compare.problem.golden import golden_for
from compare.results.document import Result
from compare.results.memory import NO_HOOK, Memory, Peak, Saved, SavedTensor, model_check
from compare.run.cell import plain_reference
from compare.run.harness import run_one
from compare.timing.timer import TimingConfig
from tests import memory_backends

pytestmark = pytest.mark.standard

CASE = preset("tiny").case("float32")


def measured(backend: str, mode: str = "fwd+bwd", case: Any = CASE, **kw: Any) -> Result:
    r = run_one(spec(backend), case, mode, plain_reference(case), TimingConfig(), {}, time_it=False, memory=True, **kw)
    assert r.status in ("ok", "deviates"), r.reason
    assert r.memory is not None
    return r


def _model_bytes(backend: str, names: tuple[str, ...], mode: str = "fwd+bwd") -> int:
    c = cost(CASE, backend, mode)
    return sum(t.bytes for t in c.tensors if t.name in names)


@pytest.mark.quick
def test_the_record_round_trips_and_never_reads_an_absent_figure_as_zero() -> None:
    m = Memory(
        Saved((SavedTensor("Mm", (2, 3), "float32", 24),), "hooks", "x"),
        peak=Peak(100, "profiler", {"events": 3}),
        peak_reason="",
    )
    assert from_json(Memory, to_json(m)) == m
    assert to_json(m)["saved"]["bytes"] == 24
    absent = Memory.not_measured("no hook")
    d = to_json(absent)
    assert "saved" not in d and "peak" not in d and d["saved_reason"] == "no hook"
    assert from_json(Memory, d) == absent
    with pytest.raises(ValueError, match="must say why"):
        Memory(None, "", None, "why")
    bad = to_json(m)
    bad["saved"]["bytes"] = 0
    with pytest.raises(FieldError, match=r"saved\.bytes: is 0, not 24 \(it follows from the other fields\)"):
        from_json(Memory, bad)


@pytest.mark.quick
def test_a_result_without_memory_is_written_as_before() -> None:
    r = Result.for_case("torch-eager", CASE, "fwd", "skipped", reason="x")
    assert "memory" not in to_json(r)
    assert from_json(Result, to_json(r)).memory is None


def test_torch_eager_saves_its_plan_byte_for_byte() -> None:
    r = measured("torch-eager")
    assert r.memory is not None and r.memory.saved is not None and r.memory.peak is not None
    assert r.memory.saved.bytes == _model_bytes("torch-eager", ("g", "u", "a", "h"))
    assert model_check(r.memory, r.cost).verdict == "= model"
    assert "profile_memory" in r.memory.peak.source
    # the peak holds at least what the forward saves (it is all live when the backward starts)
    assert r.memory.peak.bytes >= r.memory.saved.bytes


def test_a_backend_that_secretly_keeps_g_and_u_shows_exactly_their_bytes_more() -> None:
    register(memory_backends.HOARDER)
    try:
        hoarder = measured("hoarder")
    finally:
        unregister("hoarder")
    eager = measured("torch-eager")
    assert hoarder.memory is not None and hoarder.memory.saved is not None
    assert eager.memory is not None and eager.memory.saved is not None
    g_and_u = _model_bytes("torch-eager", ("g", "u"))
    assert hoarder.memory.saved.bytes - eager.memory.saved.bytes == g_and_u
    check = model_check(hoarder.memory, hoarder.cost)
    assert check.verdict == "differs" and check.finding and check.difference == g_and_u
    assert f"+{g_and_u:,} B" in check.text


def test_a_backend_without_a_memory_hook_is_not_measured_never_zero() -> None:
    r = measured("torch-eager", prepare=lambda: memory_backends.silent(golden_for(CASE).problem, "fwd+bwd"))
    assert r.memory is not None
    assert r.memory.saved is None and r.memory.peak is None
    assert r.memory.saved_reason == NO_HOOK == r.memory.peak_reason
    check = model_check(r.memory, r.cost)
    assert check.verdict == "not measured" and check.difference is None and NO_HOOK in check.text


def test_an_inference_forward_keeps_nothing_measured() -> None:
    r = measured("torch-eager", "fwd")
    assert r.memory is not None and r.memory.saved is not None
    assert r.memory.saved.tensors == () and "no_grad" in r.memory.saved.source
    assert model_check(r.memory, r.cost).verdict == "= model"


def test_torch_compile_saves_g_u_h_as_its_plan() -> None:
    r = measured("torch-compile")
    assert r.memory is not None and r.memory.saved is not None
    assert r.memory.saved.bytes == _model_bytes("torch-compile", ("g", "u", "h"))


def test_jax_residuals_are_counted_two_ways_and_checked_against_the_plan() -> None:
    unfused = measured("jax-unfused")
    assert unfused.memory is not None and unfused.memory.saved is not None
    assert unfused.memory.saved.cross_check.startswith("agrees")
    assert model_check(unfused.memory, unfused.cost).verdict == "= model"
    xla = measured("jax-xla")
    assert xla.memory is not None and xla.memory.saved is not None and xla.memory.peak is not None
    assert xla.memory.saved.cross_check.startswith("agrees")
    assert "memory_analysis" in xla.memory.peak.source and "temp_bytes" in xla.memory.peak.detail
    # whatever XLA's jaxpr keeps, the check states it against the plan: equal, or a finding naming the bytes
    check = model_check(xla.memory, xla.cost)
    want = _model_bytes("jax-xla", ("g", "u", "h"))
    assert (check.verdict == "= model") == (xla.memory.saved.bytes == want)
    assert check.difference == xla.memory.saved.bytes - want
    assert unfused.memory.peak is None and "op-by-op" in unfused.memory.peak_reason


class _ScriptedCuda:
    """The CUDA allocator's counters (``torch_impl.memory.CudaMemory``): ``before`` allocated, the step ``extra``
    more at its most, a peak that only a reset brings back down."""

    def __init__(self, before: int, extra: int) -> None:
        self.before, self.extra, self.peak, self.resets = before, extra, before + 10 * extra, 0

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak = self.before

    def allocated(self) -> int:
        return self.before

    def max_allocated(self) -> int:
        return self.peak

    def synchronize(self) -> None:
        self.peak = max(self.peak, self.before + self.extra) if self.resets else self.peak


@pytest.mark.quick
def test_a_cuda_step_reads_its_peak_from_the_allocator_after_a_reset() -> None:
    import torch

    from torch_impl import memory as torch_memory

    w = torch.randn(8, 4, requires_grad=True)
    x = torch.randn(3, 4, requires_grad=True)
    cuda = _ScriptedCuda(before=1000, extra=256)
    got = torch_memory.record("fwd+bwd", "cuda:0", lambda: None, lambda: torch.relu(x @ w.T), [x, w], cuda)  # type: ignore[arg-type]
    peak = from_json(Peak, got["peak"])
    # without the reset the stale peak (10 x more) would be read: the reset makes it the step's own
    assert cuda.resets == 1 and peak.bytes == 256 and "max_memory_allocated" in peak.source
    saved = from_json(Saved, got["saved"])  # relu saves its output, the matmul its inputs (x, w: left out)
    assert [t.label for t in saved.tensors] == ["Relu"] and saved.bytes == 3 * 8 * 4


@pytest.mark.quick
def test_a_jax_gpu_peak_is_the_device_s_peak_above_what_was_in_use_a_bound() -> None:
    from jax_impl import memory as jax_memory

    class Device:
        platform = "gpu"
        ran = False

        def memory_stats(self) -> dict[str, int]:
            return {"bytes_in_use": 500, "peak_bytes_in_use": 500 + (300 if self.ran else 0)}

    dev = Device()

    def step() -> int:
        dev.ran = True
        return 0

    got = jax_memory.device_peak(step, lambda outs: None, dev)
    assert got is not None
    peak = from_json(Peak, got)
    assert peak.bytes == 300 and peak.bound is True and "memory_stats" in peak.source


def test_a_remat_backend_saves_less_than_its_twin_and_its_kernels_show_the_recompute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(memory_backends.MODE_ENV, "remat")
    register(memory_backends.REMAT)
    try:
        remat = measured("remat-control", profile=True)
    finally:
        unregister("remat-control")
    eager = measured("torch-eager", profile=True)
    assert remat.memory is not None and remat.memory.saved is not None
    assert eager.memory is not None and eager.memory.saved is not None
    assert remat.memory.saved.bytes < eager.memory.saved.bytes
    assert remat.memory.saved.bytes == 0  # the whole MLP recomputed: only its input (not counted) is kept
    assert remat.kernels is not None and eager.kernels is not None
    # the forward's kernels run again in the backward: its two GEMMs (gate, up), GELU and mul, down
    assert remat.kernels.kernels_per_step > eager.kernels.kernels_per_step
    assert remat.kernels.count_by_kind().get("gemm", 0) > eager.kernels.count_by_kind().get("gemm", 0)


def test_a_copy_kept_outside_autograd_shows_in_the_allocator_s_cross_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory_backends.MODE_ENV, "stash")
    register(memory_backends.HOARDER)
    try:
        stash = measured("hoarder")
    finally:
        unregister("hoarder")
        memory_backends.STASH.clear()
    eager = measured("torch-eager")
    assert stash.memory is not None and stash.memory.saved is not None
    assert eager.memory is not None and eager.memory.saved is not None
    assert stash.memory.saved.bytes == eager.memory.saved.bytes  # the hooks see what autograd saves, no more
    assert eager.memory.saved.cross_check.startswith("agrees with the allocator")
    g = _model_bytes("torch-eager", ("g",))
    assert stash.memory.saved.cross_check.startswith("DIFFERS from the allocator")
    assert f"({g:+,} B held outside autograd's saved tensors" in stash.memory.saved.cross_check


def test_the_memory_reading_keeps_the_profilers_chatter_off_the_terminal(capfd: pytest.CaptureFixture[str]) -> None:
    """The allocator events are read under ``torch.profiler``, whose Kineto notices (``USDT:... profiler_start``)
    reach fd 2 below Python; the memory reader filters them as the kernel profile does. The control: the same
    profiler, unfiltered, writes them (where this torch build writes none, the control says so and skips)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from torch_impl import memory as torch_memory

    capfd.readouterr()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        torch.ones(8) + 1
    if "profiler_st" not in capfd.readouterr().err:
        pytest.skip("this torch's profiler writes no start/stop notices to stderr: nothing to filter")
    peak = torch_memory.cpu_peak(lambda: torch.ones(8) + 1)
    assert peak and "profiler_st" not in capfd.readouterr().err


def _held_after_prepare(prepare: Any, case: Any) -> list[str]:
    """What of the :class:`Problem` ``prepare(problem, mode)`` (a backend's) was given is still alive once the call
    returned and the caller dropped it: the problem itself, and each of its weight arrays by name."""
    import gc
    import weakref

    problem = golden_for(case).problem
    refs = {"the problem": weakref.ref(problem), **{k: weakref.ref(v) for k, v in problem.params.items()}}
    prepared = prepare(problem, "fwd+bwd")
    del problem
    gc.collect()
    held = [k for k, r in refs.items() if r() is not None]
    del prepared
    return held


MODULE_BACKENDS = ("torch-module", "torch-module-compile", "jax-module", "jax-module-unfused")


@pytest.mark.parametrize("name", ["torch-eager", "torch-compile", "jax-xla", "jax-unfused", *MODULE_BACKENDS])
def test_a_prepared_step_does_not_hold_the_weights_it_was_given(name: str) -> None:
    """Each backend gets its own float32 copy of the weights (``Golden.problem``): a closure that kept the problem
    kept the copy, 4 bytes an element per backend beside the framework's own tensors in the dtype (five module
    backends of a Llama 2048 -> 8192 layer: 1 GB of a 4.9 GB peak). In bfloat16 every framework makes its own
    tensors, so none may stay alive."""
    import compare

    if name in MODULE_BACKENDS:
        case = compare.module_case("examples/llama_mlp.py", 64, 96, "bfloat16", batch=1, seq=16)
    else:
        case = preset("tiny").case("bfloat16")
    assert _held_after_prepare(spec(name).load().prepare, case) == []


def test_a_step_that_holds_its_problem_is_caught() -> None:
    """The negative control of the test above: a backend whose step closes over ``problem``."""
    from dataclasses import replace

    eager = spec("torch-eager").load()

    def holding(problem: Any, mode: str) -> Any:
        prepared = eager.prepare(problem, mode)
        step = prepared.step
        return replace(prepared, step=lambda: (problem, step())[1])

    case = preset("tiny").case("bfloat16")
    assert _held_after_prepare(holding, case) == ["the problem", *golden_for(case).params]


def test_the_harness_s_sync_does_not_hold_the_step() -> None:
    """The harness ends every call with ``harness_sync``'s function, which the cell keeps after its step is released:
    it held the whole ``Prepared``: at a Llama 2048 -> 8192 layer, the five module steps' weights (0.5 GB) were
    still alive when the fresh draw's reference was computed."""
    import gc
    import weakref

    from compare.run import pipeline

    s = spec("torch-eager")
    prepared = s.load().prepare(golden_for(CASE).problem, "fwd")
    alive = weakref.ref(prepared)
    sync = pipeline.harness_sync(s, prepared)
    del prepared
    gc.collect()
    assert alive() is None
    assert callable(sync)
