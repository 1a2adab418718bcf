"""The report's memory (issue 19, item 4): the memory table per case, dtype and mode, the check against the cost
model, the summary's memory line (fusion's saving, recomputation's saving and its time under the noise rule), and
a document without memory rendering as before. Pure functions of hand-made documents."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compare.backends.registry import BackendSpec, register, unregister
from compare.cli.main import main
from compare.cost.model import cost
from compare.formats.codec import to_json
from compare.problem.cases import InputError, preset
from compare.report.diff import diff
from compare.report.memory import linear_fit, memory_line, memory_section
from compare.report.render import render
from compare.report.summary import summary_section
from compare.results.document import Result, Results
from compare.results.memory import NO_HOOK, Memory, Peak, Saved, SavedTensor, parse_size
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
        cost=cost(CASE, "torch-eager" if backend.startswith("remat") else backend, "fwd+bwd"),
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


def _doc(*rows: Result) -> Results:
    return Results(created="now", results=rows)


def test_diff_flags_any_increase_of_saved_bytes_and_a_peak_beyond_its_bound(tmp_path: Path) -> None:
    old = _doc(_row("torch-eager", _mem(4, peak=10 * TH)), _row("torch-compile", _mem(3, peak=10 * TH)))
    same, regressed = diff(old, old)[1], diff(old, _doc(_row("torch-eager", _mem(5)), _row("torch-compile", _mem(3))))
    assert same is False
    md, bad = regressed
    assert bad is True and f"saved: regression, +{TH:,} B" in md and "1 memory regressions" in md
    assert (
        diff(old, _doc(_row("torch-eager", _mem(5)), _row("torch-compile", _mem(3))), memory_tolerance=TH)[1] is False
    )
    # the peak: a bound with its tolerance, compared only between figures of one source
    up = _doc(_row("torch-eager", _mem(4, peak=11 * TH)), _row("torch-compile", _mem(3, peak=10 * TH)))
    md, bad = diff(old, up)
    assert bad is True and "peak: regression, +10.0%" in md
    assert diff(old, up, peak_tolerance=0.2)[1] is False
    # measured on one side only: not compared, never a pass or a regression by a 0
    md, bad = diff(old, _doc(_row("torch-eager", Memory.not_measured(NO_HOOK)), _row("torch-compile", _mem(3))))
    assert bad is False and "saved: not compared (measured on one side only)" in md
    # through the command: exit 1 on the regression, 2 on a tolerance that is not a size
    (tmp_path / "old.json").write_text(json.dumps(to_json(old)))
    (tmp_path / "new.json").write_text(json.dumps(to_json(up)))
    assert main(["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 1
    assert main(["diff", str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 0
    assert main(["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--memory-tolerance", "lots"]) == 2


def test_a_diff_without_memory_has_no_memory_section() -> None:
    doc = _doc(_row("torch-eager", None))
    assert "## Memory" not in diff(doc, doc)[0]


def test_sizes_parse_with_their_units_and_refuse_anything_else() -> None:
    assert parse_size("80GiB", "--x") == 80 << 30 and parse_size("512MiB", "--x") == 512 << 20
    assert parse_size("1.5GB", "--x") == 1_500_000_000 and parse_size("4096", "--x") == 4096
    for bad in ("80 gigs", "-1GiB", "", "nan", "GiB"):
        with pytest.raises(InputError, match=r"--x: .* is not a size"):
            parse_size(bad, "--x")


def test_the_fit_states_its_line_residual_and_largest_token_count() -> None:
    f = linear_fit("saved", [(1, 110), (2, 190), (4, 410)], device_memory=1000)
    assert f.slope == pytest.approx(100.0, rel=0.05) and f.max_residual > 0
    assert f.largest_tokens == int((1000 - f.intercept) // f.slope)
    assert linear_fit("saved", [(1, 100), (2, 200)]).largest_tokens is None  # no device memory given
    with pytest.raises(ValueError, match="two token counts"):
        linear_fit("saved", [(4, 100), (4, 100)])


def test_the_fwd_line_says_what_inference_forwards_keep_from_the_measurements() -> None:
    rows = [replace(_row("torch-eager", _mem(0)), mode="fwd"), replace(_row("torch-compile", _mem(0)), mode="fwd")]
    assert memory_line(rows).startswith("memory: no inference forward keeps anything")
    rows[1] = replace(rows[1], memory=_mem(1))
    assert (
        memory_line(rows) == f"memory: inference forwards that keep tensors alive: torch-compile {TH / 2**20:.4g} MiB"
    )


def test_a_second_count_that_differs_is_shown_and_listed() -> None:
    m = _mem(4)
    assert m.saved is not None
    differs = replace(m, saved=replace(m.saved, cross_check="DIFFERS from the allocator: 5 B more"))
    agrees = replace(m, saved=replace(m.saved, cross_check="agrees with the allocator: 4 B"))
    text = memory_section(Results(results=(_row("torch-eager", differs), _row("torch-compile", agrees))))
    eager = next(line for line in text.splitlines() if line.startswith("| torch-eager"))
    compiled = next(line for line in text.splitlines() if line.startswith("| torch-compile"))
    assert "**cross-check differs**" in eager and "cross-check agrees" in compiled
    assert "torch-eager, " in text.split("**Findings**")[1] and "5 B more" in text.split("**Findings**")[1]
