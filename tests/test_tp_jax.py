"""The JAX tensor-parallel backends (``jax-tp``, ``jax-tp-shardmap``) at world size 2 on ``tiny``: parity against the
float64 golden, the collectives read off the compiled HLO, and the negative control (the compute-only twin's
partials, no all-reduce, fail the gate), in both launches of ``jax_impl.tp_runtime``.

A launch must set JAX's device count before the backend starts, so every cell runs in fresh worker processes
(``tests/tp_jax_worker.py``): one process with 2 XLA:CPU devices runs all ``"devices"`` cells, one group of 2
processes (gloo) all ``"processes"`` cells; each group starts once per module.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compare.cases import PRESETS
from compare.tp import Launch
from jax_impl import tp_common, tp_runtime

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("jax-tp", "jax-tp-shardmap")
SHAPE = list(PRESETS["tiny"].case("float32").shape.__dict__.values())
#: Bytes of one ``[tokens, dim]`` tensor of tiny in float32 (3 * 37 * 96 * 4); XLA:CPU reduces bf16 in f32 too.
UNIT = 3 * 37 * 96 * 4
#: Gradients per model, after ``y``.
GRADS = {
    "geglu": ["dgate", "ddown", "dup"],
    "swiglu": ["dgate", "ddown", "dup"],
    "gelu-mlp": ["db1", "db2", "dfc1", "dfc2"],
}
DEVICE_CELLS = [
    (b, m, d, mode)
    for b in BACKENDS
    for m, d in (
        ("geglu", "float32"),
        ("geglu", "bfloat16"),
        ("swiglu", "float32"),
        ("gelu-mlp", "float32"),
        ("gelu-mlp", "bfloat16"),
    )
    for mode in ("fwd", "fwd+bwd")
] + [(b, "geglu", "float32", "bwd") for b in BACKENDS]
PROCESS_CELLS = [(b, "geglu", "float32", mode) for b in BACKENDS for mode in ("fwd", "fwd+bwd", "bwd")] + [
    ("jax-tp-shardmap", "gelu-mlp", "bfloat16", "fwd+bwd")
]
#: A real finding, pinned (as ``tests/test_parity.py`` pins it for jax-xla): GPT-2's MLP in bf16 on XLA:CPU, both
#: bias gradients (the sum over every token of ``dy`` and of ``df``, which JAX's transpose of the bias broadcast
#: reduces in bf16) fail the gate's max check (db1 by a ratio near 1.15, db2 near 1.75); everything else passes.
KNOWN = {("gelu-mlp", "bfloat16"): {"db1", "db2"}}
#: Collectives per step read off the compiled HLO on XLA:CPU, world size 2: (all-reduce ops, tensors of
#: ``[tokens, dim]`` they carry). jax-tp-shardmap is Megatron's: one per forward, one (dx) per backward, and XLA's
#: combiner merges the two of fwd+bwd into one tuple op. jax-tp's partitioner reduces the gate's and the up's partial
#: dx apart (one more tensor) for the GLU families.
ALLREDUCES = {
    ("jax-tp-shardmap", "*", "fwd"): (1, 1),
    ("jax-tp-shardmap", "*", "bwd"): (1, 1),
    ("jax-tp-shardmap", "*", "fwd+bwd"): (1, 2),
    ("jax-tp", "*", "fwd"): (1, 1),
    ("jax-tp", "glu", "bwd"): (1, 2),
    ("jax-tp", "glu", "fwd+bwd"): (1, 3),
    ("jax-tp", "gelu-mlp", "fwd+bwd"): (1, 2),
}
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_group(how: str, cells: list[tuple[str, str, str, str]], tmp: Path) -> dict[str, Any]:
    """Start the worker group of ``how`` on ``cells`` and return process 0's document (with start-up seconds)."""
    nproc = 2 if how == "processes" else 1
    job = {
        "how": how,
        "world_size": 2,
        "nproc": nproc,
        "port": _free_port(),
        "timeout_s": 60,
        "cells": [{"backend": b, "model": m, "dtype": d, "mode": mode, "shape": SHAPE} for b, m, d, mode in cells],
        "out": str(tmp / "out.json"),
    }
    (tmp / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    started = time.perf_counter()
    procs = []
    for rank in range(nproc):
        with (tmp / f"rank{rank}.err").open("wb") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.tp_jax_worker", str(tmp / "job.json"), str(rank)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    try:
        for p in procs:
            p.wait(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - started)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errs = {r: (tmp / f"rank{r}.err").read_text(errors="replace")[-2000:] for r in range(nproc)}
    assert [p.returncode for p in procs] == [0] * nproc, errs
    doc = json.loads((tmp / "out.json").read_text(encoding="utf-8"))
    doc["wall_s"] = time.perf_counter() - started
    return doc


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_group("devices", DEVICE_CELLS, tmp_path_factory.mktemp("tp-devices"))


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_group("processes", PROCESS_CELLS, tmp_path_factory.mktemp("tp-processes"))


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for p in doc["processes"] for row in p["rows"]]


