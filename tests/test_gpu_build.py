"""GPU-ready without a GPU: the Triton kernels compile for sm_90, bf16/fp16 GEMMs use wgmma, and no bf16/fp16
autotune config spills or exceeds shared memory on sm_90.

The kernels are those the registry's backends name (``BackendSpec.kernels``), each module declaring its builds
(``GPU_BUILD``): the tests read the same list, through the triton side's ``--describe``. Compiles run in
``python -m triton_impl.gpu_build.worker`` subprocesses (this process may have chosen Triton's interpreter), cached
in the user's cache folder, so a rerun takes seconds; a cold run compiles 58 kernels (~35 s on 2 cores). The full
sweep (every dtype, sm_90 and sm_80) is ``make gpu-build``, not a test: its committed output,
``reports/gpu-build/gpu_build.json``, is checked here to be current and clean.

Torch-free: this module imports neither torch nor triton, so it also runs in a bare Triton venv (``make
test-triton36``: triton 3.6.0, the GPU machine's version; run with ``--noconftest``), where the build compiles the
same framework-free kernel modules (``triton_impl``) the backends launch. The test that needs torch says so when it
skips.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from compare.backends import registry
from compare.cli import gpu_build as command
from compare.gpu_build import bridge
from compare.gpu_build.build import build, check_failures, write_outputs
from compare.gpu_build.plan import plan
from compare.report.gpu_build import render_markdown
from compare.results.gpu_build import (
    ARCHS,
    SCHEMA_VERSION,
    SIXTEEN_BIT,
    config_label,
    findings,
    make_row,
    occupancy,
    row_problems,
)
from triton_impl.gpu_build.compiler import parse_ptxas_log, parse_res_usage, tensor_core_instructions

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent
TABLE_DIR = ROOT / "reports" / "gpu-build"
HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = "needs torch (imports the torch launcher torch_impl.ops.glu_matmul); runs in the main venv"
ALL_DTYPES = ("float32", *SIXTEEN_BIT)


def _build(out: Path, **options: Any) -> dict[str, Any]:
    """Build (``compare.gpu_build.build``, two workers) and write ``out``; return its gpu_build.json."""
    write_outputs(build(jobs=2, **options), out)
    return json.loads((out / "gpu_build.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Any]:
    """The triton side's catalogue of the registry's kernel modules (``--describe``: no compile)."""
    return bridge.describe(bridge.kernel_modules())


def _functions(catalogue: dict[str, Any], gemm: bool) -> set[str]:
    """The kernels' function names: the autotuned GEMMs, or the fixed-launch (elementwise) ones."""
    return {k["function"] for k in catalogue["kernels"].values() if (k["autotune_list"] is not None) is gemm}


