"""GPU-ready without a GPU: the Triton kernels compile for sm_90, bf16/fp16 GEMMs use wgmma, and no bf16/fp16
autotune config spills or exceeds shared memory on sm_90.

Compiles run in ``python -m triton_impl.gpu_build`` subprocesses (this process may have chosen Triton's interpreter),
cached in the user's cache folder, so a rerun takes seconds; a cold run compiles 58 kernels (~35 s on 2 cores). The
full sweep (every dtype, sm_90 and sm_80) is ``make gpu-build``, not a test: its committed output,
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
from pathlib import Path
from typing import Any

import pytest

from compare.gpu_build import command as gpu_build
from compare.gpu_build.table import (
    ARCHS,
    SCHEMA_VERSION,
    SIXTEEN_BIT,
    findings,
    occupancy,
    parse_ptxas_log,
    parse_res_usage,
    render_markdown,
    row_problems,
)

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent
TABLE_DIR = ROOT / "reports" / "gpu-build"
HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = "needs torch (imports the torch launcher torch_impl.ops.glu_matmul); runs in the main venv"
GEMMS = ("_geglu_matmul_kernel", "_matmul_kernel")
ELEMENTWISE = ("_geglu_fwd_kernel", "_geglu_bwd_kernel")
SUBPROCESS_TIMEOUT_S = 600


def _build(out: Path, *args: str) -> dict[str, Any]:
    """Run ``triton_impl.gpu_build --out OUT ARGS`` in compiled mode; return its gpu_build.json."""
    proc = gpu_build.run(["--out", str(out), "--jobs", "2", *args], timeout=SUBPROCESS_TIMEOUT_S, capture=True)
    assert proc.returncode == 0, f"gpu_build exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads((out / "gpu_build.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sixteen_bit_sm90(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every bf16/fp16 autotune config (and elementwise launch) of every kernel and launch, built for sm_90."""
    return _build(tmp_path_factory.mktemp("gpu16"), "--arch", "sm_90", "--dtype", *SIXTEEN_BIT)


