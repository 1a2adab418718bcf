"""The torch tensor-parallel backends at world size 2 on ``tiny``, run by the TP launcher in ONE worker group for
every cell (start-up costs seconds): parity of the full outputs and gradients against the float64 golden on every
rank, on the golden inputs and on fresh ones, Megatron's collectives (one all-reduce of ``[tokens, dim]`` per
forward, one per backward), and a negative control (a step that skips its all-reduces fails the gate, on fresh
inputs too). In this process, on a one-rank gloo group: the comm-only twin issues exactly the calls counted for the
step (kinds, order, sizes and dtypes), whatever they are."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from compare.backends.registry import spec
from compare.backends.tp import megatron_allreduces
from compare.problem.cases import PRESETS
from compare.run.tp_launch import Job, run_job
from compare.run.tp_worker import Cell
from compare.timing.timer import TimingConfig
from tests.torch_tp_skip_backend import NAME as SKIP
from tests.torch_tp_skip_backend import SPEC as SKIP_SPEC
from torch_impl import collectives as counting
from torch_impl import tp_common as tc

pytestmark = pytest.mark.standard

QUICK = TimingConfig(warmup=1, budget_s=0.02, max_samples=5)
ITEMSIZE = {"float32": 4, "bfloat16": 2}
#: (backend, model, dtype, mode): every torch TP backend, family, dtype and the modes with a backward.
CELLS: tuple[tuple[str, str, str, str], ...] = (
    ("torch-tp", "geglu", "float32", "fwd"),
    ("torch-tp", "geglu", "bfloat16", "fwd+bwd"),
    ("torch-tp", "swiglu", "float32", "fwd+bwd"),
    ("torch-tp", "gelu-mlp", "float32", "fwd+bwd"),
    ("torch-tp", "gelu-mlp", "bfloat16", "bwd"),
    ("torch-tp-manual", "geglu", "float32", "fwd+bwd"),
    ("torch-tp-manual", "swiglu", "bfloat16", "fwd"),
    ("torch-tp-manual", "swiglu", "float32", "bwd"),
    ("torch-tp-manual", "gelu-mlp", "bfloat16", "fwd+bwd"),
    ("torch-tp-manual", "gelu-mlp", "float32", "fwd"),
    ("torch-tp-compile", "geglu", "float32", "fwd"),
    ("torch-tp-compile", "swiglu", "bfloat16", "fwd+bwd"),
    ("torch-tp-compile", "gelu-mlp", "float32", "fwd+bwd"),
    ("torch-tp-triton", "geglu", "float32", "fwd+bwd"),
    ("torch-tp-triton", "swiglu", "bfloat16", "fwd"),
    (SKIP, "geglu", "float32", "fwd"),
    (SKIP, "gelu-mlp", "float32", "fwd+bwd"),
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    tiny = PRESETS["tiny"]
    cells = tuple(Cell(i, b, tiny.case(d, m), mode) for i, (b, m, d, mode) in enumerate(CELLS))
    specs = (*(spec(n) for n in sorted({c[0] for c in CELLS} - {SKIP})), SKIP_SPEC)
    job = Job(
        "torch_impl.tp_runtime",
        "processes",
        2,
        cells,
        specs,
        QUICK,
        threads_total=2,
        profile=True,
        cell_timeout_s=120.0,
    )
    root: Path = tmp_path_factory.mktemp("tp-torch")
    out = run_job(job, root=root)
    assert len(list(root.glob("group-*"))) == 1, "one worker group ran every cell"
    return dict(zip(CELLS, out, strict=True))


REAL = [c for c in CELLS if c[0] != SKIP]


@pytest.mark.parametrize("cell", REAL, ids=["/".join(c) for c in REAL])
def test_parity_on_every_rank(rows: dict[tuple[str, str, str, str], dict[str, Any]], cell: tuple[str, ...]) -> None:
    r = rows[cell]
    assert r["status"] == "ok", r.get("reason")
    assert r["world_size"] == 2
    assert [p["passed"] for p in r["parity"]["processes"]] == [True, True]
    # each rank judges its one device's copy: two copies judged in all, and ranks_checked says so
    assert [len(p["copies"]) for p in r["parity"]["processes"]] == [1, 1]
    assert r["tp"]["ranks_checked"] == 2
    # and on fresh inputs, every rank's copy (a deviation there would be recorded, not promoted: none here)
    assert r["parity"]["checked"][-1] == "fresh inputs"
    assert r["parity"]["fresh"]["tier"] == "pass", r["parity"]["fresh"]


@pytest.mark.parametrize("cell", REAL, ids=["/".join(c) for c in REAL])
def test_megatron_collectives(rows: dict[tuple[str, str, str, str], dict[str, Any]], cell: tuple[str, ...]) -> None:
    backend, _model, dtype, mode = cell
    shape = PRESETS["tiny"].shape
    (c,) = rows[cell]["tp"]["collectives"]
    n = megatron_allreduces(mode)
    assert (c["kind"], c["count"], c["bytes"]) == ("all-reduce", n, n * shape.tokens * shape.dim * ITEMSIZE[dtype])
    assert c["source"] == ("torch.profiler" if backend == "torch-tp-compile" else "CommDebugMode")
    if backend == "torch-tp-compile":  # the forward all-reduce runs inside the compiled graph
        assert c["detail"].startswith(f"{1 if mode != 'bwd' else 0} inside a compiled graph"), c["detail"]


def test_timed_steps_have_comm_and_compute_twins(rows: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
    for cell in REAL:
        r = rows[cell]
        if cell[0] == "torch-tp-triton":  # Triton interpreter on CPU: parity only
            assert r["timing"] is None and r["tp"]["comm"] is None
            continue
        assert r["timing"]["median_s"] > 0 and r["tp"]["comm"]["median_s"] > 0 and r["tp"]["compute"]["median_s"] > 0
        assert r["tp"]["transport"] == "gloo/cpu"
        assert "weights" in r["tp"]["setup_s"]


def test_kernel_tables_list_the_collectives(rows: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
    """The profiled step's kernels include its all-reduces (functional or c10d) next to the compute kernels."""
    for cell in REAL:
        kernels = rows[cell]["kernels"]["kernels"]
        reduces = sum(k["count"] for k in kernels if "all_reduce" in k["name"] or "allreduce" in k["name"])
        assert reduces == megatron_allreduces(cell[3]), (cell, [k["name"] for k in kernels])
        assert any(k["kind"] == "gemm" for k in kernels)


