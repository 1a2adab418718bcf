"""The JAX tensor-parallel backends (``jax-tp``, ``jax-tp-shardmap``) at world size 2 on ``tiny``, run by the TP
launcher (``compare.run.tp_launch.run_job``) in both launches of ``jax_impl.tp_runtime``: parity of the full outputs and
gradients against the float64 golden on every process, the collectives read off the compiled HLO (against the
communication model, byte for byte), the step on fresh inputs (every device's copy), the shared timer's step,
comm-only and compute-only twins, and two negative controls: jax-tp-shardmap's step without its psums (every
device's partial ``y``/``dx``) fails the gate, and so does its step with device 1's copy of the replicated ``y``
alone made wrong (``tests.jax_tp_corrupt_backend``): every device's copy is judged, and ``ranks_checked`` counts
the copies judged. Both fail on fresh inputs too.

A launch must set JAX's device count before the backend starts, so every cell runs in worker processes: one job of
``"devices"`` cells (one process with 2 XLA:CPU devices), one of ``"processes"`` cells (2 processes joined over
gloo); each worker group starts once per module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.backends.tp import Group, Launch, ring_bytes
from compare.problem.cases import GLU_ACTIVATIONS, GLU_MODELS, PRESETS, TP_MODELS
from compare.problem.golden import Problem
from compare.run.tp_launch import Job, run_job
from compare.run.tp_worker import Cell
from compare.timing.timer import TimingConfig
from jax_impl import collectives as jax_collectives
from jax_impl import tp_common, tp_runtime
from tests.jax_tp_corrupt_backend import NAME as CORRUPT
from tests.jax_tp_corrupt_backend import SPEC as CORRUPT_SPEC

pytestmark = pytest.mark.slow  # two worker groups start once per module: about a minute

Key = tuple[str, str, str, str]
Rows = dict[Key, dict[str, Any]]

RUNTIME = "jax_impl.tp_runtime"
BACKENDS = ("jax-tp", "jax-tp-shardmap")
QUICK = TimingConfig(warmup=1, budget_s=0.02, max_samples=5)
#: Bytes of one ``[tokens, dim]`` tensor of tiny in float32 (3 * 37 * 96 * 4); XLA:CPU reduces bf16 in f32 too.
UNIT = 3 * 37 * 96 * 4
#: Gradients per model, after ``y``.
GRADS = {
    "geglu": ["dgate", "ddown", "dup"],
    "swiglu": ["dgate", "ddown", "dup"],
    "gelu-mlp": ["db1", "db2", "dfc1", "dfc2"],
}

# ---- the negative control: jax-tp-shardmap's step without its psums, judged as if it were the real step -------

SKIP = "jax-tp-shardmap-skip-psum"
SKIP_SPEC = BackendSpec(
    name=SKIP,
    framework="jax",
    target="tests.test_tp_jax",
    about="jax-tp-shardmap's compute-only twin as the step (a negative control: must fail parity)",
    models=TP_MODELS,
    runtime=RUNTIME,
    launches=("devices", "processes"),
)
#: The tensors the skipped psums leave as one device's partial sum, per mode.
PARTIAL = {"fwd": {"y"}, "bwd": {"dx"}, "fwd+bwd": {"y", "dx"}}


def _partials(mode: str) -> Any:
    """``to_numpy`` of the twin: device 0's row of the ``[world, ...]`` partial ``y``/``dx``, gradients as they are."""

    def grads(dparams: Any, dx: Any) -> dict[str, np.ndarray]:
        g = tp_common.grads_to_numpy(dparams, dx)
        return {**g, "dx": g["dx"][0]}

    if mode == "fwd":
        return lambda y: {"y": tp_common.to_host(y)[0]}
    if mode == "bwd":
        return lambda out: grads(*out)
    return lambda out: {"y": tp_common.to_host(out[0])[0], **grads(*out[1])}


class SkipPsum:
    """Built as ``jax-tp-shardmap`` builds its compute-only twin (``shard_step(..., reduce=False)``), so its
    collectives are counted off the twin's own compiled HLO, and its ``fresh`` is the twin's on fresh inputs."""

    name = SKIP

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        from jax_impl import device as dev
        from jax_impl.backends.pallas import pallas_act_mul

        model = problem.case.model
        glu = model in GLU_MODELS
        mesh = tp_common.make_mesh(group.world_size)
        params, x, dy = tp_common.place_problem(mesh, problem)
        act_mul = pallas_act_mul(GLU_ACTIVATIONS[model]) if glu else None
        twin = tp_common.shard_step(mesh, model, mode, act_mul, params, x, dy, check_vma=not glu, reduce=False)
        return tp_common.prepared(
            mesh,
            twin,
            to_numpy=_partials(mode),
            compute=twin,
            dtype=problem.case.dtype,
            precision=dev.pin_precision(),
            setup_s={},
            layout="jax-tp-shardmap's shards, no psum",
            timed=not glu,  # the Pallas kernel is interpreted on a CPU
        )


