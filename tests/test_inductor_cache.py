"""Inductor's caches keyed by vector ISA (``torch_impl.device.key_inductor_cache``): torch 2.13 serves a graph
compiled for one vector ISA to a process that generates for another, and that code computes wrong values. Each test
runs in fresh interpreters whose temporary folder (where Inductor's default cache lives) is the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parents[1]

#: One GeGLU forward at unit scale, eager and compiled; prints the ISA, the cache folder and the max difference
#: (``keyed-only``: the folder, nothing compiled).
_PROBE = """
import json, os, sys, torch
from torch_impl import device as dev
keyed = dev.key_inductor_cache() if sys.argv[1].startswith("keyed") else {}
if sys.argv[1] == "keyed-only":
    print(json.dumps({"keyed": keyed, "dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
    sys.exit()
torch.manual_seed(0)
x = torch.randn(3, 37, 96)
w1, w2, w3 = torch.randn(328, 96) / 10, torch.randn(328, 96) / 10, torch.randn(96, 328) / 10
def f(x):
    return (torch.nn.functional.gelu(x @ w1.T, approximate="tanh") * (x @ w2.T)) @ w3.T
err = (torch.compile(f)(x) - f(x)).abs().max().item()
print(json.dumps({"keyed": keyed, "dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "err": err}))
"""


def _probe(tmp: Path, how: str, capability: str | None, cache_dir: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CACHE_DIR")}
    env["TMPDIR"] = str(tmp)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    if cache_dir:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _has_avx512() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.compile
def test_keyed_caches_are_right_under_two_isas_and_a_shared_one_is_not(tmp_path: Path) -> None:
    """Compile at the native ISA, then replay capped at AVX2: with the keyed folders (one per ISA) both are right;
    with one shared folder (the control: the capped run without the keying, in the native run's folder) it goes
    wrong, where the CPU has AVX-512 (elsewhere the cap is the native ISA and both runs generate the same code)."""
    native = _probe(tmp_path, "keyed", None)
    capped = _probe(tmp_path, "keyed", "avx2")
    assert native["err"] < 1e-5 and capped["err"] < 1e-5
    for r in (native, capped):
        assert r["dir"].endswith(f"isa-{r['keyed']['inductor_vec_isa']}"), r
        assert r["keyed"]["inductor_cache"] == "a folder per vector ISA"
    assert (native["dir"] == capped["dir"]) == (native["keyed"] == capped["keyed"])
    if not _has_avx512():
        return  # nothing to control: ATEN_CPU_CAPABILITY=avx2 changes no ISA here
    # the native run's folder, shared: the capped run reads the AVX-512 code compiled there (a probe less than
    # filling a fresh shared folder natively first: each pays Inductor's cold start, about 20 s)
    wrong = _probe(tmp_path, "plain", "avx2", cache_dir=native["dir"])["err"]
    assert wrong > 0.1, f"torch no longer serves another ISA's cached code wrongly (max error {wrong})"


@pytest.mark.slow
def test_a_users_cache_folder_is_kept(tmp_path: Path) -> None:
    mine = str(tmp_path / "mine")
    theirs = _probe(tmp_path, "keyed-only", None, cache_dir=mine)
    assert theirs["dir"] == mine and theirs["keyed"]["inductor_cache"].startswith("TORCHINDUCTOR_CACHE_DIR as set")