@pytest.mark.parametrize("cell", [c for c in CELLS if c[0] == SKIP], ids=lambda c: "/".join(c))
def test_a_step_without_its_all_reduces_fails_parity(
    rows: dict[tuple[str, str, str, str], dict[str, Any]], cell: tuple[str, ...]
) -> None:
    r = rows[cell]
    assert r["status"] == "parity-fail", r.get("reason")
    copies = [(p["rank"], c["device"]) for p in r["parity"]["processes"] for c in p["copies"]]
    assert [rank for rank, _ in copies] == [0, 1], copies  # each rank judged its one copy
    assert all(f"process {p}, device {d}: y: " in r["reason"] for p, d in copies), r["reason"]
    assert r["tp"]["ranks_checked"] == 2
    assert r["tp"]["collectives"][0]["count"] == 0
    # its fresh step is the same wrong function: it fails there too, on both ranks
    assert r["parity"]["fresh"]["tier"] == "fail"
    assert all(f"process {p}, device {d}: fresh inputs (seed " in r["reason"] for p, d in copies), r["reason"]


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group in this process (file rendezvous), destroyed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_comm_only_twin_replays_the_counted_calls(one_rank: None) -> None:
    """The twin issues what was counted for the step, call for call (kind, size, dtype, order), not the model's
    all-reduces; counting it gives the step's count back. The step here issues an all-gather between two
    all-reduces of different sizes (Megatron's model has neither)."""
    cpu = torch.device("cpu")
    a, b = torch.ones(16), torch.ones(8, dtype=torch.bfloat16)
    gathered = torch.empty(8, dtype=torch.bfloat16)

    def step() -> list[torch.Tensor]:
        dist.all_reduce(a)
        dist.all_gather_single(gathered, b)
        dist.all_reduce(a[:4])
        return [a, gathered]

    counts: list[int] = []

    def count() -> counting.Counted:
        counts.append(1)
        return counting.count_eager(step)

    collectives, comm_only = tc.counted_twins(count, cpu)
    want = (
        counting.Call("all-reduce", 64, torch.float32),
        counting.Call("all-gather", 16, torch.bfloat16),
        counting.Call("all-reduce", 16, torch.float32),
    )
    comm_only()  # its first call builds it from the count (one step, counted)
    assert counting.count_eager(comm_only).calls == want
    assert [(c.kind, c.count, c.bytes) for c in collectives()] == [("all-reduce", 2, 80), ("all-gather", 1, 16)]
    assert counts == [1], "one count, reported and replayed"
    every = (*want, counting.Call("reduce-scatter", 8, torch.float32), counting.Call("all-to-all", 8, torch.float32))
    assert (
        counting.count_eager(tc.replay((*every, counting.Call("broadcast", 4, torch.float32)), cpu)).calls[:-1] == every
    )
    with pytest.raises(ValueError, match="cannot replay a counted 'gather'"):
        tc.replay([counting.Call("gather", 4, torch.float32)], cpu)