BACKEND = SkipPsum()

# ---- the cells ------------------------------------------------------------------------------------------------

DEVICE_CELLS: tuple[Key, ...] = (
    *(
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
    ),
    *((b, "geglu", "float32", "bwd") for b in BACKENDS),
    (SKIP, "geglu", "float32", "fwd"),
    (SKIP, "gelu-mlp", "float32", "fwd+bwd"),
    (SKIP, "swiglu", "float32", "bwd"),
    (CORRUPT, "gelu-mlp", "float32", "fwd+bwd"),  # timed: the last timed call's copies are judged too
)
PROCESS_CELLS: tuple[Key, ...] = (
    *((b, "geglu", "float32", mode) for b in BACKENDS for mode in ("fwd", "fwd+bwd", "bwd")),
    ("jax-tp-shardmap", "gelu-mlp", "bfloat16", "fwd+bwd"),
    (SKIP, "geglu", "float32", "fwd+bwd"),
    (CORRUPT, "gelu-mlp", "float32", "fwd"),
)
REAL = {
    "devices": [c for c in DEVICE_CELLS if c[0] in BACKENDS],
    "processes": [c for c in PROCESS_CELLS if c[0] in BACKENDS],
}
CONTROLS = [("devices", c) for c in DEVICE_CELLS if c[0] == SKIP] + [
    ("processes", c) for c in PROCESS_CELLS if c[0] == SKIP
]
#: What each launch's group reports as its transport, and how many processes check the outputs.
TRANSPORT = {
    "devices": ("XLA:CPU, 2 devices in 1 process", 1),
    "processes": ("XLA:CPU gloo, 2 processes x 1 device", 2),
}
#: A real finding, pinned by cause and tier (as ``tests/test_parity.py`` pins it for jax-xla): GPT-2's MLP in bf16 on
#: XLA:CPU, both bias gradients (the sum over every token of ``dy`` and of ``df``, which JAX's transpose of the bias
#: broadcast reduces in bf16) deviate on their rms (db1 near 1.4x its pass line, db2 near 2.3x); nothing fails and
#: everything else passes.
KNOWN = {("gelu-mlp", "bfloat16"): {"db1", "db2"}}
#: What may deviate on the fresh draw besides (the draw's seed is new every run): on fresh seed 306114840 both
#: jax-tp backends' ``dfc1`` of GPT-2's MLP in bf16 deviated too, on its scale check (scale error -0.000336; the
#: gate names the token sum in the low dtype), where the committed case's ``dfc1`` passes. A seed-dependent finding,
#: recorded and allowed here, never a failure; not yet explained (the single-device seed sweep, tests/test_seeds.py,
#: pins db1 and db2 alone).
FRESH_MAY = {("gelu-mlp", "bfloat16"): {"dfc1"}}
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


def _run(how: str, cells: tuple[Key, ...], root: Path) -> Rows:
    """Every cell of one launch in ONE ``run_job`` call (one worker group), on XLA:CPU."""
    tiny = PRESETS["tiny"]
    job = Job(
        RUNTIME,
        how,
        2,
        tuple(Cell(i, b, tiny.case(d, m), mode) for i, (b, m, d, mode) in enumerate(cells)),
        (*(spec(b) for b in BACKENDS), SKIP_SPEC, CORRUPT_SPEC),
        QUICK,
        threads_total=2,
        cell_timeout_s=120.0,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_PLATFORMS", "cpu")  # the counts and the pinned finding are XLA:CPU's
        out = run_job(job, root=root)
    assert len(list(root.glob("group-*"))) == 1, "one worker group ran every cell"
    return dict(zip(cells, out, strict=True))


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rows]:
    return {
        "devices": _run("devices", DEVICE_CELLS, tmp_path_factory.mktemp("tp-jax-devices")),
        "processes": _run("processes", PROCESS_CELLS, tmp_path_factory.mktemp("tp-jax-processes")),
    }


def _explain(r: dict[str, Any]) -> str:
    lines = [f"{r['backend']} {r['case']} {r['mode']}: {r['status']} {r.get('reason', '')}"]
    for t in (r.get("parity") or {}).get("tensors", []):
        lines.append(f"  {t['tensor']}: err {t['max_abs_err']:.3g} bound {t['bound']:.3g} failed {t['failed']}")
    return "\n".join(lines)


def _failed(r: dict[str, Any]) -> set[str]:
    return {t["tensor"] for t in r["parity"]["tensors"] if not t["passed"]}


ALL_REAL = [(how, c) for how, cells in REAL.items() for c in cells]


