"""The communication model, the world-size checks, the collective kind, the report's check of the collectives issued
against the model (kinds, calls and bytes, on hand-built records), and the report's TP sections rendered from a real
(framework-free) TP run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compare.backends.registry import register, spec, unregister
from compare.backends.tp import Collective, ring_bytes
from compare.cli.main import main
from compare.cost.comm import COMM_PLANS, comm_cost, shard
from compare.formats.codec import to_json
from compare.kernels.classify import classify
from compare.problem.cases import PRESETS, InputError
from compare.report.render import files
from compare.report.tp import model_check
from compare.results.tp import TPInfo
from compare.run import harness
from compare.run.options import RunOptions
from compare.timing.timer import TimingConfig
from tests.fake_tp_backend import NAME, SPEC

pytestmark = pytest.mark.quick

TINY = PRESETS["tiny"].case("float32")  # 3 x 37 tokens, dim 96: one [tokens, dim] tensor is 42,624 B in float32
UNIT = 3 * 37 * 96


@pytest.mark.parametrize(
    ("plan", "model", "dtype", "mode", "ops", "tensors", "itemsize"),
    [
        ("megatron", "geglu", "float32", "fwd", 1, 1, 4),
        ("megatron", "geglu", "float32", "fwd+bwd", 2, 2, 4),
        ("megatron", "gelu-mlp", "bfloat16", "bwd", 1, 1, 2),
        ("megatron-combined", "swiglu", "float32", "fwd+bwd", 1, 2, 4),
        ("megatron-combined", "swiglu", "bfloat16", "fwd", 1, 1, 4),  # XLA:CPU reduces 16-bit floats in float32
        ("xla-auto", "geglu", "float32", "fwd+bwd", 1, 3, 4),
        ("xla-auto", "gelu-mlp", "float32", "fwd+bwd", 1, 2, 4),
    ],
)
def test_comm_cost(plan: str, model: str, dtype: str, mode: str, ops: int, tensors: int, itemsize: int) -> None:
    case = PRESETS["tiny"].case(dtype, model=model)
    c = comm_cost(case, plan, mode, 2)
    assert (c.ops, c.tensors, c.payload_bytes) == (ops, tensors, tensors * UNIT * itemsize)
    assert c.ring_bytes_per_rank == ring_bytes(c.payload_bytes, 2) == c.payload_bytes  # 2 (p-1)/p = 1 at p = 2
    assert comm_cost(case, plan, mode, 4).ring_bytes_per_rank == 1.5 * c.payload_bytes


def test_every_tp_backend_names_a_known_plan() -> None:
    from compare.backends.registry import BACKENDS

    tp = [s for s in BACKENDS.values() if s.runtime]
    assert len(tp) >= 6
    assert all(s.comm in COMM_PLANS and s.launches for s in tp)


def test_world_size_must_divide_hidden() -> None:
    assert shard(TINY, 8).shape.hidden == 41
    with pytest.raises(InputError, match=r"world size 3 does not divide hidden 328 .* 1, 2, 4, 8, 41"):
        shard(TINY, 3)
    with pytest.raises(InputError, match="no tensor-parallel layout"):
        comm_cost(PRESETS["blog-linear"].case("float32"), "megatron", "fwd", 2)


def test_cli_refuses_a_world_size_that_does_not_divide_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--preset", "tiny", "--world-size", "3", "--out", "unused"]) == 2
    assert "world size 3 does not divide hidden 328" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    [
        "c10d::allreduce_",
        "_c10d_functional::all_reduce",
        "_c10d_functional::wait_tensor",
        "gloo:all_reduce",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "all-reduce",
        "all-reduce-start.3",
    ],
)
def test_collectives_are_their_own_kind(name: str) -> None:
    assert classify(name) == "collective"


def test_not_collectives() -> None:
    assert [classify(n) for n in ("aten::mm", "reduce.1", "aten::sum")] == ["gemm", "reduction", "reduction"]


@pytest.mark.standard
def test_the_report_shows_the_tp_sections() -> None:
    register(SPEC)
    try:
        options = RunOptions(TimingConfig(warmup=1, budget_s=0.02), world_sizes=(1, 2))
        doc = harness.run([TINY], [spec(NAME)], ["fwd", "fwd+bwd"], options)
    finally:
        unregister(NAME)
    got = sorted((r.world_size, r.mode, r.status) for r in doc.results)
    assert got == [(1, "fwd", "ok"), (1, "fwd+bwd", "ok"), (2, "fwd", "ok"), (2, "fwd+bwd", "ok")]
    text = files(doc)["DETAILS.md"]
    assert "## Tensor parallel" in text and "### Collectives per step" in text and "### Set-up" in text
    assert text.count("= model") == 4
    assert "### Scaling" in text and "fair: same total threads" in text


@pytest.mark.standard
def test_world_size_one_runs_with_no_collective() -> None:
    """One rank holds the whole sum: Megatron issues no collective, and neither do the hand-written backends."""
    case = PRESETS["tiny"].case("float32", model="gelu-mlp")
    backends = [spec("torch-tp-manual"), spec("jax-tp-shardmap")]
    doc = harness.run([case], backends, ["fwd+bwd"], RunOptions(TimingConfig(warmup=1, budget_s=0.02)))
    for r in doc.results:
        assert r.status == "ok", r.reason
        assert r.tp is not None and r.tp.world_size == 1
        assert sum(c.count for c in r.tp.collectives) == 0
        assert r.tp.comm_model is not None and r.tp.comm_model["payload_bytes"] == 0


def _issued(*lines: tuple[str, int, int], plan: str = "megatron", mode: str = "fwd+bwd", world: int = 2) -> TPInfo:
    """A TP record of ``tiny`` that issued ``lines`` (kind, calls, bytes), modelled by ``plan``."""
    return TPInfo(
        world_size=world,
        nproc=world,
        launch="processes",
        threads_per_process=1,
        transport="test",
        layout="test",
        collectives=tuple(Collective(k, n, b, "hand-built") for k, n, b in lines),
        comm_model=to_json(comm_cost(TINY, plan, mode, world)),
    )


BYTES = UNIT * 4  # one [tokens, dim] float32 tensor of tiny


def test_the_model_check_passes_the_planned_collectives() -> None:
    assert model_check(_issued(("all-reduce", 2, 2 * BYTES))) == "= model"  # Megatron fwd+bwd: y and dx
    assert model_check(_issued(("all-reduce", 1, 2 * BYTES), plan="megatron-combined")) == "= model"
    assert model_check(_issued(("all-reduce", 0, 0), world=1)) == "= model"  # one rank: none issued, none planned
    assert model_check(replace(_issued(("all-reduce", 2, 2 * BYTES)), comm_model=None)) == "not modelled"


#: Records that issued something else than Megatron's fwd+bwd (2 all-reduces of one [tokens, dim] tensor each).
DIFFERENT: dict[str, tuple[tuple[tuple[str, int, int], ...], str]] = {
    # the same total bytes in other kinds: an all-gather is not an all-reduce
    "other-kinds-same-total": (
        (("all-reduce", 1, BYTES), ("all-gather", 1, BYTES)),
        f"**1 all-reduce ({BYTES:,} B) + 1 all-gather ({BYTES:,} B) != model 2 all-reduce ({2 * BYTES:,} B)** "
        "(differs in kinds, counts, bytes)",
    ),
    # the planned all-reduces and one more collective of another kind (a check of all-reduce bytes passes it)
    "one-more-kind": (
        (("all-reduce", 2, 2 * BYTES), ("all-gather", 1, BYTES)),
        f"**2 all-reduce ({2 * BYTES:,} B) + 1 all-gather ({BYTES:,} B) != model 2 all-reduce ({2 * BYTES:,} B)** "
        "(differs in kinds)",
    ),
    # the same kind and bytes in fewer calls: a combined reduce where the plan has two
    "fewer-calls": (
        (("all-reduce", 1, 2 * BYTES),),
        f"**1 all-reduce ({2 * BYTES:,} B) != model 2 all-reduce ({2 * BYTES:,} B)** (differs in counts)",
    ),
    # the same calls moving other bytes
    "other-bytes": (
        (("all-reduce", 2, BYTES),),
        f"**2 all-reduce ({BYTES:,} B) != model 2 all-reduce ({2 * BYTES:,} B)** (differs in bytes)",
    ),
    # nothing issued where the plan reduces
    "none": ((("all-reduce", 0, 0),), f"**none != model 2 all-reduce ({2 * BYTES:,} B)** (differs in kinds)"),
}


@pytest.mark.parametrize("name", list(DIFFERENT))
def test_the_model_check_names_what_differs(name: str) -> None:
    lines, says = DIFFERENT[name]
    tp = _issued(*lines)
    assert model_check(tp) == says


def test_the_same_total_bytes_in_other_kinds_is_not_the_model() -> None:
    tp = _issued(*DIFFERENT["other-kinds-same-total"][0])
    assert tp.comm_model is not None
    assert sum(c.bytes for c in tp.collectives) == tp.comm_model["payload_bytes"]  # a total alone would pass it
    assert model_check(tp) != "= model"