@pytest.fixture(scope="module")
def sixteen_bit_sm90(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every bf16/fp16 autotune config (and elementwise launch) of every kernel and launch, built for sm_90."""
    return _build(tmp_path_factory.mktemp("gpu16"), archs=["sm_90"], dtypes=list(SIXTEEN_BIT))


@pytest.fixture(scope="module")
def fp32_sm90(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One config per kernel and launch (the smallest tile) in float32, built for sm_90."""
    return _build(tmp_path_factory.mktemp("gpu32"), archs=["sm_90"], dtypes=["float32"], quick=True)


def _label(row: dict[str, Any]) -> str:
    return f"{row['kernel']} [{row['launch']}] {row['config_label']} {row['dtype']} {row['arch']}"


# ---------------------------------------------------------------------------------------------------------------
# Compiles (subprocesses)

#: The sm_90 build of every kernel and config (58 kernels, about 30 s cold on 2 cores): in ``make test`` under the
#: GPU machine's Triton (``make test-triton36``, which runs this module unfiltered), under this environment's Triton
#: in the slow tier.
IN_T36_OR_SLOW = pytest.mark.slow


@IN_T36_OR_SLOW
def test_every_kernel_compiles_for_sm90_in_every_dtype(catalogue, sixteen_bit_sm90, fp32_sm90):
    rows = sixteen_bit_sm90["rows"] + fp32_sm90["rows"]
    failed = [f"{_label(r)}: {r['error']}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    built = {(r["kernel"], r["dtype"]) for r in rows}
    assert built == {(k["function"], d) for k in catalogue["kernels"].values() for d in ALL_DTYPES}
    for r in rows:
        assert 0 < r["registers"] <= 255, _label(r)
        assert r["shared_bytes"] <= ARCHS["sm_90"].smem_per_block or r["dtype"] == "float32", _label(r)
        assert r["occupancy"]["warps"] > 0 or r["dtype"] == "float32", _label(r)


@IN_T36_OR_SLOW
def test_sixteen_bit_gemms_use_wgmma_and_fp32_stays_ieee(catalogue, sixteen_bit_sm90, fp32_sm90):
    gemms = _functions(catalogue, gemm=True)
    assert gemms, "no autotuned GEMM among the registry's kernels"
    for r in sixteen_bit_sm90["rows"] + fp32_sm90["rows"]:
        if r["dtype"] not in SIXTEEN_BIT:  # fp32 dots use input_precision="ieee" (no TF32 tensor cores)
            assert r["tensor_cores"] == "none", _label(r)
        elif r["kernel"] in gemms:
            assert r["tensor_cores"] == "wgmma" and r["tensor_core_instructions"] > 0, _label(r)
        else:  # a fixed launch: an elementwise kernel has no dot, a fixed-config GEMM (the MoE kernels') uses wgmma
            assert r["tensor_cores"] == ("wgmma" if r["tensor_core_instructions"] else "none"), _label(r)


@IN_T36_OR_SLOW
def test_no_sixteen_bit_autotune_config_spills_or_overflows_shared_memory_on_sm90(sixteen_bit_sm90):
    kernels = sixteen_bit_sm90["kernels"]
    n_expected = sum(
        len(k["configs"]) * len(k["launches"]) * len(SIXTEEN_BIT) for k in kernels.values() if k["autotune_list"]
    )
    autotune_rows = [r for r in sixteen_bit_sm90["rows"] if r["origin"] == "autotune"]
    assert len(autotune_rows) == n_expected
    bad = findings(sixteen_bit_sm90)
    assert not bad, "\n".join(f"{_label(r)}: {'; '.join(p)}" for r, p in bad)


def test_committed_table_is_current_and_clean(catalogue):
    """reports/gpu-build is what `make gpu-build` writes for this checkout's registry, kernels and autotune lists."""
    table = json.loads((TABLE_DIR / "gpu_build.json").read_text(encoding="utf-8"))
    stale = "reports/gpu-build is stale: run `make gpu-build` and commit it"
    assert table["modules"] == catalogue["modules"], stale
    assert list(table["kernels"]) == list(catalogue["kernels"]), stale
    for kid, now in catalogue["kernels"].items():
        then = table["kernels"][kid]
        for field in ("source_hash", "configs", "launches", "launch_args", "fixed", "file"):
            assert then[field] == now[field], f"{kid} {field} changed; {stale}"
    want = plan(catalogue, ["sm_90", "sm_80"])  # every job make gpu-build builds, with its key
    assert [(r["kernel_id"], r["launch"], r["config"], r["dtype"], r["arch"]) for r in table["rows"]] == [
        (j.kernel_id, j.launch, j.config, j.dtype, j.arch) for j in want
    ], stale
    assert all(r["ok"] for r in table["rows"]), [_label(r) for r in table["rows"] if not r["ok"]]
    assert not findings(table)
    assert (TABLE_DIR / "GPU_BUILD.md").read_text(encoding="utf-8") == render_markdown(table), stale


def test_a_config_that_does_not_compile_is_an_error_row(tmp_path, catalogue):
    # tl.arange needs a power-of-2 range: BLOCK=1000 fails in Triton's front end, in every Triton version.
    kid = next(kid for kid, k in catalogue["kernels"].items() if "BLOCK" in k["configs"][0])
    data = _build(tmp_path, archs=["sm_90"], kernel_ids=[kid], dtypes=["float32"], use_cache=False,
                  overrides={kid: [{"BLOCK": 1000, "num_warps": 4}]})  # fmt: skip
    (row,) = data["rows"]
    assert row["origin"] == "override" and row["config"] == {"BLOCK": 1000, "num_warps": 4, "num_stages": 3}
    assert row["ok"] is False
    assert "power of 2" in row["error"], row["error"]
    assert "registers" not in row
    assert "**error**: " in render_markdown(data)
    assert check_failures(data) == []  # an override is asked for, not part of the product


def test_the_build_reads_the_kernel_modules_the_backends_launch(catalogue):
    """``--describe`` (no compile) loads the modules the registry names, in compiled mode, whether or not torch is
    installed: every kernel is a function of the ``triton_impl`` file it names, with its autotune list (GEMMs) or
    its one launch (elementwise), and every module named declares at least one."""
    assert catalogue["modules"] == sorted({m for s in registry.BACKENDS.values() for m in s.kernels})
    assert {k["module"] for k in catalogue["kernels"].values()} == set(catalogue["modules"])
    for kid, k in catalogue["kernels"].items():
        assert k["file"] == k["module"].replace(".", "/") + ".py" and k["file"].startswith("triton_impl/"), kid
        assert f"def {k['function']}(" in (ROOT / k["file"]).read_text(encoding="utf-8"), kid
        assert k["configs"] and all("num_warps" in c and "num_stages" in c for c in k["configs"]), kid
        assert list(k["launch_args"]) == k["launches"], kid
    assert _functions(catalogue, gemm=True) and _functions(catalogue, gemm=False)


_TOY_MODULE = '''
"""A throwaway kernel module of a throwaway backend: y = 2 x over a flat buffer."""
from triton_impl import env

INTERPRETED = env.choose()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from triton_impl.gpu_build.entry import BuildEntry, flat_ints  # noqa: E402


@triton.jit
def _twice(x):
    return 2.0 * x


@triton.jit
def _toy_double_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    tl.store(y_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


GPU_BUILD = (BuildEntry("toy_double", "_toy_double_kernel", {"y = 2 x": flat_ints()},
                        config={"BLOCK": 256, "num_warps": 4}),)
'''


def test_a_new_backend_with_its_own_kernel_module_is_in_the_build(tmp_path, monkeypatch):
    """The registry is the only list: a backend registered with a kernel module of its own (outside the project)
    puts that module's GPU_BUILD in the catalogue, and its kernel builds, with no other edit."""
    pkg = tmp_path / "toy_kernels_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "double.py").write_text(textwrap.dedent(_TOY_MODULE))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers' environment is built from this process's
    spec = registry.BackendSpec(
        name="toy-triton", target="toy_kernels_pkg.backend", framework="torch", about="a throwaway backend",
        kernels=("toy_kernels_pkg.double",),
    )  # fmt: skip
    registry.register(spec)
    try:
        modules = bridge.kernel_modules()
        assert "toy_kernels_pkg.double" in modules
        catalogue = bridge.describe(modules)
        toy = catalogue["kernels"]["toy_double"]
        assert (toy["function"], toy["file"], toy["launches"]) == (
            "_toy_double_kernel",
            "toy_kernels_pkg/double.py",
            ["y = 2 x"],
        )
        assert toy["configs"] == [{"BLOCK": 256, "num_warps": 4, "num_stages": 3}]
        data = _build(tmp_path / "out", archs=["sm_90"], kernel_ids=["toy_double"], dtypes=["float16"],
                      use_cache=False, modules=modules)  # fmt: skip
    finally:
        registry.unregister(spec.name)
    assert "toy_kernels_pkg.double" not in bridge.kernel_modules()
    (row,) = data["rows"]
    assert row["ok"], row["error"]
    assert (row["kernel"], row["origin"], row["tensor_cores"]) == ("_toy_double_kernel", "fixed", "none")


def test_the_mode_switch_is_the_one_triton_impl_reads():
    """compare.gpu_build.bridge names the switch as a string (the core imports no backend package): it must be the
    one ``triton_impl.env`` reads (importing that module imports no triton)."""
    from triton_impl import env

    assert bridge.TRITON_MODE_ENV == env.MODE_ENV


# ---------------------------------------------------------------------------------------------------------------
# 32-bit offsets (torch)


@pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)
def test_output_span_past_int32_is_refused_before_allocating():
    import torch

    from torch_impl.ops import glu_matmul as gm

    # 700,000 tokens x 3072 = 2,150,400,000 output elements > 2**31; the inputs (537.6M and 2.4M elements) fit.
    # Meta tensors: no memory is allocated, and the check runs before the output would be.
    x = torch.empty((700_000, 768), dtype=torch.bfloat16, device="meta")
    w = torch.empty((3072, 768), dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"^h of shape \(700000, 3072\) spans 2150400000 elements.*2147483648"):
        gm.glu_matmul(x, w, w)
    with pytest.raises(ValueError, match=r"^c of shape \(700000, 3072\) spans"):
        gm.matmul(x, w)
    with pytest.raises(ValueError, match=r"^h of shape \(700000, 3072\)"):
        gm.fused_glu(x.reshape(100, 7000, 768), w, w)
    # The boundary: a contiguous [M, N] output is addressable iff M * N <= 2**31.
    gm._check_int32_span("h", (524_288, 4096), (4096, 1))  # 2**31 elements: last offset 2**31 - 1
    with pytest.raises(ValueError, match="spans 2147487744 elements"):
        gm._check_int32_span("h", (524_289, 4096), (4096, 1))
    gm._check_int32_span("h", (0, 1 << 40), (1 << 40, 1))  # empty: never addressed


# ---------------------------------------------------------------------------------------------------------------
# Pure: occupancy arithmetic, tool-output parsing, the renderer, the CLI's argument forwarding


@pytest.mark.parametrize(
    ("arch", "regs", "warps", "smem", "blocks", "limited_by"),
    [
        # 255 regs -> 32 * 255 = 8160 -> 8192 per warp -> 65536 / 8192 = 8 warps -> one 8-warp block;
        # shared: 233472 // (148480 + 1024) = 1 block too.
        ("sm_90", 255, 8, 148_480, 1, "registers+shared"),
        # 128 regs -> 4096 per warp -> 16 warps -> 4 blocks of 4; shared: 233472 // (98304 + 1024) = 2.
        ("sm_90", 128, 4, 98_304, 2, "shared"),
        # 40 regs -> 1280 per warp -> 51 warps -> 12 blocks of 4; warps: 64 // 4 = 16; shared 233472 // 1024 = 228.
        ("sm_90", 40, 4, 0, 12, "registers"),
        # 32 regs -> 1024 per warp -> 64 warps -> 16 blocks of 4 = the 64-warp limit itself.
        ("sm_90", 32, 4, 0, 16, "registers+warps"),
        # 16 regs, 1 warp: 128 blocks by registers, 64 by warps, but at most 32 blocks per SM.
        ("sm_90", 16, 1, 0, 32, "blocks"),
        # sm_80: 167936 // (98304 + 1024) = 1 block; regs 184 -> 5888 per warp -> 11 warps -> one 8-warp block.
        ("sm_80", 184, 8, 98_304, 1, "registers+shared"),
        # over the per-block limit (166912 B on sm_80): cannot be resident at all.
        ("sm_80", 64, 4, 166_913, 0, "shared"),
        # 245760 B > 232448 B on sm_90 (the fp32 64x128x64 4-stage fused GEMM before the 1 KB static section).
        ("sm_90", 255, 4, 245_760, 0, "shared"),
    ],
)
def test_occupancy_hand_computed(arch, regs, warps, smem, blocks, limited_by):
    occ = occupancy(ARCHS[arch], regs, warps, smem)
    assert (occ["blocks"], occ["warps"], occ["limited_by"]) == (blocks, blocks * warps, limited_by)
    assert occ["fraction"] == blocks * warps / 64


def test_occupancy_refuses_nonsense():
    with pytest.raises(ValueError, match="num_warps >= 1"):
        occupancy(ARCHS["sm_90"], 32, 0, 0)


def test_arch_limits_in_bytes():
    assert (ARCHS["sm_90"].smem_per_block, ARCHS["sm_90"].smem_per_sm) == (232_448, 233_472)
    assert (ARCHS["sm_80"].smem_per_block, ARCHS["sm_80"].smem_per_sm) == (166_912, 167_936)


def test_parse_tool_output():
    log = (
        "ptxas info    : Compiling entry function '_glu_matmul_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for _glu_matmul_kernel\n"
        "    992 bytes stack frame, 988 bytes spill stores, 980 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 992 bytes cumulative stack size\n"
    )
    assert parse_ptxas_log(log) == {"registers": 255, "stack_frame": 992, "spill_stores": 988, "spill_loads": 980}
    assert parse_ptxas_log("ptxas info: nothing") is None
    res = "Resource usage:\n Function _matmul_kernel:\n  REG:109 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:608 TEXTURE:0"
    assert parse_res_usage(res) == {"REG": 109, "STACK": 0, "SHARED": 1024, "LOCAL": 0}
    with pytest.raises(ValueError, match="no 'REG"):
        parse_res_usage("cuobjdump info : File 'x' does not contain device code")
    ptx = "\twgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {...};\n\t@%p1 wgmma.mma_async.sync x;\n"
    assert tensor_core_instructions(ptx) == ("wgmma", 2)
    assert tensor_core_instructions("\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};\n") == ("mma", 1)
    assert tensor_core_instructions("\tld.global.v4.b32 {...};\n") == ("none", 0)


def _row(**kw: Any) -> dict[str, Any]:
    row = {
        "kernel": "_glu_matmul_kernel", "kernel_id": "glu_matmul", "launch": "x @ W^T",
        "config": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
        "config_label": "128x128x64 w8 s3", "origin": "autotune", "dtype": "bfloat16", "arch": "sm_90", "ok": True,
        "error": None, "registers": 255, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0, "local_bytes": 0,
        "static_shared": 1024, "dynamic_shared": 147_456, "shared_bytes": 148_480, "shared_limit": 232_448,
        "tensor_cores": "wgmma", "tensor_core_instructions": 8,
        "occupancy": occupancy(ARCHS["sm_90"], 255, 8, 148_480), "compile_s": 1.3,
    }  # fmt: skip
    row.update(kw)
    return row


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "triton_version": "3.9.0", "specialization": "contiguous", "rows": rows}


