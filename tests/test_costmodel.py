"""The cost model against hand counts, the roofline arithmetic, the fusion/cost report sections, the ceilings."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from compare import costmodel
from compare.cases import PRESETS, Case, InputError, Shape
from compare.costmodel import cost, fusion_benefit, fusion_section, gemm_flops, roofline
from compare.results import Result

BLOG = PRESETS["blog-mlp"].case("bfloat16")  # 64 x 128 = 8192 tokens, dim 768, hidden 3072
GEMM = 38_654_705_664  # 2 * 8192 * 768 * 3072: one blog-mlp GEMM
ACT = 50_331_648  # one bf16 [8192, 3072] intermediate
X = 12_582_912  # the bf16 [8192, 768] input (and output)
W = 4_718_592  # one bf16 [3072, 768] weight


def tensor(c: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in c["tensors"] if t["name"] == name)


def test_gemm_flops_of_blog_mlp_by_hand() -> None:
    assert gemm_flops(8192, 3072, 768) == 2 * 8192 * 768 * 3072 == GEMM
    for backend in ("torch-eager", "torch-compile", "torch-triton", "torch-triton-fused", "jax-xla", "jax-pallas",
                    "jax-triton"):
        assert cost(BLOG, backend, "fwd")["flops"] == 3 * GEMM, backend  # gate, up, down


def test_backward_flops_count_the_recompute() -> None:
    assert cost(BLOG, "torch-eager", "bwd")["flops"] == 6 * GEMM  # dh, ddown, 2 x dx, dgate, dup
    assert cost(BLOG, "torch-compile", "bwd")["flops"] == 6 * GEMM
    assert cost(BLOG, "torch-triton-fused", "bwd")["flops"] == 8 * GEMM  # + recomputed g and u
    for backend in ("torch-eager", "torch-compile", "torch-triton-fused"):
        f, b, fb = (cost(BLOG, backend, m) for m in ("fwd", "bwd", "fwd+bwd"))
        assert fb["flops"] == f["flops"] + b["flops"] and fb["bytes"] == f["bytes"] + b["bytes"], backend


def test_eager_forward_materialises_g_u_a_h_each_written_and_read_once() -> None:
    c = cost(BLOG, "torch-eager", "fwd")
    assert c["materialized"] == ["g", "u", "a", "h"]
    for name in ("g", "u", "a", "h"):
        t = tensor(c, name)
        assert t["bytes"] == ACT and t["shape"] == [8192, 3072] and t["role"] == "intermediate"
        assert (t["reads"], t["writes"]) == (1, 1), name
    assert tensor(c, "x")["reads"] == 2  # gate and up GEMMs each read x
    assert c["intermediate_bytes"] == 4 * 2 * ACT
    # x twice, three weights once, g u a h written and read, y written
    assert c["bytes"] == 2 * X + 3 * W + 8 * ACT + X == 454_557_696
    assert c["model_kernels_per_step"] == 5


def test_bytes_saved_by_fusion() -> None:
    eager, comp, tri, fused = (cost(BLOG, b, "fwd") for b in ("torch-eager", "torch-compile", "torch-triton",
                                                               "torch-triton-fused"))
    assert comp["materialized"] == tri["materialized"] == ["g", "u", "h"]  # a = gelu(g) never reaches memory
    assert eager["bytes"] - comp["bytes"] == 2 * ACT  # a is neither written nor read back
    assert fused["materialized"] == ["h"]
    assert tensor(fused, "x")["reads"] == 1
    assert eager["bytes"] - fused["bytes"] == 6 * ACT + X  # g, u, a not written nor read; x read once
    assert eager["intermediate_bytes"] - fused["intermediate_bytes"] == 6 * ACT


def test_backward_saved_tensors_per_backend() -> None:
    assert cost(BLOG, "torch-eager", "fwd+bwd")["saved"] == ["g", "u", "a", "h"]
    assert cost(BLOG, "torch-compile", "fwd+bwd")["saved"] == ["g", "u", "h"]  # read off Inductor's graph
    assert cost(BLOG, "torch-triton-fused", "fwd+bwd")["saved"] == ["h"]  # g, u recomputed
    b = cost(BLOG, "torch-compile", "bwd")
    assert (tensor(b, "g")["reads"], tensor(b, "g")["writes"]) == (1, 0)  # written by the forward, outside bwd


def test_linear_model_and_json() -> None:
    case = PRESETS["blog-linear"].case("float32")  # 1024 tokens, 32 -> 64
    c = cost(case, "torch-eager", "fwd")
    assert c["flops"] == 2 * 1024 * 32 * 64 and c["materialized"] == [] and c["intermediate_bytes"] == 0
    assert c["bytes"] == 4 * (1024 * 32 + 64 * 32 + 64 + 1024 * 64)
    assert json.loads(json.dumps(cost(case, "jax-xla", "fwd+bwd")))["flops"] == 3 * 2 * 1024 * 32 * 64


def test_unknown_backend_lists_known_and_planned() -> None:
    with pytest.raises(InputError, match="unknown backend 'torch-nope'") as exc:
        cost(BLOG, "torch-nope", "fwd")
    for name in ("torch-eager", "torch-compile", "torch-triton", "jax-xla", "torch-triton-fused", "jax-pallas",
                 "jax-triton"):
        assert name in str(exc.value)
    with pytest.raises(InputError, match="geglu' only"):
        cost(PRESETS["blog-linear"].case("float32"), "torch-triton", "fwd")
    with pytest.raises(InputError, match="unknown mode"):
        cost(BLOG, "torch-eager", "sideways")


def test_roofline_arithmetic() -> None:
    c = {"flops": 10**9, "bytes": 10**8}
    r = roofline(c, 0.01, {"flops_per_s": 1e12, "bytes_per_s": 1e10})
    assert r["flops_per_s"] == pytest.approx(1e11) and r["flops_fraction"] == pytest.approx(0.1)
    assert r["bytes_per_s"] == pytest.approx(1e10) and r["bytes_fraction"] == pytest.approx(1.0)
    assert r["predicted_s"] == pytest.approx(max(1e9 / 1e12, 1e8 / 1e10)) and r["bound"] == "memory"
    assert r["ridge_intensity"] == pytest.approx(100.0)
    assert roofline(c, 0.01, {"flops_per_s": 1e10, "bytes_per_s": 1e12})["bound"] == "compute"
    with pytest.raises(ValueError, match="positive"):
        roofline(c, 0.0, {"flops_per_s": 1e12, "bytes_per_s": 1e10})


CEIL = {"flops_per_s": 1e14, "bytes_per_s": 1e11, "matmul_shape": [1024] * 3, "copy_bytes": 2**28,
        "timing": {"matmul": {"median_s": 2e-3}, "copy": {"median_s": 5e-3}}}


def _result(backend: str, median_s: float | None, kernels: int | None) -> dict[str, Any]:
    r = Result.for_case(backend, BLOG, "fwd", "ok").to_dict()
    r["cost"] = cost(BLOG, backend, "fwd")
    r["timing"] = {"median_s": median_s} if median_s else None
    r["kernels"] = {"kernels_per_step": kernels} if kernels else None
    return r


def _doc() -> dict[str, Any]:
    return {"results": [_result("torch-eager", 0.010, 5), _result("torch-compile", 0.008, 4),
                        _result("torch-triton-fused", None, None)],
            "ceilings": {"device": "cpu", "bfloat16": CEIL}}


def test_fusion_benefit_side_by_side() -> None:
    comp, fused = fusion_benefit(_doc())
    assert comp["backend"] == "torch-compile" and comp["kernels_eliminated"] == 1
    assert comp["bytes_saved"] == comp["intermediate_bytes_saved"] == 2 * ACT and comp["not_materialized"] == ["a"]
    assert comp["predicted_saved_s"] == pytest.approx(2 * ACT / 1e11)
    assert comp["measured_saved_s"] == pytest.approx(0.002)
    assert fused["kernels_eliminated"] is None and fused["measured_saved_s"] is None  # not profiled, not timed
    assert fused["bytes_saved"] == 6 * ACT + X and fused["extra_flops"] == 0


def test_sections_are_deterministic_and_empty_without_data() -> None:
    doc = _doc()
    text = fusion_section(doc)
    assert text == fusion_section(_doc()) and "## What fusion buys" in text
    assert "101 MB" in text  # torch-compile: a (50.3 MB) not written nor read
    cs = costmodel.cost_section(doc)
    assert cs == costmodel.cost_section(_doc()) and "116 GFLOP" in cs and "455 MB" in cs
    # torch-eager: 116 GFLOP / 10 ms against 100 TFLOP/s; 455 MB / 10 ms against 100 GB/s
    assert "11.6 TFLOP/s (12%)" in cs and "45.5 GB/s (45%)" in cs
    assert "| cpu | bfloat16 | 100 TFLOP/s | 100 GB/s |" in cs
    empty = {"results": [Result.for_case("torch-eager", BLOG, "fwd", "ok").to_dict()]}
    assert fusion_section(empty) == "" and costmodel.cost_section(empty) == ""


def test_compare_does_not_import_frameworks() -> None:
    code = ("import sys, compare.costmodel, compare.shapes; "
            "bad = [m for m in ('torch', 'jax') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ceilings_are_sane_positive_numbers() -> None:
    pytest.importorskip("torch")
    from torch_impl.ceilings import measure_ceilings

    c = measure_ceilings("float32", "cpu", budget_s=0.02, matmul_sizes=(64, 128), copy_bytes=1 << 20)
    assert c["flops_per_s"] > 1e6 and c["bytes_per_s"] > 1e6
    assert c["matmul_shape"][0] in (64, 128) and c["copy_bytes"] == 1 << 20
    assert set(c["timing"]) == {"matmul", "matmul_all", "copy"} and c["timing"]["copy"]["n"] >= 5
    mm = c["timing"]["matmul_all"][str(c["matmul_shape"][0])]
    assert c["flops_per_s"] == pytest.approx(2 * c["matmul_shape"][0] ** 3 / mm["median_s"])
    assert c["bytes_per_s"] == pytest.approx(2 * (1 << 20) / c["timing"]["copy"]["median_s"])
    with pytest.raises(InputError):
        measure_ceilings("float8", "cpu")


def test_small_case_shapes() -> None:
    case = Case("geglu", Shape(1, 33, 64, 128), "float16")
    c = cost(case, "torch-eager", "fwd")
    assert tensor(c, "g")["bytes"] == 33 * 128 * 2