@pytest.fixture(scope="module")
def fp32_sm90(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One config per kernel and launch (the smallest tile) in float32, built for sm_90."""
    return _build(tmp_path_factory.mktemp("gpu32"), "--arch", "sm_90", "--dtype", "float32", "--quick")


def _label(row: dict[str, Any]) -> str:
    return f"{row['kernel']} [{row['launch']}] {row['config_label']} {row['dtype']} {row['arch']}"


# ---------------------------------------------------------------------------------------------------------------
# Compiles (subprocesses)


def test_every_kernel_compiles_for_sm90_in_every_dtype(sixteen_bit_sm90, fp32_sm90):
    rows = sixteen_bit_sm90["rows"] + fp32_sm90["rows"]
    failed = [f"{_label(r)}: {r['error']}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    built = {(r["kernel"], r["dtype"]) for r in rows}
    assert built == {(k, d) for k in GEMMS + ELEMENTWISE for d in ("float32", *SIXTEEN_BIT)}
    for r in rows:
        assert 0 < r["registers"] <= 255, _label(r)
        assert r["shared_bytes"] <= ARCHS["sm_90"].smem_per_block or r["dtype"] == "float32", _label(r)
        assert r["occupancy"]["warps"] > 0 or r["dtype"] == "float32", _label(r)


def test_sixteen_bit_gemms_use_wgmma_and_fp32_stays_ieee(sixteen_bit_sm90, fp32_sm90):
    for r in sixteen_bit_sm90["rows"] + fp32_sm90["rows"]:
        if r["kernel"] in GEMMS and r["dtype"] in SIXTEEN_BIT:
            assert r["tensor_cores"] == "wgmma" and r["tensor_core_instructions"] > 0, _label(r)
        else:  # elementwise kernels have no dot; fp32 dots use input_precision="ieee" (no TF32 tensor cores)
            assert r["tensor_cores"] == "none", _label(r)


def test_no_sixteen_bit_autotune_config_spills_or_overflows_shared_memory_on_sm90(sixteen_bit_sm90):
    kernels = sixteen_bit_sm90["kernels"]
    n_expected = sum(
        len(k["configs"]) * len(k["launches"]) * len(SIXTEEN_BIT) for k in kernels.values() if k["autotune_list"]
    )
    autotune_rows = [r for r in sixteen_bit_sm90["rows"] if r["origin"] == "autotune"]
    assert len(autotune_rows) == n_expected
    bad = findings(sixteen_bit_sm90)
    assert not bad, "\n".join(f"{_label(r)}: {'; '.join(p)}" for r, p in bad)


def test_committed_table_is_current_and_clean(sixteen_bit_sm90):
    """reports/gpu-build is what `make gpu-build` writes for this checkout's kernels and autotune lists."""
    table = json.loads((TABLE_DIR / "gpu_build.json").read_text(encoding="utf-8"))
    stale = "reports/gpu-build is stale: run `make gpu-build` and commit it"
    for kid, now in sixteen_bit_sm90["kernels"].items():
        then = table["kernels"][kid]
        assert then["source_hash"] == now["source_hash"], f"{kid} source changed; {stale}"
        assert then["configs"] == now["configs"], f"{kid} configs changed; {stale}"
        assert then["launches"] == now["launches"], f"{kid} launches changed; {stale}"
    assert {r["arch"] for r in table["rows"]} == {"sm_90", "sm_80"}
    assert {r["dtype"] for r in table["rows"]} == {"float32", *SIXTEEN_BIT}
    assert all(r["ok"] for r in table["rows"]), [_label(r) for r in table["rows"] if not r["ok"]]
    assert not findings(table)
    assert (TABLE_DIR / "GPU_BUILD.md").read_text(encoding="utf-8") == render_markdown(table), stale


def test_a_config_that_does_not_compile_is_an_error_row(tmp_path):
    # tl.arange needs a power-of-2 range: BLOCK=1000 fails in Triton's front end, in every Triton version.
    data = _build(tmp_path, "--arch", "sm_90", "--kernel", "geglu_fwd", "--dtype", "float32", "--no-cache",
                  "--config", 'geglu_fwd={"BLOCK": 1000, "num_warps": 4}')  # fmt: skip
    (row,) = data["rows"]
    assert row["origin"] == "override" and row["config"]["BLOCK"] == 1000
    assert row["ok"] is False
    assert "power of 2" in row["error"], row["error"]
    assert "registers" not in row
    assert "does not compile" in render_markdown(data) or "**error**" in render_markdown(data)


def test_the_build_reads_the_kernel_modules_the_backends_launch():
    """``--describe`` (no compile) loads the framework-free kernel modules themselves, in compiled mode, whether or
    not torch is installed: every kernel is a function of the ``triton_impl`` file it names, with its autotune list
    (GEMMs) or its one launch (elementwise)."""
    proc = gpu_build.run(["--describe"], timeout=SUBPROCESS_TIMEOUT_S, capture=True)
    assert proc.returncode == 0, proc.stderr
    kernels = json.loads(proc.stdout)["kernels"]
    assert {k["function"] for k in kernels.values()} == set(GEMMS + ELEMENTWISE)
    for kid, k in kernels.items():
        assert k["file"].startswith("triton_impl/"), kid
        assert f"def {k['function']}(" in (ROOT / k["file"]).read_text(encoding="utf-8"), kid
        assert k["configs"] and all("num_warps" in c for c in k["configs"]), kid
        assert (k["autotune_list"] is not None) is (k["function"] in GEMMS), kid


def test_the_mode_switch_is_the_one_triton_impl_reads():
    """compare.gpu_build.command names the switch as a string (the core imports no backend package): it must be the one
    ``triton_impl.env`` reads (importing that module imports no triton)."""
    from triton_impl import env

    assert gpu_build.TRITON_MODE_ENV == env.MODE_ENV


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
        gm.geglu_matmul(x, w, w)
    with pytest.raises(ValueError, match=r"^c of shape \(700000, 3072\) spans"):
        gm.matmul(x, w)
    with pytest.raises(ValueError, match=r"^h of shape \(700000, 3072\)"):
        gm.fused_geglu(x.reshape(100, 7000, 768), w, w)
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
        "ptxas info    : Compiling entry function '_geglu_matmul_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for _geglu_matmul_kernel\n"
        "    992 bytes stack frame, 988 bytes spill stores, 980 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 992 bytes cumulative stack size\n"
    )
    assert parse_ptxas_log(log) == {"registers": 255, "stack_frame": 992, "spill_stores": 988, "spill_loads": 980}
    assert parse_ptxas_log("ptxas info: nothing") is None
    res = "Resource usage:\n Function _matmul_kernel:\n  REG:109 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:608 TEXTURE:0"
    assert parse_res_usage(res) == {"REG": 109, "STACK": 0, "SHARED": 1024, "LOCAL": 0}
    with pytest.raises(ValueError, match="no 'REG"):
        parse_res_usage("cuobjdump info : File 'x' does not contain device code")


def _row(**kw: Any) -> dict[str, Any]:
    row = {
        "kernel": "_geglu_matmul_kernel", "kernel_id": "geglu_matmul", "launch": "x @ W^T",
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
        _row(kernel="_geglu_fwd_kernel", launch="flat", config_label="BLOCK=1000 w4 s3", origin="override",
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
        "| _geglu_matmul_kernel | x @ W^T | 128x128x64 w8 s3 | bfloat16 | 255 | 0 / 0 | 0 | 148,480 (64 %) | "
        "wgmma (8) | 8 (1 x 8), registers+shared | ok |" in md
    )
    assert "**992 / 988**" in md
    assert "**error**: arange's range must be a power of 2" in md
    assert "mma (128)" in md
    assert "3 builds, 2 compiled, 1 failed." in md
    assert "Violated" in md and "* _geglu_matmul_kernel [x @ W^T] 128x64x64 w4 s4 bfloat16: spills 992 B" in md
    assert "Holds" in render_markdown(_doc([_row()]))
    with pytest.raises(ValueError, match="schema"):
        render_markdown({"schema": 0, "rows": []})


def test_cli_forwards_its_options_to_the_build():
    ns = argparse.Namespace(arch=["sm_90"], out="out/x", jobs=3, dtype=["bfloat16"], kernel=None, cache_dir=None,
                            no_cache=True, timeout=10.0)  # fmt: skip
    args = gpu_build._forwarded(ns)
    assert args[:2] == ["--arch", "sm_90"] and "--check" in args and "--no-cache" in args
    assert args[args.index("--out") + 1] == str((Path("out/x")).resolve())
    assert args[args.index("--dtype") + 1] == "bfloat16"
    env = gpu_build.compiled_mode_env({"TRITON_INTERPRET": "1", "PYTHONPATH": "elsewhere"})
    assert "TRITON_INTERPRET" not in env and env[gpu_build.TRITON_MODE_ENV] == "compile"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)