def test_row_problems_and_findings():
    clean = _row()
    spill = _row(config_label="128x64x64 w4 s4", spill_stores=992, spill_loads=988, stack_frame=992)
    big = _row(config_label="64x128x64 w4 s4", shared_bytes=246_784)
    error = "CompilationError: at 3:4:\nsrc\narange's range must be a power of 2"
    broken = _row(config_label="1000", ok=False, error=error)
    fp32 = _row(dtype="float32", spill_stores=4244, spill_loads=4032)
    sm80 = _row(arch="sm_80", spill_stores=196, spill_loads=104)
    assert row_problems(clean) == []
    assert row_problems(spill) == ["spills 992 B stores / 988 B loads per thread"]
    assert row_problems(big) == ["needs 246784 B shared memory > 232448 B per block"]
    assert row_problems(broken) == ["does not compile: arange's range must be a power of 2"]
    got = findings(_doc([clean, spill, big, broken, fp32, sm80]))
    assert [r["config_label"] for r, _ in got] == ["128x64x64 w4 s4", "64x128x64 w4 s4", "1000"]  # fp32, sm_80: no


def test_render_markdown_is_a_readable_pure_function_of_the_json():
    rows = [
        _row(),
        _row(config_label="128x64x64 w4 s4", spill_stores=992, spill_loads=988, stack_frame=992),
        _row(kernel="_glu_fwd_kernel", launch="flat", config_label="BLOCK=1000 w4 s3", origin="override",
             ok=False, error="CompilationError: at 3:4:\narange's range must be a power of 2"),
        _row(arch="sm_80", tensor_cores="mma", tensor_core_instructions=128, shared_bytes=98_304,
             shared_limit=166_912, occupancy=occupancy(ARCHS["sm_80"], 255, 8, 98_304)),
    ]  # fmt: skip
    data = _doc(rows)
    md = render_markdown(data)
    assert md == render_markdown(json.loads(json.dumps(data)))  # same JSON, same text
    assert md.startswith("## GPU build (compiled without a GPU)")
    assert "### sm_90: H100/H200 (Hopper)" in md and "### sm_80: A100 (Ampere)" in md
    assert "232,448 B/block" in md and "166,912 B/block" in md
    assert (
        "| _glu_matmul_kernel | x @ W^T | 128x128x64 w8 s3 | bfloat16 | 255 | 0 / 0 | 0 | 148,480 (64 %) | "
        "wgmma (8) | 8 (1 x 8), registers+shared | ok |" in md
    )
    assert "**992 / 988**" in md
    assert "**error**: arange's range must be a power of 2" in md
    assert "mma (128)" in md
    assert "3 builds, 2 compiled, 1 failed." in md
    assert "Violated" in md and "* _glu_matmul_kernel [x @ W^T] 128x64x64 w4 s4 bfloat16: spills 992 B" in md
    assert "Holds" in render_markdown(_doc([_row()]))
    with pytest.raises(ValueError, match="schema"):
        render_markdown({"schema": 0, "rows": []})


