"""The cost model against hand counts, the roofline arithmetic, the fusion/cost report sections, the ceilings."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from compare.backends import registry
from compare.cost.model import SILU_FLOPS, SILU_GRAD_FLOPS, cost, gemm_flops, roofline
from compare.cost.records import Ceiling, Cost, CostTensor
from compare.formats.codec import from_json, to_json
from compare.problem.cases import PRESETS, Case, InputError, Shape
from compare.report.cost import cost_section, fusion_benefit, fusion_section
from compare.results.document import Result, Results

pytestmark = pytest.mark.quick

BLOG = PRESETS["blog-mlp"].case("bfloat16")  # 64 x 128 = 8192 tokens, dim 768, hidden 3072
GEMM = 38_654_705_664  # 2 * 8192 * 768 * 3072: one blog-mlp GEMM
ACT = 50_331_648  # one bf16 [8192, 3072] intermediate
X = 12_582_912  # the bf16 [8192, 768] input (and output)
W = 4_718_592  # one bf16 [3072, 768] weight


def tensor(c: Cost, name: str) -> CostTensor:
    return c.tensor(name)


#: Every single-device backend the cost model plans.
MODELLED = (
    "torch-eager",
    "torch-compile",
    "torch-triton",
    "torch-triton-fused",
    "jax-xla",
    "jax-unfused",
    "jax-pallas",
    "jax-triton",
)


def test_gemm_flops_of_blog_mlp_by_hand() -> None:
    assert gemm_flops(8192, 3072, 768) == 2 * 8192 * 768 * 3072 == GEMM
    for backend in MODELLED:
        assert cost(BLOG, backend, "fwd").flops == 3 * GEMM, backend  # gate, up, down


def test_each_frameworks_unfused_baseline_has_eagers_plan() -> None:
    """One unfused baseline per framework (the registry's ``baseline``), each modelled as eager: every intermediate in
    memory, the activation keeping only its input; its cost is torch-eager's in every model and mode."""
    assert registry.framework_baseline("torch") == registry.DEFAULT_BASELINE == "torch-eager"
    assert registry.framework_baseline("jax") == "jax-unfused" and registry.framework_baseline("triton") is None
    for fw in {s.framework for s in registry.BACKENDS.values()}:
        assert sum(s.baseline for s in registry.BACKENDS.values() if s.framework == fw) <= 1, fw
    for case in (BLOG, SWIGLU, GPT2_MLP, PRESETS["blog-linear"].case("float32")):
        for mode in ("fwd", "bwd", "fwd+bwd"):
            jax_c, torch_c = cost(case, "jax-unfused", mode), cost(case, "torch-eager", mode)
            assert jax_c.plan == "eager" and jax_c.assumption  # where XLA's programs differ from the plan, said
            assert replace(jax_c, backend="", assumption="") == replace(torch_c, backend="", assumption=""), mode


def test_backward_flops_count_the_recompute() -> None:
    assert cost(BLOG, "torch-eager", "bwd").flops == 6 * GEMM  # dh, ddown, 2 x dx, dgate, dup
    assert cost(BLOG, "torch-compile", "bwd").flops == 6 * GEMM
    assert cost(BLOG, "torch-triton-fused", "bwd").flops == 8 * GEMM  # + recomputed g and u
    for backend in ("torch-eager", "torch-compile", "torch-triton-fused"):
        f, b, fb = (cost(BLOG, backend, m) for m in ("fwd", "bwd", "fwd+bwd"))
        assert fb.flops == f.flops + b.flops and fb.bytes == f.bytes + b.bytes, backend


def test_eager_forward_materialises_g_u_a_h_each_written_and_read_once() -> None:
    c = cost(BLOG, "torch-eager", "fwd")
    assert list(c.materialized) == ["g", "u", "a", "h"]
    for name in ("g", "u", "a", "h"):
        t = tensor(c, name)
        assert t.bytes == ACT and list(t.shape) == [8192, 3072] and t.role == "intermediate"
        assert (t.reads, t.writes) == (1, 1), name
    assert tensor(c, "x").reads == 2  # gate and up GEMMs each read x
    assert c.intermediate_bytes == 4 * 2 * ACT
    # x twice, three weights once, g u a h written and read, y written
    assert c.bytes == 2 * X + 3 * W + 8 * ACT + X == 454_557_696
    assert c.model_kernels_per_step == 5


def test_bytes_saved_by_fusion() -> None:
    eager, comp, tri, fused = (
        cost(BLOG, b, "fwd") for b in ("torch-eager", "torch-compile", "torch-triton", "torch-triton-fused")
    )
    assert list(comp.materialized) == list(tri.materialized) == ["g", "u", "h"]  # a = gelu(g) never reaches memory
    assert eager.bytes - comp.bytes == 2 * ACT  # a is neither written nor read back
    assert list(fused.materialized) == ["h"]
    assert tensor(fused, "x").reads == 1
    assert eager.bytes - fused.bytes == 6 * ACT + X  # g, u, a not written nor read; x read once
    assert eager.intermediate_bytes - fused.intermediate_bytes == 6 * ACT


def test_backward_saved_tensors_per_backend() -> None:
    assert list(cost(BLOG, "torch-eager", "fwd+bwd").saved) == ["g", "u", "a", "h"]
    assert list(cost(BLOG, "torch-compile", "fwd+bwd").saved) == ["g", "u", "h"]  # read off Inductor's graph
    assert list(cost(BLOG, "torch-triton-fused", "fwd+bwd").saved) == ["h"]  # g, u recomputed
    b = cost(BLOG, "torch-compile", "bwd")
    assert (tensor(b, "g").reads, tensor(b, "g").writes) == (1, 0)  # written by the forward, outside bwd


def test_linear_model_and_json() -> None:
    case = PRESETS["blog-linear"].case("float32")  # 1024 tokens, 32 -> 64
    c = cost(case, "torch-eager", "fwd")
    assert c.flops == 2 * 1024 * 32 * 64 and list(c.materialized) == [] and c.intermediate_bytes == 0
    assert c.bytes == 4 * (1024 * 32 + 64 * 32 + 64 + 1024 * 64)
    assert json.loads(json.dumps(to_json(cost(case, "jax-xla", "fwd+bwd"))))["flops"] == 3 * 2 * 1024 * 32 * 64


def test_unknown_or_unmodelled_backend_is_refused_naming_what_is_allowed() -> None:
    with pytest.raises(InputError, match="unknown backend 'torch-nope'") as exc:
        cost(BLOG, "torch-nope", "fwd")
    for name in (
        "torch-eager",
        "torch-compile",
        "torch-triton",
        "jax-xla",
        "torch-triton-fused",
        "jax-pallas",
        "jax-triton",
    ):
        assert name in str(exc.value)
    with pytest.raises(InputError, match="only, not 'linear'"):
        cost(PRESETS["blog-linear"].case("float32"), "torch-triton", "fwd")
    registry.register(registry.BackendSpec(name="unmodelled", framework="torch", target="-", about="no plan"))
    try:
        with pytest.raises(InputError, match="no cost model for backend 'unmodelled'; modelled backends: torch-eager"):
            cost(BLOG, "unmodelled", "fwd")
    finally:
        registry.unregister("unmodelled")
    with pytest.raises(InputError, match="unknown mode"):
        cost(BLOG, "torch-eager", "sideways")


def test_roofline_arithmetic() -> None:
    c = replace(cost(BLOG, "torch-eager", "fwd"), flops=10**9, bytes=10**8)
    r = roofline(c, 0.01, Ceiling(flops_per_s=1e12, bytes_per_s=1e10))
    assert r.flops_per_s == pytest.approx(1e11) and r.flops_fraction == pytest.approx(0.1)
    assert r.bytes_per_s == pytest.approx(1e10) and r.bytes_fraction == pytest.approx(1.0)
    assert r.predicted_s == pytest.approx(max(1e9 / 1e12, 1e8 / 1e10)) and r.bound == "memory"
    assert r.ridge_intensity == pytest.approx(100.0)
    assert roofline(c, 0.01, Ceiling(flops_per_s=1e10, bytes_per_s=1e12)).bound == "compute"
    with pytest.raises(ValueError, match="positive"):
        roofline(c, 0.0, Ceiling(flops_per_s=1e12, bytes_per_s=1e10))


CEIL = {
    "flops_per_s": 1e14,
    "bytes_per_s": 1e11,
    "matmul_shape": [1024] * 3,
    "copy_bytes": 2**28,
    "timing": {"matmul": {"median_s": 2e-3, "iqr_s": 0.0}, "copy": {"median_s": 5e-3, "iqr_s": 0.0}},
}


def _result(backend: str, median_s: float | None, kernels: int | None) -> dict[str, Any]:
    r = to_json(Result.for_case(backend, BLOG, "fwd", "ok"))
    r["cost"] = to_json(cost(BLOG, backend, "fwd"))
    r["timing"] = {"median_s": median_s, "iqr_s": 0.0} if median_s else None
    r["kernels"] = {"kernels_per_step": kernels} if kernels else None
    return r


def _doc() -> Results:
    return from_json(
        Results,
        {
            "results": [
                _result("torch-eager", 0.010, 5),
                _result("torch-compile", 0.008, 4),
                _result("torch-triton-fused", None, None),
            ],
            "ceilings": {"device": "cpu", "bfloat16": CEIL},
        },
    )


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
    cs = cost_section(doc)
    assert cs == cost_section(_doc()) and "116 GFLOP" in cs and "455 MB" in cs
    # torch-eager: 116 GFLOP / 10 ms against 100 TFLOP/s; 455 MB / 10 ms against 100 GB/s
    assert "11.6 TFLOP/s (12%)" in cs and "45.5 GB/s (45%)" in cs
    assert "| cpu | bfloat16 | 100 TFLOP/s | 100 GB/s |" in cs
    empty = Results(results=(Result.for_case("torch-eager", BLOG, "fwd", "ok"),))
    assert fusion_section(empty) == "" and cost_section(empty) == ""


def test_compare_does_not_import_frameworks() -> None:
    code = (
        "import sys, compare.cost.model, compare.report.shapes, compare.run.shape_sweep; "
        "bad = [m for m in ('torch', 'jax') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ceilings_are_sane_positive_numbers() -> None:
    pytest.importorskip("torch")
    from torch_impl.ceilings import measure_ceilings

    c = measure_ceilings("float32", "cpu", budget_s=0.02, matmul_sizes=(64, 128), copy_bytes=1 << 20)
    assert c["flops_per_s"] > 1e6 and c["bytes_per_s"] > 1e6
    assert c["matmul_shape"][0] in (64, 128) and c["copy_bytes"] == 1 << 20
    assert set(c["timing"]) == {"matmul", "matmul_all", "copy"} and c["timing"]["copy"]["n"] >= 5
    mm = c["timing"]["matmul_all"][str(c["matmul_shape"][0])]
    # a ceiling is a peak: the rate of the fastest sample
    assert c["flops_per_s"] == pytest.approx(2 * c["matmul_shape"][0] ** 3 / mm["min_s"])
    assert mm["min_s"] <= mm["median_s"]
    assert c["bytes_per_s"] == pytest.approx(2 * (1 << 20) / c["timing"]["copy"]["min_s"])
    with pytest.raises(InputError):
        measure_ceilings("float8", "cpu")


def test_small_case_shapes() -> None:
    case = Case("geglu", Shape(1, 33, 64, 128), "float16")
    c = cost(case, "torch-eager", "fwd")
    assert tensor(c, "g").bytes == 33 * 128 * 2


# ---- SwiGLU and GPT-2's MLP --------------------------------------------------------------------------------------

SWIGLU = Case("swiglu", BLOG.shape, "bfloat16")  # the blog-mlp shape, SwiGLU
GPT2_MLP = Case("gelu-mlp", BLOG.shape, "bfloat16")  # the blog-mlp shape (768 -> 3072: GPT-2 small's), GELU MLP
TH = 8192 * 3072  # elements of one [tokens, hidden] intermediate


def test_swiglu_moves_what_geglu_moves_with_silu_flops() -> None:
    """Same kernels, tensors, bytes and GEMM FLOPs as GeGLU in every plan and mode; only the activation's FLOPs
    (silu 5, its gradient 9; gelu 9 and 16) and the kernel names differ."""
    for backend in MODELLED:
        for mode in ("fwd", "bwd", "fwd+bwd"):
            s, g = cost(SWIGLU, backend, mode), cost(BLOG, backend, mode)
            for key in ("flops", "bytes", "tensors", "materialized", "saved", "model_kernels_per_step"):
                assert getattr(s, key) == getattr(g, key), (backend, mode, key)
            assert [n.replace("silu", "gelu").replace("SwiGLU", "GeGLU") for n in s.model_kernels] == list(
                g.model_kernels
            ), (backend, mode)
    assert SILU_FLOPS == 5 and SILU_GRAD_FLOPS == 9
    eager = cost(SWIGLU, "torch-eager", "fwd+bwd")
    # forward: silu 5 + mul 1; backward: two muls, silu' 9, the dx add (per [T, D] element)
    assert eager.ew_flops == (5 + 1) * TH + (1 + 1 + 9) * TH + 8192 * 768
    fused = cost(SWIGLU, "torch-triton", "bwd")  # one kernel: recomputes silu (5), silu' (9), du and dg (2)
    assert fused.ew_flops == (5 + 9 + 2) * TH + 8192 * 768
    assert "fused gate+up GEMM, SwiGLU epilogue (x -> h)" in cost(SWIGLU, "torch-triton-fused", "fwd").model_kernels


def test_gpt2_mlp_by_hand() -> None:
    """fc1 addmm, GELU, fc2 addmm forward; backward da, dfc2, db2, GELU backward, dx, dfc1, db1 (eager: 7 kernels;
    torch-compile/jax-xla: the db2 sum fused into the GELU backward, 6), counted by hand for bf16 blog-mlp."""
    b1, b2 = 3072 * 2, 768 * 2  # bias bytes
    f = cost(GPT2_MLP, "torch-eager", "fwd")
    assert f.flops == 2 * GEMM and f.model_kernels_per_step == 3
    assert list(f.materialized) == ["f", "a"] and f.intermediate_bytes == 2 * 2 * ACT
    assert list(tensor(f, "f").shape) == [8192, 3072] and (tensor(f, "f").reads, tensor(f, "f").writes) == (1, 1)
    # x read once, fc1 and fc2, both biases, f and a written and read, y written
    assert f.bytes == X + 2 * W + b1 + b2 + 4 * ACT + X
    assert f.ew_flops == TH + 9 * TH + 8192 * 768  # bias adds and GELU
    assert cost(GPT2_MLP, "torch-compile", "fwd").bytes == f.bytes  # Inductor's CPU forward: the same kernels

    b = cost(GPT2_MLP, "torch-eager", "bwd")
    assert b.flops == 4 * GEMM and b.model_kernels_per_step == 7  # da, dfc2, dx, dfc1 GEMMs; 2 sums; gelu'
    assert list(b.model_kernels) == [
        "da GEMM (dy W_fc2)",
        "dfc2 GEMM (dy^T a)",
        "db2 reduction (sum dy)",
        "gelu backward (da, f -> df)",
        "dx GEMM (df W_fc1)",
        "dfc1 GEMM (df^T x)",
        "db1 reduction (sum df)",
    ]
    assert tensor(b, "dy").reads == 3 and tensor(b, "df").reads == 3  # dy: da, dfc2, db2; df: dx, dfc1, db1
    assert list(b.materialized) == ["da", "a", "f", "df"]  # in order of first use
    # dy read 3x, fc2/fc1 once, a and f read (saved), da and df written and read (df 3x), x read, 4 gradients written
    assert b.bytes == 3 * X + 2 * W + ACT + 2 * ACT + ACT + 4 * ACT + X + X + 2 * W + b1 + b2
    assert b.ew_flops == 8192 * 768 + 16 * TH + TH  # db2 sum, gelu' times da, db1 sum

    c = cost(GPT2_MLP, "torch-compile", "bwd")
    assert c.model_kernels_per_step == 6 and c.flops == b.flops
    assert "fused gelu backward + db2 reduction (da, f, dy -> df, db2)" in c.model_kernels
    assert b.bytes - c.bytes == 0  # the fusion saves a launch, not traffic: dy is still read by it
    assert (
        list(cost(GPT2_MLP, "jax-xla", "fwd+bwd").saved)
        == list(cost(GPT2_MLP, "torch-eager", "fwd+bwd").saved)
        == ["f", "a"]
    )


def test_gpt2_mlp_only_where_implemented() -> None:
    for backend in ("torch-triton", "torch-triton-fused", "jax-pallas", "jax-triton"):
        with pytest.raises(InputError, match="only, not 'gelu-mlp'"):
            cost(GPT2_MLP, backend, "fwd")
    for backend in ("torch-eager", "torch-compile", "jax-xla", "jax-unfused"):
        assert cost(GPT2_MLP, backend, "fwd+bwd").flops == 6 * GEMM


def test_remat_plans_by_hand() -> None:
    """The recomputation plans: the base plan's forward; the backward first recomputes the tail (eager-remat: GELU,
    mul and the down GEMM, as non-reentrant checkpointing reruns its region; fused-ew-remat: the fused act*mul
    alone), so only g and u are kept, and the recomputed GEMM's FLOPs are paid once more."""
    for remat, base in (("torch-eager-remat", "torch-eager"), ("jax-xla-remat", "jax-xla")):
        assert registry.spec(remat).remat_of == base
        fwd, base_fwd = cost(BLOG, remat, "fwd"), cost(BLOG, base, "fwd")
        assert replace(fwd, backend="", plan="", assumption="") == replace(base_fwd, backend="", plan="", assumption="")
        assert list(cost(BLOG, remat, "fwd+bwd").saved) == ["g", "u"]
    eager, remat = cost(BLOG, "torch-eager", "bwd"), cost(BLOG, "torch-eager-remat", "bwd")
    assert remat.model_kernels[:3] == ("recompute gelu (g -> a)", "recompute mul (a * u -> h)", "recompute down GEMM")
    assert remat.model_kernels[3:] == eager.model_kernels
    assert remat.flops == eager.flops + GEMM  # the down GEMM once more, its output dropped
    # GELU reads g, writes a; mul reads a, u, writes h; down reads h and its weight, writes y once more
    assert remat.bytes - eager.bytes == 6 * ACT + W + X
    xla, xla_remat = cost(BLOG, "jax-xla", "bwd"), cost(BLOG, "jax-xla-remat", "bwd")
    assert xla_remat.model_kernels == ("recompute fused gelu*mul (g, u -> h)", *xla.model_kernels)
    assert xla_remat.flops == xla.flops and xla_remat.bytes == xla.bytes + 3 * ACT  # g, u read; h written
    for model_case in (GPT2_MLP, SWIGLU):
        for remat in ("torch-eager-remat", "jax-xla-remat"):
            c = cost(model_case, remat, "fwd+bwd")
            assert list(c.saved) == (["f"] if model_case is GPT2_MLP else ["g", "u"]), (remat, c.saved)
    assert cost(GPT2_MLP, "torch-eager-remat", "bwd").model_kernels[:2] == (
        "recompute gelu (f -> a)",
        "recompute fc2 addmm (a fc2^T + b2 -> y)",
    )
    assert cost(GPT2_MLP, "jax-xla-remat", "bwd").model_kernels[0] == "recompute gelu (f -> a)"
    with pytest.raises(InputError, match="implements model"):
        cost(PRESETS["blog-linear"].case("float32"), "torch-eager-remat", "fwd")
