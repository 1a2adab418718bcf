"""Ceilings that are ceilings: each matmul rate is a peak over several samples, the probe keeps to its budget even
where a route is very slow, a 16-bit dtype's ceiling is the faster of its native and float32 routes (a slow native
route is reported as emulated), the records read back what they wrote (an older document too), the environment
names what decides the ceilings, and the summary says when 16-bit matmul is emulated here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from compare.cost.records import EMULATED_BELOW, FLOAT32_ROUTE, NATIVE_ROUTE, Ceiling, Ceilings, CeilingTimings
from compare.formats.codec import from_json, to_json
from compare.report.cost import cost_section
from compare.report.render import environment_section
from compare.report.summary import summary_section
from compare.results.document import Results
from compare.results.environment import (
    ISA_FLAGS,
    Environment,
    cpu_isa_from_cpuinfo,
    current,
    isa_caps,
    numpy_blas,
    xla_max_isa,
)
from tests import fake_clock

pytestmark = pytest.mark.quick

GFLOP = 1e9

#: A ceiling as an older document stored it: the native route only, none of the new fields.
OLD_CEILING: dict[str, Any] = {
    "flops_per_s": 0.93e9,
    "bytes_per_s": 30e9,
    "matmul_shape": [1024, 1024, 1024],
    "copy_bytes": 268435456,
    "dtype": "bfloat16",
    "device": "cpu",
    "precision": {"torch_float32_matmul_precision": "highest"},
    "timing": {
        "matmul": None,
        "matmul_all": {"1024": {"median_s": 2.4, "min_s": 2.3, "flops_per_s": 0.93e9}},
        "copy": None,
    },
}


def _ceiling(native: float, f32: float | None, dtype: str = "bfloat16") -> dict[str, Any]:
    best = max(native, f32 or 0.0)
    route = FLOAT32_ROUTE if f32 is not None and f32 > native else NATIVE_ROUTE
    return {
        **OLD_CEILING,
        "dtype": dtype,
        "flops_per_s": best,
        "native_flops_per_s": native,
        "float32_route_flops_per_s": f32,
        "route": route,
        "aten_cpu_capability": "AVX2",
        "probe_s": 1.4,
    }


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread: a 2-thread GEMM on a loaded 2-core machine waits milliseconds on a descheduled thread
    every call, which would make tiny matrices look as slow as the slowed route."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- the probe ---------------------------------------------------------------------------------------------------


def test_the_ladder_keeps_to_its_deadline_and_never_calls_a_size_that_cannot_fit(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """A matmul route of n**3 x 0.1 ms a call under a 0.2 s deadline, on a fake clock (``tests.fake_clock``: the
    ladder's deadline and the timer read it, and only the route's calls move it), so every decision is the same on
    any machine: sizes 1, 2 and 4 are measured (69 ms of calls), 8's first call (51 ms) is made and then not even two
    more fit before the deadline, and 16 is never called (its first call is predicted to take 410 ms). With real
    sleeps, each overslept on a busy machine, the sizes measured depended on the load."""
    import torch

    from torch_impl import ceilings

    clock = fake_clock.install(monkeypatch)
    slept: dict[int, float] = {}

    def slow(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        n = a.shape[0]
        s = n**3 * 1e-4  # n=4: 6.4 ms, n=8: 51 ms, n=16: 410 ms a call
        slept[n] = slept.get(n, 0.0) + s
        clock.spin(s)
        return out

    budget = 0.2
    start = clock()
    peak, _ = ceilings.ladder(slow, torch.float32, torch.device("cpu"), (1, 2, 4, 8, 16), start + budget)
    spent = clock() - start
    assert 16 not in slept  # its first call alone (410 ms) is predicted not to fit
    assert set(peak.sizes) == {"1", "2", "4"}, peak.sizes
    assert 8 in slept  # tried: its first call fit, and only that one
    assert sum(slept.values()) == pytest.approx(spent)  # nothing but the calls moved the clock
    assert spent <= budget + 8**3 * 1e-4  # within the budget but for one call at most
    assert peak.timing.n >= 5 and peak.flops_per_s == pytest.approx(2 * peak.n**3 / peak.timing.min_s)


def test_bf16_ceiling_is_the_faster_route_and_a_slow_native_route_is_emulated(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    import torch

    from torch_impl import ceilings

    slept: list[float] = []

    def emulated(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The native route of a CPU without 16-bit GEMM instructions: right answer, 0.02 GFLOP/s."""
        torch.mm(a, b, out=out)
        slept.append(2 * a.shape[0] ** 3 / 2e7)  # n=32: 3.3 ms, n=64: 26 ms, n=128: 210 ms
        time.sleep(slept[-1])
        return out

    monkeypatch.setattr(ceilings, "native_matmul", emulated)
    budget = 0.5
    start = time.perf_counter()
    c = ceilings.measure_ceilings("bfloat16", "cpu", budget, matmul_sizes=(32, 64, 128), copy_bytes=1 << 20)
    wall = time.perf_counter() - start
    assert sum(slept) < budget  # the slow route never ran past its share (128's 7 calls would be 1.5 s)
    assert wall < budget + 1.0 and c["probe_s"] <= wall
    native, f32 = c["native_flops_per_s"], c["float32_route_flops_per_s"]
    assert native < 2.1e7 and f32 > native
    assert c["flops_per_s"] == max(native, f32) and c["route"] == FLOAT32_ROUTE
    # the ceiling is a peak over several samples, at the float32 route's best size
    t, n = c["timing"]["matmul"], c["matmul_shape"][0]
    assert t["n"] >= 5 and t["min_s"] <= t["median_s"]
    assert c["flops_per_s"] == pytest.approx(2 * n**3 / t["min_s"])
    assert c["timing"]["float32_route_all"][str(n)]["flops_per_s"] == pytest.approx(c["flops_per_s"])
    assert set(c["timing"]["matmul_all"]) <= {"32", "64"}  # the native route never reached 128
    ceil = from_json(Ceiling, c)
    assert ceil.matmul_emulated and ceil.route == FLOAT32_ROUTE and ceil.flops_per_s == f32
    assert ceil.timing is not None and ceil.timing.float32_route_all == c["timing"]["float32_route_all"]
    assert ceil.aten_cpu_capability == c["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_float32_has_one_route_and_keeps_the_old_keys(one_thread: None) -> None:
    pytest.importorskip("torch")
    from torch_impl import ceilings

    c = ceilings.measure_ceilings("float32", "cpu", 0.2, matmul_sizes=(32, 64), copy_bytes=1 << 20)
    assert set(c["timing"]) == {"matmul", "matmul_all", "copy"}
    assert c["route"] == NATIVE_ROUTE and c["float32_route_flops_per_s"] is None
    assert c["flops_per_s"] == c["native_flops_per_s"] > 0 and c["bytes_per_s"] > 0
    ceil = from_json(Ceiling, c)
    assert not ceil.matmul_emulated and "float32_route_flops_per_s" not in to_json(ceil)
    doc = ceilings.measure_all([], 0.1)
    assert doc == {"device": "cpu"}


# --- the records -------------------------------------------------------------------------------------------------


def test_ceiling_records_round_trip_and_an_older_document_loads() -> None:
    new = from_json(Ceiling, _ceiling(0.96 * GFLOP, 45 * GFLOP))
    assert new.native_flops_per_s == 0.96 * GFLOP and new.float32_route_flops_per_s == 45 * GFLOP
    assert new.route == FLOAT32_ROUTE and new.aten_cpu_capability == "AVX2" and new.probe_s == 1.4
    assert from_json(Ceiling, to_json(new)) == new
    timings = from_json(CeilingTimings, {**OLD_CEILING["timing"], "float32_route_all": {"512": {"min_s": 1.0}}})
    assert from_json(CeilingTimings, to_json(timings)) == timings and timings.float32_route_all
    old = from_json(Ceiling, OLD_CEILING)
    assert old.native_flops_per_s is None and old.float32_route_flops_per_s is None and old.probe_s is None
    assert old.route == NATIVE_ROUTE and old.aten_cpu_capability == "" and not old.matmul_emulated
    assert to_json(old) == OLD_CEILING  # nothing invented: an older document writes back as it was
    both = from_json(Ceilings, {"device": "cpu", "bfloat16": _ceiling(1 * GFLOP, 40 * GFLOP), "float32": OLD_CEILING})
    assert from_json(Ceilings, to_json(both)) == both


@pytest.mark.parametrize(
    ("native", "f32", "emulated"),
    [
        (0.96 * GFLOP, 45 * GFLOP, True),
        (EMULATED_BELOW * 0.99 * 40 * GFLOP, 40 * GFLOP, True),
        (EMULATED_BELOW * 1.01 * 40 * GFLOP, 40 * GFLOP, False),  # slow, but not emulated-slow
        (90 * GFLOP, 45 * GFLOP, False),  # AMX: native beats the float32 route
        (0.96 * GFLOP, None, False),  # float32 route not measured
    ],
)
def test_emulated_means_far_below_the_float32_route(native: float, f32: float | None, emulated: bool) -> None:
    assert from_json(Ceiling, _ceiling(native, f32)).matmul_emulated is emulated


def test_the_roofline_table_names_both_routes_and_the_ceiling() -> None:
    doc = _doc({"device": "cpu", "bfloat16": _ceiling(0.96 * GFLOP, 45 * GFLOP)})
    text = cost_section(doc)
    assert "native 960 MFLOP/s, through float32 45 GFLOP/s: the ceiling is the float32 route (native emulated" in text
    assert "ATen CPU capability AVX2" in text
    old = cost_section(_doc({"device": "cpu", "bfloat16": OLD_CEILING}))
    assert "through float32" not in old and "ATen" not in old


# --- the environment ---------------------------------------------------------------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu sse
"""


def test_instruction_sets_are_read_from_cpuinfo_text() -> None:
    isa = cpu_isa_from_cpuinfo(CPUINFO)
    assert isa == ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
    assert cpu_isa_from_cpuinfo("flags\t: fpu sse sse2 avx fma avx2\n") == ("avx2", "fma")  # an AVX2 CPU
    assert cpu_isa_from_cpuinfo("flags\t: fpu sse sse2\n") == ()  # known: none of them
    assert cpu_isa_from_cpuinfo("processor\t: 0\nFeatures\t: fp asimd bf16\n") is None  # no x86 flags: unknown
    assert set(ISA_FLAGS) >= {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_the_caps_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "OPENBLAS_CORETYPE": "Haswell",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=AVX2",
    }
    assert isa_caps(env) == {
        "OPENBLAS_CORETYPE": "Haswell",
        "xla_cpu_max_isa": "AVX2",
        "ATEN_CPU_CAPABILITY": "",
        "MKL_CBWR": "",
    }
    assert xla_max_isa("--xla_cpu_max_isa=AVX --xla_cpu_max_isa=SSE4_2") == "SSE4_2" and xla_max_isa("") == ""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=SSE4_2")
    e = current({}, {})
    assert e.isa_caps["ATEN_CPU_CAPABILITY"] == "default" and e.isa_caps["MKL_CBWR"] == "COMPATIBLE"
    assert e.isa_caps["xla_cpu_max_isa"] == "SSE4_2"
    assert e.blas and e.blas_core and (e.blas, e.blas_core) == numpy_blas()
    assert from_json(Environment, to_json(e)) == e


def test_an_older_environment_loads_and_reports_as_it_did() -> None:
    old = {"platform": "Linux", "cpu": "AMD EPYC", "cpu_count": 2, "versions": {"numpy": "2.4.6"}}
    e = from_json(Environment, old)
    assert e.cpu_isa is None and e.blas == "" and e.blas_core == "" and e.isa_caps == {}
    assert set(to_json(e)) == {"platform", "cpu", "cpu_count", "gpu", "versions", "threads", "precision"} | {
        "triton_interpret"
    }
    assert "instruction sets" not in environment_section(e)
    new = from_json(
        Environment,
        {
            **old,
            "cpu_isa": ["avx2", "fma", "f16c"],
            "blas": "scipy-openblas 0.3.31",
            "blas_core": "Haswell",
            "isa_caps": isa_caps({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}),
        },
    )
    text = environment_section(new)
    assert "| CPU instruction sets | avx2, fma, f16c |" in text
    assert "| BLAS (numpy) | scipy-openblas 0.3.31, kernel Haswell |" in text
    assert "| ISA caps | xla_cpu_max_isa=AVX2 |" in text


# --- the summary -------------------------------------------------------------------------------------------------


def _doc(ceilings: dict[str, Any] | None) -> Results:
    row = {
        "backend": "torch-eager",
        "model": "geglu",
        "dtype": "bfloat16",
        "shape": {"batch": 1, "seq": 8, "dim": 16, "hidden": 32},
        "case": "c",
        "mode": "fwd",
        "status": "ok",
        "reason": "",
        "note": "",
        "device": "cpu",
        "parity": None,
        "timing": None,
        "threads": {},
        "kernels": None,
        "cost": None,
        "extras": {},
    }
    d: dict[str, Any] = {"results": [row], "environment": {}, "config": {}}
    if ceilings is not None:
        d["ceilings"] = ceilings
    return from_json(Results, d)


def test_the_summary_says_when_16_bit_matmul_is_emulated() -> None:
    text = summary_section(_doc({"device": "cpu", "bfloat16": _ceiling(0.96 * GFLOP, 45 * GFLOP)}))
    assert (
        "bfloat16 matmul is emulated on this machine: native 960 MFLOP/s against 45 GFLOP/s through float32 "
        "(the ceiling uses the faster route)." in text
    )
    for quiet in (
        {"device": "cpu", "bfloat16": _ceiling(90 * GFLOP, 45 * GFLOP)},  # native fast (AMX)
        {"device": "cpu", "bfloat16": OLD_CEILING},  # an older document: native only
        None,  # no ceilings measured
    ):
        text = summary_section(_doc(quiet))
        assert text.startswith("## Summary") and "emulated" not in text