def test_a_row_is_made_from_its_build_record():
    """The compare side adds the hardware arithmetic to what the compiler allocated; a job with no record is an
    error row that says why."""
    job = {"function": "_matmul_kernel", "kernel_id": "matmul", "launch": "x @ W^T", "origin": "autotune",
           "config": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
           "dtype": "bfloat16", "arch": "sm_90"}  # fmt: skip
    record = {"key": "k", "ok": True, "error": None, "registers": 109, "stack_frame": 0, "spill_stores": 0,
              "spill_loads": 0, "local_bytes": 0, "static_shared": 1024, "dynamic_shared": 131_072,
              "shared_bytes": 132_096, "tensor_cores": "wgmma", "tensor_core_instructions": 16,
              "compile_s": 2.5}  # fmt: skip
    got = make_row(job, record)
    assert got["config_label"] == "128x128x64 w8 s4" and got["shared_limit"] == 232_448
    assert got["occupancy"] == occupancy(ARCHS["sm_90"], 109, 8, 132_096) and row_problems(got) == []
    committed = json.loads((TABLE_DIR / "gpu_build.json").read_text(encoding="utf-8"))["rows"]
    assert list(got) == list(next(r for r in committed if r["ok"]))  # the committed table's fields, in order
    failed = make_row(job, None, "the worker was killed by signal SIGKILL")
    assert failed["ok"] is False and failed["error"] == "not built: the worker was killed by signal SIGKILL"
    assert row_problems(failed) == ["does not compile: not built: the worker was killed by signal SIGKILL"]
    assert config_label({"BLOCK": 1024, "num_warps": 4, "num_stages": 3}) == "BLOCK=1024 w4 s3"


