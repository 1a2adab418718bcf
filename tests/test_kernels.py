"""Kernels per step: the summary schema and report section (pure), torch.profiler counts, XLA HLO counts.

With the tiny GeGLU case (T = 3 * 37 = 111 tokens, dim 96, hidden 328), each test states both worlds:

- torch-eager forward: 5 kernels, view-like ops apart. CPU: 3 ``aten::mm`` + ``aten::gelu`` + ``aten::mul`` (the
  leaf ops); CUDA: 3 cuBLAS/CUTLASS GEMM kernels + a GELU and a mul elementwise kernel (device activities);
- torch-compile forward: 3 GEMMs plus one fused kernel that absorbed GELU, mul and a reshape. CPU: extern
  ``aten::mm`` and the C++ kernel ``graph_<k>_cpp_fused__unsafe_view_gelu_mul_0`` (k: the process's graph count);
  CUDA: cuBLAS GEMMs and the Triton kernel ``triton_poi_fused__unsafe_view_gelu_mul_0``;
- torch-triton forward: 3 GEMMs plus the GeGLU kernel. CPU: interpreted, so the launch is one opaque ``custom``
  range; CUDA: the compiled ``_glu_fwd_kernel`` as a device kernel;
- jax-xla forward (XLA:CPU here): 3 GEMM fusions (``dot`` inside) and one loop fusion holding both the GELU
  (``tanh``) and the mul.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compare.formats.codec import from_json
from compare.kernels import summary as ks
from compare.kernels.classify import classify
from compare.kernels.names import parse_fused_name
from compare.kernels.shorten import SHORT_WIDTH, shorten
from compare.problem.cases import PRESETS
from compare.problem.golden import golden_for
from compare.report.kernels import kernel_section
from compare.results.document import Results

pytestmark = pytest.mark.quick

TINY = PRESETS["tiny"].case("float32")
T, DIM, HIDDEN = TINY.shape.tokens, TINY.shape.dim, TINY.shape.hidden


def _by_name(s: dict[str, Any]) -> dict[str, int]:
    return {k["name"]: k["count"] for k in s["kernels"]}


def _checked(s: dict[str, Any]) -> dict[str, Any]:
    ks.check_summary(s)
    json.loads(json.dumps(s))  # JSON-able
    print(ks.describe(s))
    return s


# ---- pure: names, schema, report section ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "cpp_fused__unsafe_view_gelu_mul_0",
        "graph_0_cpp_fused__unsafe_view_gelu_mul_0",
        "triton_poi_fused__unsafe_view_gelu_mul_0",
    ],
)
def test_absorbed_ops_parsed_from_inductor_names(name: str) -> None:
    assert parse_fused_name(name) == ["_unsafe_view", "gelu", "mul"]
    assert classify(name) == "fused"
    entry = ks.kernel_entry(name, 1)
    assert entry["kind"] == "fused" and entry["absorbed"] == ["_unsafe_view", "gelu", "mul"]


def test_absorbed_ops_multi_word_and_edge_cases() -> None:
    assert parse_fused_name("graph_0_cpp_fused__unsafe_view_gelu_gelu_backward_mul_view_0") == [
        "_unsafe_view",
        "gelu",
        "gelu_backward",
        "mul",
        "view",
    ]
    assert parse_fused_name("graph_0_cpp_fused_add_view_1") == ["add", "view"]
    assert parse_fused_name("triton_red_fused_native_layer_norm_0") == ["native_layer_norm"]
    assert parse_fused_name("cpp_fused_0") == []
    assert parse_fused_name("cpp_fused__made_up_op_3") == ["_made", "up", "op"]  # unknown: best effort
    assert parse_fused_name("aten::mm") is None
    assert parse_fused_name("ynn_fusion") is None


def test_classify() -> None:
    assert [classify(n) for n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")] == ["gemm"] * 4
    assert [classify(n) for n in ("aten::gelu", "aten::mul", "aten::add", "aten::gelu_backward")] == ["elementwise"] * 4
    assert classify("aten::sum") == "reduction"
    assert classify("aten::copy_") == classify("aten::to") == "copy"
    assert classify("triton_tem_fused_mm_0") == "gemm"  # an Inductor GEMM template
    # Inductor's C++ GEMM template with the activation in its epilogue, named after the ops it absorbed: a GEMM
    assert classify("graph_0_cpp_fused_gelu_mm_mul_0") == "gemm"
    assert classify("graph_0_cpp_fused__unsafe_view_gelu_mul_0") == "fused"  # the elementwise fusion beside it
    # a bias add Inductor split off an addmm into the pointwise kernel after it: no GEMM inside
    assert classify("triton_poi_fused_addmm_gelu_0") == classify("cpp_fused_addmm_gelu_0") == "fused"
    assert classify("inductor::_mm_plus_mm") == "gemm"  # max-autotune's dx = dg W_gate + du W_up
    assert classify("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn") == "gemm"
    assert classify("Memcpy HtoD (Pageable -> Device)") == "copy"
    assert classify("aten::made_up") == "other"
    # this project's Triton kernels by their names and by the _geglu_ ones committed results hold: the same kinds
    for old, new in (("_geglu_matmul_kernel", "_glu_matmul_kernel"), ("_geglu_fwd_kernel", "_glu_fwd_kernel")):
        assert [classify(f"triton::{n}") for n in (old, new)] == [classify(old)] * 2, (old, new)
    assert classify("triton::_glu_matmul_kernel") == "gemm"


def test_shorten_keeps_meaningful_parts() -> None:
    cutlass = (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>"
        "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)"
    )
    short = shorten(cutlass)
    assert len(short) <= SHORT_WIDTH and "..." in short
    assert short.startswith("cutlass_80_") and short.endswith("_tn_align8")
    cublas = (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas"
    )
    assert len(shorten(cublas)) <= SHORT_WIDTH and shorten(cublas).startswith("sm90_xmma_gemm")
    mul = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, "
        "c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, "
        "3> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
        "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)"
    )
    assert shorten(mul) == "vectorized_elementwise_kernel<MulFunctor>"
    assert shorten("triton_poi_fused__unsafe_view_gelu_mul_0") == "triton_poi_fused__unsafe_view_gelu_mul_0"
    assert shorten("aten::mm") == "mm"


def _result(backend: str, mode: str, kernels: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "backend": backend,
        "model": "geglu",
        "dtype": "float32",
        "case": TINY.name,
        "mode": mode,
        "shape": {"batch": 3, "seq": 37, "dim": 96, "hidden": 328},
        "status": "ok",
        "kernels": kernels,
    }


def _hand_doc() -> dict[str, Any]:
    meta = [{"name": "aten::t", "count": 3}, {"name": "aten::transpose", "count": 3}]
    eager = ks.summary(
        "torch.profiler",
        "cpu",
        [
            ks.kernel_entry("aten::mm", 3, time_us=30.0),
            ks.kernel_entry("aten::gelu", 1),
            ks.kernel_entry("aten::mul", 1),
        ],
        meta,
    )
    compiled = ks.summary(
        "torch.profiler",
        "cpu",
        [ks.kernel_entry("aten::mm", 3), ks.kernel_entry("graph_0_cpp_fused__unsafe_view_gelu_mul_0", 1)],
        [],
        notes="a | note",
    )
    xla = ks.summary(
        "xla-hlo",
        "cpu",
        [
            ks.kernel_entry("ynn_fusion", 3, kind="gemm", absorbed=["dot"]),
            ks.kernel_entry("multiply_bitcast_fusion", 1, kind="fused", absorbed=["multiply", "tanh", "add"]),
        ],
        [{"name": "bitcast", "count": 2}],
    )
    return {
        "results": [
            _result("torch-eager", "fwd", eager),
            _result("torch-compile", "fwd", compiled),
            _result("torch-triton", "fwd", None),
            _result("jax-xla", "fwd", xla),
            {**_result("torch-eager", "bwd", None), "status": "skipped"},
        ]
    }


def test_kernel_section_from_hand_written_doc() -> None:
    doc = from_json(Results, _hand_doc())
    before = copy.deepcopy(doc)
    text = kernel_section(doc)
    print(text)
    assert doc == before and kernel_section(doc) == text  # pure, deterministic
    assert text.startswith("## Kernels per step\n")
    rows = [line for line in text.splitlines() if line.startswith("| torch-") or line.startswith("| jax-")]
    assert [r.split(" | ")[0] for r in rows] == ["| torch-eager", "| torch-compile", "| jax-xla"]  # no kernels: no row
    eager, compiled, xla = rows
    assert "| geglu 3x37x96->328 | float32 | fwd |" in eager
    assert "| 5 |" in eager and "gemm: `mm` x3; elementwise: `gelu`, `mul`" in eager
    assert "t x3, transpose x3" in eager  # metadata ops counted apart
    assert "| 4 |" in compiled and "`graph_0_cpp_fused__unsafe_view_gelu_mul_0`: _unsafe_view + gelu + mul" in compiled
    assert "gemm: `ynn_fusion` x3; fused: `multiply_bitcast_fusion`" in xla and "bitcast x2" in xla
    assert "multiply + tanh + add" in xla and "`ynn_fusion`: dot" not in xla  # a plain GEMM lists no absorbed ops
    assert "a \\| note" in text  # table-breaking characters escaped


def test_kernel_section_empty_without_kernels() -> None:
    assert kernel_section(Results()) == ""
    assert kernel_section(from_json(Results, {"results": [_result("torch-eager", "fwd", None)]})) == ""


def test_check_summary_rejects_bad_counts() -> None:
    s = ks.summary("xla-hlo", "cpu", [ks.kernel_entry("dot", 2)], [])
    ks.check_summary(s)
    s["kernels_per_step"] = 3
    with pytest.raises(ValueError, match="sum"):
        ks.check_summary(s)
    with pytest.raises(ValueError, match="lacks keys"):
        ks.check_summary({**s, "kernels_per_step": 2, "kernels": [{"name": "dot", "count": 2}]})
    with pytest.raises(ValueError, match="source"):
        ks.summary("nvprof", "cpu", [], [])


def test_compare_kernels_imports_no_framework() -> None:
    code = "import sys, compare.kernels.summary; assert not {'torch', 'jax'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


HAND_HLO = """HloModule jit_f, entry_computation_layout={(bf16[8,4]{1,0}, bf16[4,16]{1,0})->bf16[8,16]{1,0}}

