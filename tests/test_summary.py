"""The report opens with the answer: parity with the gate's resolution, the fastest backend (significant or within
noise), and the fusion headroom next to what fused backends saved. Built from a hand-written document."""

from __future__ import annotations

from typing import Any

import pytest

from compare.cost.model import cost
from compare.kernels import summary as ks
from compare.problem.cases import Case, Shape
from compare.report.cost import fusion_benefit, fusion_section
from compare.report.render import render
from compare.report.summary import summary_section
from compare.results.document import Results

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
    return Results.from_dict({"results": results, "resolution": resolution, "environment": {}, "config": {}})


def test_summary_line_says_parity_resolution_fastest_and_headroom() -> None:
    text = summary_section(_doc(fast=0.5e-3))
    assert "**geglu 3x37x96->328 bfloat16 fwd**" in text
    assert "parity **FAIL**: jax-xla (y:scale); 2 other(s) pass" in text
    assert "catches a scale error of 0.22% on y; erf vs tanh GELU not distinguishable" in text
    assert "Fastest: torch-compile 500 us, 2.00x torch-eager (significant; separate windows, unpaired)" in text
    # per framework: torch's own baseline; jax-xla fails and jax's baseline did not run, so jax has no headroom
    assert "Fusion headroom: torch: 10% of torch-eager's kernel time (100 us a step); jax: not measured" in text


def test_a_difference_within_noise_is_not_a_speedup() -> None:
    text = summary_section(_doc(fast=0.995e-3))
    assert "Fastest: torch-compile 995 us, within noise of torch-eager (separate windows, unpaired)" in text
    assert "x torch-eager" not in text


def test_the_report_opens_with_the_summary() -> None:
    md = render(_doc(fast=0.5e-3))
    assert md.index("## Summary") < md.index("## Environment") < md.index("## Parity")


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
    r["cost"] = cost(CASE, backend, "fwd").to_dict()
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
    return Results.from_dict({"results": results, "environment": {}, "config": {}})


def _fusion_row(doc: Results, backend: str) -> dict[str, Any]:
    (row,) = [f for f in fusion_benefit(doc) if f["backend"] == backend]
    return row


def _headroom_text(doc: Results) -> str:
    return summary_section(doc).split("Fusion headroom: ")[-1]


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