def _explain(row: dict[str, Any]) -> str:
    lines = [f"{row['backend']} {row['model']} {row['dtype']} {row['mode']} rank {row['rank']}"]
    for t in row["parity"]["tensors"]:
        lines.append(f"  {t['tensor']}: err {t['max_abs_err']:.3g} bound {t['bound']:.3g} failed {t['failed']}")
    return "\n".join(lines)


def _check_row(row: dict[str, Any]) -> None:
    model, mode = row["model"], row["mode"]
    names = (["y"] if mode != "bwd" else []) + (["dx", *GRADS[model]] if mode != "fwd" else [])
    assert row["tensors"] == sorted(names) and row["shapes_ok"], row["tensors"]
    known = KNOWN.get((model, row["dtype"]), set()) if mode != "fwd" else set()
    assert set(row["failed"]) == known, _explain(row)
    for t in row["parity"]["tensors"]:
        if t["tensor"] in known:
            assert "max" in t["failed"] and t["ratio"] > 1.0, _explain(row)
    # the negative control: rank 0's partial y / dx in place of the all-reduced ones fails the gate
    assert row["twin_failed"] == sorted({"fwd": ["y"], "bwd": ["dx"], "fwd+bwd": ["y", "dx"]}[mode])
    family = "glu" if model in ("geglu", "swiglu") else model
    ops, tensors = next(
        v for k, v in ALLREDUCES.items() if k[0] == row["backend"] and k[1] in ("*", family) and k[2] == mode
    )
    (c,) = row["collectives"]
    assert (c["kind"], c["count"], c["bytes"], c["source"]) == ("all-reduce", ops, tensors * UNIT, "compiled HLO"), c
    assert "f32[3,37,96]" in c["detail"] and (tensors == 1 or f"tuple all-reduce of {tensors} x" in c["detail"])


@pytest.mark.parametrize("cell", DEVICE_CELLS, ids=["-".join(c) for c in DEVICE_CELLS])
def test_devices_launch(devices: dict[str, Any], cell: tuple[str, str, str, str]) -> None:
    assert devices["backend"] == "XLA:CPU, 2 devices in 1 process"
    (row,) = [r for r in _rows(devices) if (r["backend"], r["model"], r["dtype"], r["mode"]) == cell]
    _check_row(row)


@pytest.mark.parametrize("cell", PROCESS_CELLS, ids=["-".join(c) for c in PROCESS_CELLS])
def test_processes_launch(processes: dict[str, Any], cell: tuple[str, str, str, str]) -> None:
    """Each of the 2 processes (gloo, one device each) gathers the full tensors and checks them itself."""
    assert processes["backend"] == "XLA:CPU gloo, 2 processes x 1 device" and processes["max_rank"] == 1.0
    rows = [r for r in _rows(processes) if (r["backend"], r["model"], r["dtype"], r["mode"]) == cell]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for row in rows:
        _check_row(row)
    assert rows[0]["collectives"] == rows[1]["collectives"]


def test_the_shardmap_glu_cells_are_parity_only_on_cpu(devices: dict[str, Any]) -> None:
    """The Pallas kernel is interpreted without a GPU: those cells are never timed; everything else is."""
    for row in _rows(devices):
        assert row["timed"] == (row["backend"] == "jax-tp" or row["model"] == "gelu-mlp"), row


def test_the_runtime_refuses_a_backend_started_with_another_device_count() -> None:
    import jax

    jax.devices()  # this test process's backend is up with its one CPU device
    with pytest.raises(RuntimeError, match="already initialised"):
        tp_runtime.init(Launch(world_size=2, nproc=1, rank=0, how="devices"))
    with pytest.raises(ValueError, match="devices, processes"):
        tp_runtime.init(Launch(world_size=2, nproc=1, rank=0, how="threads"))


def test_collectives_are_read_from_hlo_text() -> None:
    hlo = """HloModule m

ENTRY %main (p: f32[2,3]) -> bf16[4] {
  %p = f32[2,3]{1,0} parameter(0)
  %ar = (f32[2,3]{1,0}, f32[2,3]{1,0}) all-reduce-start(f32[2,3]{1,0} %p, f32[2,3]{1,0} %p), replica_groups={{0,1}}
  %d = (f32[2,3]{1,0}, f32[2,3]{1,0}) all-reduce-done(%ar)
  ROOT %ag = bf16[4]{0} all-gather(bf16[2]{0} %x), dimensions={0}
}
"""
    got = {c.kind: (c.count, c.bytes, c.detail) for c in tp_common.count_collectives(hlo)}
    assert got == {
        "all-reduce": (1, 48, "one tuple all-reduce of 2 x f32[2,3]"),
        "all-gather": (1, 4, "one all-gather of bf16[2]"),
    }
