"""The report's memory (issue 19, item 4): the memory table per case, dtype and mode, the check against the cost
model, the summary's memory line (fusion's saving, recomputation's saving and its time under the noise rule), and
a document without memory rendering as before. Pure functions of hand-made documents."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compare.backends.registry import BackendSpec, register, unregister
from compare.cost import model as costmodel
from compare.problem.cases import preset
from compare.report.memory import memory_line, memory_section
from compare.report.render import render
from compare.report.summary import summary_section
from compare.results.document import Result, Results
from compare.results.memory import NO_HOOK, Memory, Peak, Saved, SavedTensor
from compare.timing.timer import Timing

pytestmark = pytest.mark.quick

CASE = preset("tiny").case("float32")
TH = CASE.shape.tokens * CASE.shape.hidden * 4  # one [tokens, hidden] float32 tensor


def _timing(median: float, spread: float = 0.0) -> Timing:
    samples = tuple(median * (1 + spread * ((i % 5) - 2) / 2) for i in range(20))
    return Timing(median, max(samples) - min(samples), min(samples), max(samples), 20, 1, median, 3, samples)


def _mem(n: int, peak: int | None = 10 * TH) -> Memory:
    saved = Saved(
        tuple(SavedTensor("t", (CASE.shape.tokens, CASE.shape.hidden), "float32", TH) for _ in range(n)),
        "hooks saved_tensors_hooks",
    )
    if peak is None:
        return Memory(saved, peak_reason="no reader here")
    return Memory(saved, peak=Peak(peak, "torch.profiler profile_memory"))


def _row(backend: str, memory: Memory | None, median: float = 1e-3, spread: float = 0.0, status: str = "ok") -> Result:
    return Result.for_case(
        backend,
        CASE,
        "fwd+bwd",
        status,
        timing=_timing(median, spread),
        cost=costmodel.cost(CASE, "torch-eager" if backend.startswith("remat") else backend, "fwd+bwd"),
        memory=memory,
    )


def test_a_document_without_memory_renders_no_memory_section_or_line() -> None:
    doc = Results(results=(_row("torch-eager", None), _row("torch-compile", None)))
    assert memory_section(doc) == ""
    assert "emory" not in summary_section(doc)
    assert "## Memory" not in render(doc)


def test_the_table_checks_each_backend_against_its_plan_and_names_a_finding() -> None:
    doc = Results(
        results=(
            _row("torch-eager", _mem(4)),  # g, u, a, h: the eager plan
            _row("torch-compile", _mem(5)),  # one more than g, u, h: a finding of +2 tensors' bytes
            _row("torch-triton", Memory.not_measured(NO_HOOK)),
        )
    )
    text = memory_section(doc)
    assert "## Memory" in text
    eager = next(line for line in text.splitlines() if line.startswith("| torch-eager"))
    assert "= model" in eager and "4 tensors" in eager
    compiled = next(line for line in text.splitlines() if line.startswith("| torch-compile"))
    assert f"+{2 * TH:,} B" in compiled
    triton = next(line for line in text.splitlines() if line.startswith("| torch-triton"))
    assert f"not measured ({NO_HOOK})" in triton and "0 MiB" not in triton
    assert "**Findings**" in text and "torch-compile" in text.split("**Findings**")[1]


def test_the_summary_line_says_what_fusion_keeps_out_of_memory() -> None:
    rows = [_row("torch-eager", _mem(4)), _row("torch-compile", _mem(3)), _row("torch-triton-fused", _mem(1))]
    line = memory_line(rows)
    assert line.startswith("memory: fusion keeps ")
    assert f"{3 * TH / 2**20:.4g} MiB" in line and "torch-triton-fused" in line and "75%" in line
    # a failing backend's memory is no saving
    rows[2] = replace(rows[2], status="parity-fail")
    assert "torch-compile" in memory_line(rows) and "25%" in memory_line(rows)


@pytest.fixture
def remat() -> object:
    register(
        BackendSpec(
            name="remat-twin", framework="torch", target="tests.memory_backends", about="x", remat_of="torch-eager"
        )
    )
    yield
    unregister("remat-twin")


def test_recomputation_states_its_saving_and_its_time_under_the_noise_rule(remat: object) -> None:
    base = _row("torch-eager", _mem(4), median=1e-3)
    slower = _row("remat-twin", _mem(0), median=1.5e-3)
    line = memory_line([base, slower])
    assert f"recomputation saves {4 * TH / 2**20:.4g} MiB for +500 us a step" in line.replace("µs", "us")
    noisy = _row("remat-twin", _mem(0), median=1.01e-3, spread=0.5)
    assert "recomputation saves" in memory_line([base, noisy]) and "within noise in time" in memory_line([base, noisy])


def test_an_unmeasured_baseline_is_said_not_zero() -> None:
    rows = [_row("torch-eager", Memory.not_measured(NO_HOOK)), _row("torch-compile", _mem(3))]
    assert "not compared" in memory_line(rows)
