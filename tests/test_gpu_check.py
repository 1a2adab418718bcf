"""``scripts/gpu_check.sh --dry-run``: every step of the GPU check that can run without CUDA, run here, so the
script itself is tested before a GPU is lent (a broken step would otherwise cost device minutes to find)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jax_impl.backends.xla_gemm_fusion import FLAGS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.slow


def _run(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(out)}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


def test_the_dry_run_passes_every_step_it_can_run(tmp_path: Path) -> None:
    p = _run("--dry-run", out=tmp_path)
    steps = (tmp_path / "steps.md").read_text(encoding="utf-8")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in steps.splitlines()[2:]}
    assert rows == {
        "environment": "ok",
        "gpu-build": "ok",
        "tests": "ok",
        "report": "ok",
        "bandwidth": "skipped: needs CUDA (dry run)",
        "gpu-timing": "ok",
        "graphs-report": "ok",
        "memory": "ok",
        "gemm-fusion": "ok",
        "ray-sweep": "ok",
    }, steps
    assert (tmp_path / "gpu-build" / "gpu_build.json").is_file()
    # the GPU timing modes' CPU-side paths: a scripted NVML device's telemetry, a capture refused without CUDA
    timing = json.loads((tmp_path / "gpu-timing" / "gpu_timing.json").read_text(encoding="utf-8"))
    assert timing["ok"] is True and timing["mode"] == "fake" and timing["telemetry"], timing
    graphs = (tmp_path / "graphs" / "DETAILS.md").read_text(encoding="utf-8")
    assert "CUDA graph: not captured: no CUDA device" in graphs and "cold median" in graphs
    assert (tmp_path / "report" / "REPORT.md").is_file()
    assert "## Memory" in (tmp_path / "report" / "DETAILS.md").read_text(encoding="utf-8")
    # the memory readers of a GPU step on scripted devices
    memory = json.loads((tmp_path / "gpu-memory" / "gpu_memory.json").read_text(encoding="utf-8"))
    assert memory["ok"] is True and memory["mode"] == "fake" and len(memory["checks"]) == 4, memory
    # the GEMM-fusion variant's process: started with its flags, it says it needs a GPU (a skip, not a pass)
    fusion = (tmp_path / "gemm-fusion" / "DETAILS.md").read_text(encoding="utf-8")
    assert "| jax-xla-gemm-fusion |" in fusion and "skipped | GPU only: XLA's GPU GEMM-fusion flags" in fusion
    assert all(flag in SCRIPT.read_text(encoding="utf-8") for flag in FLAGS)
    # the two-cell sweep on a local Ray instance: both cells measured by a Ray worker, the instance gone with it
    header = json.loads((tmp_path / "ray-sweep" / "results.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert header["engine"]["name"] == "ray" and header["engine"]["address"] == "local instance", header["engine"]
    rows = json.loads((tmp_path / "ray-sweep" / "results.json").read_text(encoding="utf-8"))["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["node"]["node_id"] for r in rows), rows
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" in SCRIPT.read_text(encoding="utf-8")


def test_a_failing_step_is_recorded_and_the_rest_still_run(tmp_path: Path) -> None:
    """No -x anywhere: a python that fails every command makes every step fail, each recorded, exit non-zero."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n", encoding="utf-8")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT_DIR": str(tmp_path / "out")}
    p = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1, p.stdout
    steps = (tmp_path / "out" / "steps.md").read_text(encoding="utf-8")
    for name in ("gpu-build", "tests", "report", "gpu-timing", "graphs-report", "memory", "gemm-fusion", "ray-sweep"):
        assert f"| {name} | failed (exit 3) |" in steps, steps


def test_unknown_arguments_are_refused(tmp_path: Path) -> None:
    p = _run("--wet-run", out=tmp_path)
    assert p.returncode == 2 and "unknown argument '--wet-run'" in p.stderr