%fused_computation (param_0: bf16[8,16], param_1: bf16[8,16]) -> bf16[8,16] {
  %param_0 = bf16[8,16]{1,0} parameter(0)
  %tanh.1 = bf16[8,16]{1,0} tanh(%param_0)
  %param_1 = bf16[8,16]{1,0} parameter(1)
  ROOT %multiply.2 = bf16[8,16]{1,0} multiply(%tanh.1, %param_1)
}

ENTRY %main.3 (x.1: bf16[8,4], w.1: bf16[4,16]) -> bf16[8,16] {
  %x.1 = bf16[8,4]{1,0} parameter(0)
  %w.1 = bf16[4,16]{1,0} parameter(1)
  %cublas-gemm.1 = (bf16[8,16]{1,0}, s8[4194304]{0}) custom-call(%x.1, %w.1), custom_call_target="__cublas$gemm"
  %get-tuple-element = bf16[8,16]{1,0} get-tuple-element(%cublas-gemm.1), index=0
  %bitcast.1 = bf16[8,16]{1,0} bitcast(%get-tuple-element)
  ROOT %loop_multiply_fusion = bf16[8,16]{1,0} fusion(%bitcast.1, %bitcast.1), kind=kLoop, calls=%fused_computation
}
"""


def test_hlo_parser_on_hand_written_gpu_style_module() -> None:
    from jax_impl.profiling import hlo_kernels, parse_hlo

    module = parse_hlo(HAND_HLO)
    assert module.entry == "main.3" and set(module.computations) == {"fused_computation", "main.3"}
    kernels, metadata, fusions = hlo_kernels(module)
    assert [(k["name"], k["kind"], k["count"], k["absorbed"]) for k in kernels] == [
        ("__cublas$gemm", "gemm", 1, []),
        ("loop_multiply_fusion", "fused", 1, ["tanh", "multiply"]),
    ]
    assert metadata == [{"name": "bitcast", "count": 1}] and fusions == {"kLoop": 1}


# ---- torch.profiler on CPU -----------------------------------------------------------------------------------


@functools.cache
def _torch_prepared(backend: str, mode: str) -> Any:
    """A prepared tiny-case step, run once; torch-compile is compiled with Inductor kernel profiling on."""
    from compare.backends import registry
    from torch_impl import profiling

    previous = profiling.enable_inductor_kernel_profile(backend == "torch-compile")
    try:
        prepared = registry.spec(backend).load().prepare(golden_for(TINY).problem, mode)
        prepared.sync(prepared.step())  # compiles here, while the flag is set
    finally:
        profiling.enable_inductor_kernel_profile(previous)
    return prepared


@functools.cache
def _torch_summary(backend: str, mode: str) -> dict[str, Any]:
    from torch_impl import profiling

    p = _torch_prepared(backend, mode)
    return _checked(profiling.profile_step(p.step, p.sync, device=p.device))


def _on_cuda(s: dict[str, Any]) -> bool:
    return str(s["device"]).startswith("cuda")


def _gemm_names(s: dict[str, Any]) -> list[str]:
    return [k["name"] for k in s["kernels"] if k["kind"] == "gemm" for _ in range(k["count"])]


def _graph_counter_normalised(name: str) -> str:
    """``graph_3_cpp_fused_...`` -> ``graph_<k>_cpp_fused_...``: Inductor numbers the graphs it compiles in a process,
    so k counts the compiles that ran before this one (other tests' included), not a property of the kernel."""
    return re.sub(r"^graph_\d+_", "graph_<k>_", name)


def test_torch_eager_geglu_forward_is_five_kernels() -> None:
    s = _torch_summary("torch-eager", "fwd")
    assert s["source"] == "torch.profiler"
    assert s["kernels_per_step"] == 5 and ks.count_by_kind(s) == {"gemm": 3, "elementwise": 2}
    if _on_cuda(s):  # device kernels: cuBLAS/CUTLASS GEMMs, at::native elementwise kernels named by functor
        ew = " ".join(k["name"] for k in s["kernels"] if k["kind"] == "elementwise").lower()
        assert "gelu" in ew and "mul" in ew, s["kernels"]
    else:  # the leaf ops that do the work
        assert s["device"] == "cpu"
        assert _by_name(s) == {"aten::mm": 3, "aten::gelu": 1, "aten::mul": 1}
        assert not {"aten::linear", "aten::matmul"} & set(_by_name(s))  # composites count through their leaves
    meta = {m["name"]: m["count"] for m in s["metadata_ops"]}
    assert meta["aten::t"] == 3 and meta["aten::transpose"] == 3 and meta["aten::_unsafe_view"] == 3
    assert all(k["time_us"] is not None and k["time_us"] > 0 for k in s["kernels"])


def test_torch_eager_geglu_forward_backward() -> None:
    s = _torch_summary("torch-eager", "fwd+bwd")
    # forward: 3 mm, gelu, mul; backward: 6 mm, gelu_backward, 2 mul, and the add of the two branches' dx
    if _on_cuda(s):
        assert ks.count_by_kind(s)["gemm"] == 9 and ks.count_by_kind(s)["elementwise"] == 6, s["kernels"]
    else:
        assert _by_name(s) == {"aten::mm": 9, "aten::gelu": 1, "aten::mul": 3, "aten::gelu_backward": 1, "aten::add": 1}


@pytest.mark.standard
@pytest.mark.compile
def test_torch_compile_geglu_forward_fuses_gelu_and_mul() -> None:
    s = _torch_summary("torch-compile", "fwd")
    fused = [k for k in s["kernels"] if k["kind"] == "fused"]
    assert len(_gemm_names(s)) == 3
    assert len(fused) == 1 and fused[0]["count"] == 1
    assert {"gelu", "mul"} <= set(fused[0]["absorbed"])
    assert s["kernels_per_step"] == 4 and not any(k["kind"] == "elementwise" for k in s["kernels"])
    if _on_cuda(s):  # Inductor's pointwise Triton kernel; the GEMMs stay cuBLAS calls
        assert fused[0]["name"] == "triton_poi_fused__unsafe_view_gelu_mul_0"
    else:  # Inductor keeps the GEMMs as extern calls of aten::mm and fuses the rest into one C++ kernel
        assert _gemm_names(s) == ["aten::mm"] * 3
        assert _graph_counter_normalised(fused[0]["name"]) == "graph_<k>_cpp_fused__unsafe_view_gelu_mul_0"


@pytest.mark.standard
@pytest.mark.compile
def test_torch_compile_geglu_forward_backward() -> None:
    s = _torch_summary("torch-compile", "fwd+bwd")
    assert len(_gemm_names(s)) == 9
    if not _on_cuda(s):
        assert _by_name(s)["aten::mm"] == 9
    fused = [k for k in s["kernels"] if k["kind"] == "fused"]
    assert any({"gelu", "mul"} <= set(k["absorbed"]) for k in fused)
    assert any("gelu_backward" in k["absorbed"] for k in fused)  # backward elementwise work fused too
    assert not any(k["kind"] == "elementwise" for k in s["kernels"])


def test_torch_triton_launch_is_one_kernel_beside_the_gemms() -> None:
    s = _torch_summary("torch-triton", "fwd")
    if _on_cuda(s):  # compiled: the Triton kernel is a device kernel of its own
        assert len(_gemm_names(s)) == 3 and s["kernels_per_step"] == 4
        assert any("_glu_fwd_kernel" in k["name"] for k in s["kernels"]), s["kernels"]
    else:  # interpreted: the launch runs in Python; its profiler range is one opaque custom kernel
        assert _by_name(s) == {"aten::mm": 3, "triton::_glu_fwd_kernel": 1}
        assert ks.count_by_kind(s) == {"gemm": 3, "custom": 1} and "interpreter" in s["notes"]


@pytest.mark.standard
def test_inductor_kernel_profile_flag_is_restored() -> None:
    """The test helper compiles with the flag on and restores it afterwards."""
    from torch_impl import profiling

    # Start from the flag off: the torch-compile backend itself turns it on for good (a cheap check per call), so
    # an earlier test in the session may have left it on.
    profiling.enable_inductor_kernel_profile(False)
    _torch_prepared("torch-compile", "fwd")
    assert profiling.enable_inductor_kernel_profile(False) is False  # the helper put the flag back as it found it
    # kernels compiled with the flag, profiled after it is reset: test_torch_compile_geglu_forward_fuses_gelu_and_mul


def test_cuda_events_count_device_kernels_only() -> None:
    """Synthetic profiler events shaped like a CUDA run (no GPU here): device kernels count, CPU ops do not."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from torch_impl import profiling

    events: list[FunctionEvent] = []

    def ev(
        name: str, start: float, end: float, parent: FunctionEvent | None = None, *, cuda: str = ""
    ) -> FunctionEvent:
        e = FunctionEvent(
            len(events),
            name,
            thread=1,
            start_us=start,
            end_us=end,
            device_type=DeviceType.CUDA if cuda else DeviceType.CPU,
            is_user_annotation=name == profiling.STEP_NAME,
            activity_type=cuda or "cpu_op",
        )
        if parent is not None:
            parent.append_cpu_child(e)
            e.set_cpu_parent(parent)
        events.append(e)
        return e

    gemm = (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas"
    )
    gelu = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)"
    for t0 in (0.0, 100.0):  # two steps
        step = ev(profiling.STEP_NAME, t0, t0 + 50)
        linear = ev("aten::linear", t0 + 1, t0 + 10, step)
        ev("aten::t", t0 + 1, t0 + 2, linear)
        ev("aten::mm", t0 + 3, t0 + 9, linear)
        ev("aten::gelu", t0 + 11, t0 + 12, step)
        ev(profiling.STEP_NAME, t0 + 5, t0 + 45, cuda="gpu_user_annotation")
        ev(gemm, t0 + 5, t0 + 25, cuda="kernel")
        ev(gelu, t0 + 26, t0 + 30, cuda="kernel")
        ev("Memset (Device)", t0 + 31, t0 + 32, cuda="gpu_memset")
    s = _checked(profiling.summarize_events(events, "cuda:0"))
    assert [(k["name"], k["kind"], k["count"], k["time_us"]) for k in s["kernels"]] == [
        (gemm, "gemm", 1, 20.0),
        (gelu, "elementwise", 1, 4.0),
        ("Memset (Device)", "copy", 1, 1.0),
    ]
    assert s["metadata_ops"] == [{"name": "aten::t", "count": 1}]


def test_torch_trace_written_as_chrome_json(tmp_path: Path) -> None:
    from torch_impl import profiling

    p = _torch_prepared("torch-eager", "fwd")
    trace = tmp_path / "sub" / "torch-eager.json"
    s = profiling.profile_step(p.step, p.sync, trace, device=p.device)
    assert s["trace"] == str(trace) and s["kernels_per_step"] == 5
    with trace.open() as f:
        doc = json.load(f)
    names = [e.get("name") for e in doc["traceEvents"]]
    assert names.count(profiling.STEP_NAME) == profiling.ACTIVE and "aten::mm" in names


# ---- XLA HLO on CPU ------------------------------------------------------------------------------------------


@functools.cache
def _jax_parts(mode: str) -> tuple[Any, tuple[Any, ...], Any]:
    """(jitted, args, step) built as ``jax_impl.runner.prepare`` builds them."""
    import jax
    import numpy as np
    from flax import nnx

    from jax_impl import device as dev
    from jax_impl.models import build_module

    dev.pin_precision()
    g = golden_for(TINY)
    graphdef, state = nnx.split(build_module(g.problem))
    dtype = dev.JAX_DTYPES[TINY.dtype]
    x = jax.device_put(np.asarray(g.x)).astype(dtype)
    dy = jax.device_put(np.asarray(g.dy)).astype(dtype)

    def apply(st: Any, xx: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, st)(xx)

    if mode == "fwd":
        fwd = jax.jit(apply)
        return fwd, (state, x), lambda: fwd(state, x)

    @jax.jit
    def fwd_bwd(st: Any, xx: jax.Array, gg: jax.Array) -> Any:
        y, vjp = jax.vjp(apply, st, xx)
        return y, vjp(gg)

    return fwd_bwd, (state, x, dy), lambda: fwd_bwd(state, x, dy)


@functools.cache
def _jax_summary(mode: str) -> dict[str, Any]:
    from jax_impl.profiling import profile_jit

    jitted, args, step = _jax_parts(mode)
    return _checked(profile_jit(jitted, args, step))


def _is_gemm(k: dict[str, Any]) -> bool:
    return k["kind"] == "gemm" and (
        "dot" in k["absorbed"] or k["name"] == "dot" or "matmul" in k["name"].lower() or "gemm" in k["name"].lower()
    )


@pytest.mark.standard
def test_jax_xla_geglu_forward_fuses_gelu_with_mul() -> None:
    s = _jax_summary("fwd")
    assert s["source"] == "xla-hlo" and s["device"] == "cpu"
    assert sum(k["count"] for k in s["kernels"] if _is_gemm(k)) == 3  # the 3 projections
    fused = [k for k in s["kernels"] if k["kind"] == "fused"]
    assert any({"tanh", "multiply"} <= set(k["absorbed"]) for k in fused), fused  # GELU (tanh form) and mul fused
    assert s["kernels_per_step"] == 4  # 3 GEMMs + 1 fusion: GELU and the mul never reach memory separately
    assert {m["name"] for m in s["metadata_ops"]} <= {"bitcast", "reshape"}


@pytest.mark.standard
def test_jax_xla_cost_matches_analytic_gemm_flops() -> None:
    cost = _jax_summary("fwd")["xla_cost"]
    gemm_flops = 2 * T * DIM * HIDDEN * 3
    print(f"XLA cost {cost}; analytic GEMM flops {gemm_flops}")
    # XLA counts the GEMMs (2*T*dim*hidden each) plus the elementwise GELU/mul work (a few flops per hidden element)
    assert gemm_flops <= cost["flops"] <= 1.05 * gemm_flops
    assert cost["transcendentals"] == T * HIDDEN  # one tanh per hidden element
    assert cost["bytes_accessed"] > 0


def test_jax_xla_geglu_forward_backward() -> None:
    s = _jax_summary("fwd+bwd")
    assert sum(k["count"] for k in s["kernels"] if _is_gemm(k)) == 9  # 3 forward + 6 backward GEMMs
    assert any("tanh" in k["absorbed"] for k in s["kernels"])
    assert _jax_summary("fwd+bwd")["xla_cost"]["flops"] >= 3 * 2 * T * DIM * HIDDEN * 3


def test_jax_trace_written(tmp_path: Path) -> None:
    from jax_impl.profiling import profile_jit

    jitted, args, step = _jax_parts("fwd")
    s = profile_jit(jitted, args, step, tmp_path / "jax-trace")
    assert s["trace"] is not None and Path(s["trace"]).is_file()
    assert Path(s["trace"]).is_relative_to(tmp_path / "jax-trace")
    assert s["kernels_per_step"] == _jax_summary("fwd")["kernels_per_step"]


@pytest.mark.standard
def test_torch_triton_fused_forward_backward_counts_what_runs_inside_the_backward() -> None:
    """11 kernels per step: forward, the fused gate/up GEMM and the down GEMM; the down projection's backward, 2
    Triton GEMMs; the fused step's backward, 2 recompute GEMMs (g, u), the Triton GeGLU backward and 4 GEMMs (dx
    in two, dgate, dup). The interpreter's launch ranges cover the launches only, so nothing is hidden inside an
    autograd node (counting a whole ``*Backward`` range as one kernel used to give 4)."""
    s = _torch_summary("torch-triton-fused", "fwd+bwd")
    assert s["kernels_per_step"] == 11, s["kernels"]
    if _on_cuda(s):
        assert ks.count_by_kind(s)["gemm"] >= 6, s["kernels"]  # the torch GEMMs; Triton's own are named by kernel
    else:
        triton = {k["name"]: k["count"] for k in s["kernels"] if k["kind"] == "custom"}
        assert triton == {
            "triton::_glu_matmul_kernel": 1,
            "triton::_matmul_kernel": 3,
            "triton::_glu_bwd_kernel": 1,
        }, s["kernels"]
        assert ks.count_by_kind(s)["gemm"] == 6, s["kernels"]


def test_profiler_chatter_is_kept_off_the_terminal_and_nothing_else(capfd: pytest.CaptureFixture[str]) -> None:
    """Kineto's notices written to fd 2 while profiling are dropped; any other line written there is kept."""
    import os

    from torch_impl.quiet_stderr import filtered_stderr

    with filtered_stderr():
        os.write(2, b"USDT:2026-11-30 03:42:23 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real warning from C++\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "a real warning from C++" in err
    from torch_impl import profiling

    p = _torch_prepared("torch-eager", "fwd")
    assert profiling.profile_step(p.step, p.sync, device=p.device)["kernels_per_step"] == 5  # a real profile ...
    assert "ActivityProfiler" not in capfd.readouterr().err  # ... whose notices do not reach the terminal