def _jobs(n: int) -> list[Any]:
    from compare.gpu_build.plan import Job

    config = {"BLOCK": 1024, "num_warps": 4, "num_stages": 3}
    return [Job(f"k{i}", "toy", "_toy", "flat", config, "fixed", "float32", "sm_90") for i in range(n)]


def test_a_worker_that_dies_names_why(tmp_path):
    """A worker that dies before its first record (here: a kernel module that does not exist) fails its whole chunk
    with its exit status and the tail of its stderr, and does not start again."""
    from compare.gpu_build import pool

    got: list[dict[str, Any]] = []
    failed = pool.run(_jobs(3), ["no_such_kernel_module"], got.append, n_workers=2, compile_timeout_s=60,
                      triton_cache=tmp_path)  # fmt: skip
    assert not got and set(failed) == {"k0", "k1", "k2"}
    for reason in failed.values():
        assert reason.startswith("the worker exited with status 1: "), reason
        assert "ModuleNotFoundError: No module named 'no_such_kernel_module'" in reason, reason


def test_a_worker_past_its_compile_timeout_is_stopped(tmp_path, monkeypatch):
    """A worker that writes no record within the compile timeout is ended; the job it was on fails with that
    reason and the rest of its chunk runs in a fresh worker (here each hangs again)."""
    from compare.gpu_build import pool

    (tmp_path / "sleepy_kernels.py").write_text("import time\n\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(pool, "STARTUP_S", 0.0)
    failed = pool.run(_jobs(2), ["sleepy_kernels"], lambda r: None, n_workers=1, compile_timeout_s=1.0,
                      triton_cache=tmp_path)  # fmt: skip
    assert set(failed) == {"k0", "k1"}
    assert all(r.startswith("no build within 1 s, so the worker was stopped") for r in failed.values()), failed


def test_cli_passes_its_options_to_the_build():
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    a = parser.parse_args(["gpu-build", "--arch", "sm_90", "--out", "out/x", "--jobs", "3", "--dtype", "bfloat16",
                           "--no-cache", "--config", 'matmul={"BLOCK_M": 64, "num_warps": 4}',
                           "--cache-dir", "c"])  # fmt: skip
    options = command.build_options(a)
    assert options["archs"] == ["sm_90"] and options["dtypes"] == ["bfloat16"] and options["jobs"] == 3
    assert options["use_cache"] is False and options["cache_dir"] == Path("c").resolve()
    assert options["overrides"] == {"matmul": [{"BLOCK_M": 64, "num_warps": 4}]}
    with pytest.raises(SystemExit):  # argparse refuses a config without num_warps (exit status 2)
        parser.parse_args(["gpu-build", "--config", 'matmul={"BLOCK_M": 64}'])
    env = bridge.compiled_mode_env({"TRITON_INTERPRET": "1", "PYTHONPATH": "elsewhere"})
    assert "TRITON_INTERPRET" not in env and env[bridge.TRITON_MODE_ENV] == "compile"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)