@pytest.mark.parametrize(("how", "cell"), ALL_REAL, ids=[f"{h}/{'/'.join(c)}" for h, c in ALL_REAL])
def test_parity_on_every_process(groups: dict[str, Rows], how: str, cell: Key) -> None:
    """Every process gathers the full tensors and checks them itself; only the pinned finding fails."""
    r = groups[how][cell]
    _backend, model, dtype, mode = cell
    names = ({"y"} if mode != "bwd" else set()) | ({"dx", *GRADS[model]} if mode != "fwd" else set())
    assert {t["tensor"] for t in r["parity"]["tensors"]} == names, _explain(r)
    transport, nproc = TRANSPORT[how]
    assert r["world_size"] == 2 and r["tp"]["ranks_checked"] == 2
    assert (r["tp"]["launch"], r["tp"]["transport"], r["tp"]["nproc"]) == (how, transport, nproc)
    known = KNOWN.get((model, dtype), set()) if mode != "fwd" else set()
    assert [p["rank"] for p in r["parity"]["processes"]] == list(range(nproc))
    # fresh inputs: nothing fails on any copy; the pinned finding may deviate there too (recorded, not promoted)
    fresh = r["parity"]["fresh"]
    assert r["parity"]["checked"][-1] == "fresh inputs" and fresh["failures"] == [], fresh
    assert {f.split(":")[0] for f in fresh["deviations"]} <= known | FRESH_MAY.get((model, dtype), set()), fresh
    if not known:
        assert r["status"] == "ok", _explain(r)
        assert all(p["passed"] for p in r["parity"]["processes"])
        return
    assert r["status"] == "deviates" and r["parity"]["failed"] == [], _explain(r)
    assert _failed(r) == known, _explain(r)
    assert {f.split(":")[0] for f in r["parity"]["deviated"]} == known, r["parity"]["deviated"]
    for t in r["parity"]["tensors"]:
        if t["tensor"] in known:  # the deviating check: the rms, past its pass line, read as unexplained
            assert f"{t['tensor']}:rms" in r["parity"]["deviated"] and t["tier"] == "deviates", _explain(r)
            from tests.parity_backends import unexplained_rms  # here: its import reads every backend's availability

            assert unexplained_rms(t["cause"]), t["cause"]
    assert not any(p["passed"] for p in r["parity"]["processes"])
    assert all(p["tier"] == "deviates" for p in r["parity"]["processes"])
    copies = [(p["rank"], c["device"]) for p in r["parity"]["processes"] for c in p["copies"]]
    assert all(f"process {p}, device {d}: {name}: " in r["reason"] for p, d in copies for name in known), r["reason"]
    if "last_timed" in r["parity"]:  # timed: the output of the last timed call deviates the same way
        assert r["parity"]["last_timed"]["tier"] == "deviates" and r["parity"]["last_timed"]["failures"] == []


@pytest.mark.parametrize(("how", "cell"), ALL_REAL, ids=[f"{h}/{'/'.join(c)}" for h, c in ALL_REAL])
def test_collectives_match_the_model(groups: dict[str, Rows], how: str, cell: Key) -> None:
    """One all-reduce op per step of the planned tensors, from the compiled HLO, and the report's bytes check."""
    backend, model, _dtype, mode = cell
    tp = groups[how][cell]["tp"]
    family = "glu" if model in GLU_MODELS else model
    ops, tensors = next(v for k, v in ALLREDUCES.items() if k[0] == backend and k[1] in ("*", family) and k[2] == mode)
    (c,) = tp["collectives"]
    assert (c["kind"], c["count"], c["bytes"], c["source"]) == ("all-reduce", ops, tensors * UNIT, "compiled HLO"), c
    assert "f32[3,37,96]" in c["detail"] and (tensors == 1 or f"tuple all-reduce of {tensors} x" in c["detail"])
    model_ = tp["comm_model"]
    assert model_["plan"] == spec(backend).comm
    assert (model_["ops"], model_["tensors"]) == (ops, tensors)
    reduced = sum(x["bytes"] for x in tp["collectives"] if x["kind"] == "all-reduce")
    assert reduced == model_["payload_bytes"]
    assert model_["ring_bytes_per_rank"] == ring_bytes(reduced, 2)


@pytest.mark.parametrize("how", ["devices", "processes"])
def test_timed_cells_have_comm_and_compute_twins(groups: dict[str, Rows], how: str) -> None:
    """The Pallas kernel is interpreted without a GPU: the shardmap GLU cells are parity only; everything else is
    timed by the shared timer, with its collectives and its compute timed apart. The group probed its bandwidth."""
    for cell in REAL[how]:
        r = groups[how][cell]
        if cell[0] == "jax-tp-shardmap" and cell[1] in GLU_MODELS:
            assert r["timing"] is None and r["tp"]["comm"] is None and r["tp"]["compute"] is None, cell
        else:
            assert r["timing"]["median_s"] > 0, cell
            assert r["tp"]["comm"]["median_s"] > 0 and r["tp"]["compute"]["median_s"] > 0, cell
        assert r["tp"]["bandwidth"]["bus_bytes_per_s"] > 0, r["tp"]["bandwidth"]


