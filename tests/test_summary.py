"""The report opens with the answer: parity with the gate's resolution, the fastest backend (significant or within
noise), and the fusion headroom next to what fused backends saved. Built from a hand-written document."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from compare.cost.model import cost
from compare.formats.codec import from_json, to_json
from compare.gate import resolution
from compare.gate.parity import Plain
from compare.kernels import summary as ks
from compare.problem.cases import Case, Shape
from compare.problem.reference import round_to_dtype
from compare.report.cost import fusion_benefit, fusion_section
from compare.report.render import files
from compare.report.resolution import resolution_section
from compare.report.summary import summary_section
from compare.results.document import Results
from compare.timing.significance import MIN_PAIRS
from compare.timing.timer import quartiles

pytestmark = pytest.mark.quick

SHAPE = {"batch": 3, "seq": 37, "dim": 96, "hidden": 328}


def _timing(median: float, spread: float = 0.01) -> dict[str, Any]:
    samples = [median * (1 + spread * (i - 5) / 5) for i in range(11)]
    return {
        "median_s": median,
        "iqr_s": median * spread,
        "min_s": min(samples),
        "max_s": max(samples),
        "n": 11,
        "calls_per_sample": 1,
        "first_call_s": median,
        "warmup_calls": 3,
        "samples_s": samples,
        "noisy": False,
    }


def _row(
    backend: str,
    median: float | None,
    status: str = "ok",
    failed: tuple[str, ...] = (),
    kernels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    parity = {
        "passed": status == "ok",
        "tier": {"ok": "pass", "deviates": "deviates"}.get(status, "fail"),
        "failed": list(failed),
        "tensors": [],
        "max_abs_err": 0.0,
        "max_rel_err": 0.0,
        "bound": 1.0,
        "ratio": 0.0,
        "worst_tensor": "y",
    }
    return {
        "backend": backend,
        "model": "geglu",
        "dtype": "bfloat16",
        "shape": SHAPE,
        "case": "c",
        "mode": "fwd",
        "status": status,
        "reason": "",
        "note": "",
        "device": "cpu",
        "parity": parity,
        "timing": _timing(median) if median else None,
        "threads": {},
        "kernels": kernels,
        "cost": None,
        "extras": {},
    }


def _doc(fast: float) -> Results:
    eager_kernels = ks.summary(
        "torch.profiler",
        "cpu",
        [
            ks.kernel_entry("aten::mm", 3, time_us=900.0),
            ks.kernel_entry("aten::gelu", 1, time_us=60.0),
            ks.kernel_entry("aten::mul", 1, time_us=40.0),
        ],
        [],
        steps=3,
    )
    results = [
        _row("torch-eager", 1e-3, kernels=eager_kernels),
        _row("torch-compile", fast),
        _row("jax-xla", 2e-3, status="parity-fail", failed=("y:scale",)),
    ]
    resolution = [
        {
            "case": "c",
            "model": "geglu",
            "label": "geglu 3x37x96->328",
            "dtype": "bfloat16",
            "tensor": "y",
            "n": 10656,
            "scale_resolution": 0.0022,
            "note": "",
            "erf_distinguishable": False,
            "erf_failed": [],
            "erf_rel_rms": 2e-4,
            "erf_scale_err": 1e-5,
        }
    ]
    return from_json(Results, {"results": results, "resolution": resolution, "environment": {}, "config": {}})


def test_summary_line_says_parity_resolution_fastest_and_headroom() -> None:
    text = summary_section(_doc(fast=0.5e-3))
    assert "**geglu 3x37x96->328 bfloat16 fwd**" in text
    assert "parity **FAIL**: jax-xla (y:scale); 2 other(s) pass" in text
    assert "catches a scale error of 0.22% on y; erf vs tanh GELU not distinguishable" in text
    assert "Fastest: torch-compile 500 us, 2.00x torch-eager (significant; separate windows, unpaired)" in text
    # per framework: torch's own baseline; jax-xla fails and jax's baseline did not run, so jax has no headroom
    assert "Fusion headroom: torch: 10% of torch-eager's kernel time (100 us a step); jax: not measured" in text


def test_a_tensor_too_large_to_bisect_has_its_resolution_said_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``MAX_ELEMENTS`` the bisection is not run (a real layer's weight gradients took it past 15 minutes): the
    row says so, the details' table says so, and the summary claims no resolution rather than "no scale error"."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((7, 11))
    plain = Plain({"y": round_to_dtype(ref * (1 + 1e-3 * rng.standard_normal(ref.shape)), "bfloat16")})
    x, twin = np.zeros((1, 1, 3)), {"y": ref * (1 + 1e-3 * rng.standard_normal(ref.shape))}
    rows = {}
    for cap in (ref.size, ref.size - 1):
        monkeypatch.setattr(resolution, "MAX_ELEMENTS", cap)
        (rows[cap],) = resolution.resolution_rows("c", "module", "module 1x7x3->11", "bfloat16", (x, {}, x), {"y": ref},
                                                  plain, ["y"], lambda *_: twin)  # fmt: skip
    measured, big = rows[ref.size], rows[ref.size - 1]
    assert measured.scale_resolution is not None and measured.note != resolution.NOT_MEASURED
    assert big.scale_resolution is None and big.note == resolution.NOT_MEASURED
    assert "| not measured: more than" in resolution_section([big]) and "none (" not in resolution_section([big])
    doc = _doc(fast=0.5e-3)
    doc = replace(doc, resolution=(replace(big, case=doc.resolution[0].case, tensor="y"),))
    text = summary_section(doc)
    assert "parity **FAIL**: jax-xla (y:scale); 2 other(s) pass" in text and "scale error" not in text


def test_a_difference_within_noise_is_not_a_speedup() -> None:
    text = summary_section(_doc(fast=0.995e-3))
    assert "Fastest: torch-compile 995 us, within noise of torch-eager (separate windows, unpaired)" in text
    assert "x torch-eager" not in text


def test_the_report_opens_with_the_summary() -> None:
    report, details = files(_doc(fast=0.5e-3)).values()
    assert report.index("## Summary") < report.index("## Details") and "## Parity" not in report
    assert details.index("## Environment") < details.index("## Parity")


# ---- what fusion saved, within a framework ----------------------------------------------------------------------

CASE = Case("geglu", Shape(**SHAPE), "bfloat16")


def _profiled(gemm_us: float, other_us: float, *, timed: bool = True) -> dict[str, Any]:
    """A kernel table: three GEMMs and the elementwise rest, with times per step (or none: counted, not timed)."""
    return ks.summary(
        "xla-hlo",
        "cpu",
        [
            ks.kernel_entry("ynn_fusion", 3, kind="gemm", time_us=gemm_us if timed else None),
            ks.kernel_entry("wrapped_multiply", 2, kind="elementwise", time_us=other_us if timed else None),
        ],
        [],
    )


def _costed(backend: str, median: float, status: str = "ok", kernels: dict[str, Any] | None = None) -> dict[str, Any]:
    r = _row(backend, median, status=status, kernels=kernels)
    r["cost"] = to_json(cost(CASE, backend, "fwd"))
    return r


def _frameworks(
    *, jax_xla: str = "ok", jax_unfused: str = "ok", xla_kernels: bool = True, unfused_kernels: bool = True
) -> Results:
    """torch-eager 1 ms (GEMMs 900 us, the rest 100 us) and torch-compile 0.9 ms (880 + 20 us); jax-unfused 3 ms
    (2 ms + 500 us: slower GEMMs, more dispatch) and jax-xla 0.2 ms (150 + 30 us). Across frameworks jax-xla is 5x
    torch-eager: GEMM libraries, not fusion."""
    results = [
        _costed("torch-eager", 1e-3, kernels=_profiled(900.0, 100.0)),
        _costed("torch-compile", 0.9e-3, kernels=_profiled(880.0, 20.0)),
        _costed("jax-unfused", 3e-3, status=jax_unfused, kernels=_profiled(2000.0, 500.0, timed=unfused_kernels)),
        _costed("jax-xla", 0.2e-3, status=jax_xla, kernels=_profiled(150.0, 30.0, timed=xla_kernels)),
    ]
    return from_json(Results, {"results": results, "environment": {}, "config": {}})


def _fusion_row(doc: Results, backend: str) -> dict[str, Any]:
    (row,) = [f for f in fusion_benefit(doc) if f["backend"] == backend]
    return row


def _headroom_text(doc: Results) -> str:
    return summary_section(doc).split("Fusion headroom: ")[-1].split("\n")[0]


def test_each_backend_is_measured_against_its_own_framework_baseline() -> None:
    doc = _frameworks()
    rows = fusion_benefit(doc)
    assert {(f["backend"], f["baseline"]) for f in rows} == {
        ("torch-compile", "torch-eager"),
        ("jax-xla", "jax-unfused"),
    }
    xla = _fusion_row(doc, "jax-xla")
    assert xla["measured_saved_s"] == pytest.approx(2.8e-3) and xla["measured_verdict"] == "faster"
    assert xla["not_measured"] == "" and xla["baseline_median_s"] == 3e-3
    # never jax-xla against torch-eager (0.8 ms "saved" by a faster GEMM library), in the rows or the summary
    assert all(f["baseline_median_s"] != 1e-3 for f in rows if f["backend"].startswith("jax"))
    head = _headroom_text(doc)
    assert "jax-xla 800 us" not in head and "jax-xla" not in head.split("; jax: ")[0]
    assert "| jax-xla | jax-unfused |" in fusion_section(doc)


def test_the_split_into_gemm_time_and_the_rest() -> None:
    doc = _frameworks()
    comp = _fusion_row(doc, "torch-compile")
    assert comp["gemm_time_saved_s"] == pytest.approx(20e-6) and comp["outside_gemm_saved_s"] == pytest.approx(80e-6)
    assert comp["baseline_outside_gemm_s"] == pytest.approx(100e-6)
    xla = _fusion_row(doc, "jax-xla")
    assert xla["gemm_time_saved_s"] == pytest.approx(1850e-6) and xla["outside_gemm_saved_s"] == pytest.approx(470e-6)
    # not profiled with a time per kernel: no split, whatever the median says
    bare = _fusion_row(_frameworks(xla_kernels=False), "jax-xla")
    assert bare["gemm_time_saved_s"] is None and bare["outside_gemm_saved_s"] is None
    assert bare["measured_saved_s"] == pytest.approx(2.8e-3)


def test_a_saving_beyond_the_baselines_time_outside_gemms_says_why() -> None:
    head = _headroom_text(_frameworks())
    # torch-compile saved 100 us, all of torch-eager's 100 us outside GEMMs: a plain number
    assert "torch: 10% of torch-eager's kernel time (100 us a step), saved: torch-compile 100 us;" in head
    # jax-xla saved 2.8 ms where jax-unfused spends 500 us outside GEMMs: the rest is GEMMs and dispatch
    assert "jax: 20% of jax-unfused's kernel time (500 us a step), saved: jax-xla 2.8 ms (more than the 500 us " in head
    assert "of which GEMMs 1.85 ms, other kernels 470 us, outside any kernel 480 us)" in head
    # without jax-xla's kernel times: said to be beyond fusion, not split
    unsplit = _headroom_text(_frameworks(xla_kernels=False))
    assert "jax-xla 2.8 ms (more than the 500 us jax-unfused spends outside GEMMs: the rest is not fusion" in unsplit
    # without the baseline's: no headroom, and the saving is the medians' difference only
    untimed = _headroom_text(_frameworks(unfused_kernels=False))
    assert "jax: not measured (jax-unfused not profiled with kernel times" in untimed
    assert "saved (medians only, unsplit): jax-xla 2.8 ms" in untimed


def test_a_failing_backend_or_baseline_has_no_measured_saving() -> None:
    doc = _frameworks(jax_xla="parity-fail")
    xla = _fusion_row(doc, "jax-xla")
    assert xla["not_measured"] == "failed parity"
    assert xla["measured_saved_s"] is None and xla["measured_verdict"] is None and xla["gemm_time_saved_s"] is None
    assert "jax: 20% of jax-unfused's kernel time (500 us a step), saved: jax-xla not measured (failed parity)" in (
        _headroom_text(doc)
    )
    assert "| jax-xla | jax-unfused |" in fusion_section(doc) and "- (failed parity)" in fusion_section(doc)

    doc = _frameworks(jax_unfused="parity-fail")
    xla = _fusion_row(doc, "jax-xla")
    assert xla["not_measured"] == "baseline failed parity" and xla["measured_saved_s"] is None
    assert xla["baseline_outside_gemm_s"] is None
    head = _headroom_text(doc)
    assert "jax: not measured (jax-unfused failed parity)." in head and "jax-xla" not in head
    # the other framework is untouched
    assert _fusion_row(doc, "torch-compile")["measured_saved_s"] == pytest.approx(1e-4)


# ---- claims no stronger than their statistics ------------------------------------------------------------------

CEILINGS = {
    "device": "cpu",
    "bfloat16": {
        "flops_per_s": 1e14,
        "bytes_per_s": 1e11,
        "matmul_shape": [1024] * 3,
        "copy_bytes": 2**28,
        "timing": {"matmul": {"median_s": 2e-3, "iqr_s": 0.0}, "copy": {"median_s": 5e-3, "iqr_s": 0.0}},
    },
}


def _paired(median: float, rounds: int, seed: int) -> dict[str, Any]:
    """A timing of one interleaved group (``rounds`` rounds, group ``c/fwd#t``): ``median`` times a jitter of up to
    +-2%, symmetric (the median is ``median``) and shuffled by ``seed`` (two seeds pair up unlike signs)."""
    jitter = [0.02 * (2 * i / (rounds - 1) - 1) for i in range(rounds)]
    random.Random(seed).shuffle(jitter)
    samples = [median * (1 + j) for j in jitter]
    q1, med, q3 = quartiles(sorted(samples))
    return {
        **_timing(med),
        "iqr_s": q3 - q1,
        "min_s": min(samples),
        "max_s": max(samples),
        "n": rounds,
        "samples_s": samples,
        "design": "interleaved",
        "group": "c/fwd#t",
        "rounds": list(range(rounds)),
    }


def _timed_together(rounds: int, medians: dict[str, float], ceilings: bool = True, **status: str) -> Results:
    """One case and mode whose backends (``medians``, seconds) were timed together for ``rounds`` rounds; a backend
    named in ``status`` gets that status (``deviates`` with a deviation on ``y``)."""
    rows = []
    for i, (backend, median) in enumerate(medians.items()):
        r = _row(backend, median, status=status.get(backend, "ok"))
        r["timing"] = _paired(median, rounds, seed=i)
        if r["status"] == "deviates":
            r["parity"]["deviated"] = ["y"]
        rows.append(r)
    return from_json(
        Results, {"results": rows, "environment": {}, "config": {}, **({"ceilings": CEILINGS} if ceilings else {})}
    )


def _fastest_text(doc: Results) -> str:
    (line,) = [x for x in summary_section(doc).splitlines() if x.startswith("- **")]
    return line.split(". Fastest: ", 1)[1].split(". Fusion headroom")[0]


@pytest.mark.parametrize("factor", [0.99, 0.5])
def test_too_few_rounds_for_the_paired_test_is_not_tested_never_within_noise(factor: float) -> None:
    """5 rounds (the paired test needs 8): 'not tested (5 rounds)', whether the two are alike or 2x apart. The
    control: the same timings over 8 rounds are tested ('within noise' alike, '2.00x' apart). It cannot see whether
    8 rounds were enough to find a real difference: that is the power check's (test_fastest)."""
    medians = {"torch-eager": 1e-3, "torch-compile": factor * 1e-3}
    few = _fastest_text(_timed_together(5, medians))
    assert f"not tested (5 rounds) against torch-eager (timed together; the paired test needs {MIN_PAIRS})" in few
    assert "within noise" not in few and "x torch-eager" not in few, few
    enough = _fastest_text(_timed_together(MIN_PAIRS, medians))
    assert "not tested" not in enough, enough
    how = "timed together, paired by round"
    expect = f"within noise of torch-eager ({how})" if factor == 0.99 else f"2.00x torch-eager (significant; {how})"
    assert expect in enough, enough


def test_fastest_is_tested_against_the_runner_up_as_well() -> None:
    """Fastest 2x the baseline but alike the runner-up: both verdicts, each with its test. The control: a runner-up
    1.4x slower is called so, significant."""
    close = _fastest_text(_timed_together(12, {"torch-eager": 1e-3, "torch-compile": 0.5e-3, "jax-xla": 0.5e-3}))
    assert close.startswith("torch-compile 500 us, 2.00x torch-eager (significant; timed together"), close
    assert "within noise of the runner-up jax-xla 500 us (timed together, paired by round)" in close, close
    apart = _fastest_text(_timed_together(12, {"torch-eager": 1e-3, "torch-compile": 0.5e-3, "jax-xla": 0.7e-3}))
    assert "1.40x the runner-up jax-xla 700 us (significant; timed together, paired by round)" in apart, apart
    # the baseline as the runner-up is tested once and said to be both
    two = _fastest_text(_timed_together(12, {"torch-eager": 1e-3, "torch-compile": 0.5e-3}))
    assert (
        two
        == "torch-compile 500 us, 2.00x torch-eager (significant; timed together, paired by round), also the runner-up"
    )
    # the baseline fastest: tested against the runner-up alone
    base = _fastest_text(_timed_together(12, {"torch-eager": 0.5e-3, "torch-compile": 1e-3}))
    assert base.startswith("torch-eager 500 us (the baseline itself), 2.00x the runner-up torch-compile 1 ms"), base


def test_no_fastest_without_a_timed_baseline() -> None:
    """The issue's case: jax-unfused 133 ms and jax-xla 156 ms, torch-eager not run: no fastest, and why. The
    control: with torch-eager timed, a fastest is named and tested."""
    jax = {"jax-unfused": 133e-3, "jax-xla": 156e-3}
    text = _fastest_text(_timed_together(12, jax))
    assert text.startswith("none named (torch-eager not run: a fastest is tested against it"), text
    assert "jax-unfused 133 ms" not in text
    failed = _fastest_text(_timed_together(12, {"torch-eager": 1e-3, **jax}, **{"torch-eager": "parity-fail"}))
    assert failed.startswith("none named (torch-eager failed parity"), failed
    timed = _fastest_text(_timed_together(12, {"torch-eager": 200e-3, **jax}))
    assert timed.startswith("jax-unfused 133 ms, 1.50x torch-eager (significant"), timed


def test_without_ceilings_plausibility_is_said_not_checked() -> None:
    """``--no-ceilings`` (no ceilings in the document): the intro never calls the fastest plausible, the line says
    it was not checked. The control: with ceilings, 'plausible against' the ceilings and no such note."""
    medians = {"torch-eager": 1e-3, "torch-compile": 0.5e-3}
    off = summary_section(_timed_together(12, medians, ceilings=False))
    assert "plausib" not in off.replace("plausibility was not checked", "").replace("plausibility not checked", "")
    assert "plausibility was not checked (this run measured no ceilings)" in off
    assert "(plausibility not checked: the run measured no bfloat16 ceiling)" in _fastest_text(
        _timed_together(12, medians, ceilings=False)
    )
    on = summary_section(_timed_together(12, medians))
    assert "is plausible against this machine's measured ceilings" in on and "not checked" not in on


def test_a_deviating_fastest_has_its_deviation_beside_it() -> None:
    """jax-xla deviates on y and is fastest: named with 'deviates: y' right after its time. The control: the same
    timings with jax-xla passing carry no such note."""
    medians = {"torch-eager": 1e-3, "jax-xla": 0.5e-3}
    text = _fastest_text(_timed_together(12, medians, **{"jax-xla": "deviates"}))
    assert text.startswith("jax-xla 500 us (deviates: y), 2.00x torch-eager"), text
    assert "deviates" not in _fastest_text(_timed_together(12, medians))


def test_a_backend_whose_plan_fuses_nothing_is_never_under_saved() -> None:
    """torch-eager-remat (plan ``eager-remat``: every intermediate in memory, no GEMM fused; in ``fwd`` exactly the
    baseline's kernels) timed 2x faster than torch-eager: not under 'saved', not a row of the fusion table, named
    under it instead. The control: torch-compile (``fused-ew``: ``a`` never reaches memory) at the same times is
    listed in both. It cannot see whether a plan's model is right for the backend: the cost model's tests are."""
    rows = [
        _costed("torch-eager", 1e-3, kernels=_profiled(900.0, 100.0)),
        _costed("torch-eager-remat", 0.5e-3),
        _costed("torch-compile", 0.5e-3),
    ]
    doc = from_json(Results, {"results": rows, "environment": {}, "config": {}})
    head = _headroom_text(doc)
    assert "saved: torch-compile 500 us" in head and "torch-eager-remat" not in head, head
    table_ = fusion_section(doc)
    assert "| torch-compile | torch-eager |" in table_ and "| torch-eager-remat |" not in table_
    assert "fuses nothing on that case and mode (a time they save is not fusion's): torch-eager-remat (" in table_
    assert _fusion_row(doc, "torch-eager-remat")["removed"] == []
    assert _fusion_row(doc, "torch-compile")["removed"] == ["a", "1 kernel(s)"]
