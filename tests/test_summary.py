"""The report opens with the answer: parity with the gate's resolution, the fastest backend (significant or within
noise), and the fusion headroom next to what fused backends saved. Built from a hand-written document."""

from __future__ import annotations

from typing import Any

from compare import kernels as ks
from compare.report import render
from compare.results import Results
from compare.summary import summary_section

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
    assert "Fastest: torch-compile 500 us, 2.00x torch-eager (significant)" in text
    assert "Fusion headroom: 10% of torch-eager's kernel time (100 us a step)" in text


def test_a_difference_within_noise_is_not_a_speedup() -> None:
    text = summary_section(_doc(fast=0.995e-3))
    assert "Fastest: torch-compile 995 us, within noise of torch-eager" in text
    assert "x torch-eager" not in text


def test_the_report_opens_with_the_summary() -> None:
    md = render(_doc(fast=0.5e-3))
    assert md.index("## Summary") < md.index("## Environment") < md.index("## Parity")