@pytest.mark.parametrize(("how", "cell"), CONTROLS, ids=[f"{h}/{'/'.join(c)}" for h, c in CONTROLS])
def test_a_step_without_its_psums_fails_parity(groups: dict[str, Rows], how: str, cell: Key) -> None:
    """The negative control: one device's partial ``y``/``dx`` in place of the all-reduced ones fails the gate on
    every process (and nothing else does); the twin's compiled HLO has no collective."""
    r = groups[how][cell]
    assert r["status"] == "parity-fail", _explain(r)
    assert _failed(r) == PARTIAL[cell[3]], _explain(r)
    assert not any(p["passed"] for p in r["parity"]["processes"])
    assert r["tp"]["collectives"] == [] and r["tp"]["ranks_checked"] == 2
    fresh = r["parity"]["fresh"]  # the same partial sums on fresh inputs
    assert fresh["tier"] == "fail" and {f.split(":")[0] for f in fresh["failures"]} == PARTIAL[cell[3]], fresh


#: The corrupted-copy control's cell in each launch.
CORRUPTED = {
    how: next(c for c in cells if c[0] == CORRUPT)
    for how, cells in (("devices", DEVICE_CELLS), ("processes", PROCESS_CELLS))
}


@pytest.mark.parametrize("how", ["devices", "processes"])
def test_a_wrong_copy_on_device_1_alone_fails_parity(groups: dict[str, Rows], how: str) -> None:
    """The negative control of the per-device check: ``y`` right on device 0 and scaled on device 1. Device 0's copy
    (the one ``to_host`` reads) passes; device 1's fails, and the reason names its process and device. With both
    devices in one process, reading one copy per process would have passed it."""
    r = groups[how][CORRUPTED[how]]
    assert r["status"] == "parity-fail", _explain(r)
    procs = r["parity"]["processes"]
    copies = [(p["rank"], c["device"], c["passed"]) for p in procs for c in p["copies"]]
    bad_rank = {"devices": 0, "processes": 1}[how]  # device 1 is in process 0's hands, or is process 1's own
    assert [ok for _, _, ok in copies] == [True, False], copies
    (_, bad, _), (_, good, _) = sorted(copies, key=lambda c: c[2])
    assert bad.endswith(" (rank 1)") and good.endswith(" (rank 0)"), copies
    assert [p["passed"] for p in procs] == [p["rank"] != bad_rank for p in procs]
    assert f"process {bad_rank}, device {bad}: y: " in r["reason"], r["reason"]
    assert f"device {good}:" not in r["reason"] and "dx" not in r["reason"], r["reason"]
    if r["parity"].get("last_timed") is not None:  # timed: the last timed call's copy on device 1 fails too
        assert f"process {bad_rank}, device {bad}: last timed call: y: " in r["reason"], r["reason"]
    # so does its copy of the step on fresh inputs, and only that copy
    assert f"process {bad_rank}, device {bad}: fresh inputs (seed " in r["reason"], r["reason"]
    assert r["parity"]["fresh"]["tier"] == "fail" and r["parity"]["fresh"]["failures"][0].startswith("y:")
    if how == "devices":  # process 0 holds the failing copy: its record is that copy's verdict
        assert _failed(r) == {"y"}, _explain(r)


@pytest.mark.parametrize("how", ["devices", "processes"])
def test_ranks_checked_counts_the_device_copies_judged(groups: dict[str, Rows], how: str) -> None:
    """Every device's copy is judged: at world size 2, one process judging both devices' copies (devices) or two
    processes judging one each (processes); ``ranks_checked`` is the number of copies judged, summed over the
    processes, and a process passes exactly when each of its copies does."""
    per_process = {"devices": [2], "processes": [1, 1]}[how]
    for cell, r in groups[how].items():
        procs = r["parity"]["processes"]
        assert [len(p["copies"]) for p in procs] == per_process, (cell, procs)
        devices = [c["device"] for p in procs for c in p["copies"]]
        assert len(set(devices)) == len(devices) == 2, (cell, devices)
        assert r["tp"]["ranks_checked"] == len(devices), (cell, r["tp"]["ranks_checked"])
        assert all(p["passed"] == all(c["passed"] for c in p["copies"]) for p in procs), (cell, procs)


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
    got = {c.kind: (c.count, c.bytes, c.detail) for c in jax_collectives.count_collectives(hlo)}
    assert got == {
        "all-reduce": (1, 48, "one tuple all-reduce of 2 x f32[2,3]"),
        "all-gather": (1, 4, "one all-gather of bf16[2]"),
    }
