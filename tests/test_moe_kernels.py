"""The MoE backends of issue 48 item 3's second half: the two torch forms under ``torch.compile``
(``torch-moe-loop-compile``, ``torch-moe-grouped-compile``), the hand-written Triton grouped GEMMs
(``torch-moe-triton``, ``torch_impl.ops.moe_triton``; interpreted here) and the Pallas grouped GEMMs
(``jax-moe-pallas``, ``jax_impl.ops.moe_pallas``; ``interpret=True`` here).

Each backend passes the gate through the command line on the three CPU presets in float32 (bfloat16 on mixtral-cpu).
Each kernel, on its own, matches the float64 golden of its routing on ``tests/test_moe_torch_ops.py``'s float32 draws
(weights at 3 / sqrt(fan_in), where gpt-oss's clamp binds), to that file's float32 tolerance. Negative controls: each
kernel run with gate and up taken in the other layout fails the gate through the command line, and with gpt-oss's
clamp dropped (``limit`` infinite) misses the golden of the true block on the draw where the clamp binds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from compare.backends.registry import Availability, BackendSpec, Prepared, register, unregister
from compare.cli.main import main
from compare.problem import moe
from compare.problem.cases import MOE_MODELS
from compare.problem.golden import Problem
from compare.results.document import Result, read_json
from jax_impl import runner as jax_runner
from jax_impl.ops.moe_pallas import moe_pallas
from tests import test_moe_torch_ops as ops_tests
from torch_impl import device as dev
from torch_impl import moe_ops
from torch_impl import runner as torch_runner
from torch_impl.ops.moe_triton import moe_triton

pytestmark = pytest.mark.slow

PRESETS = ("qwen3-moe-cpu", "mixtral-cpu", "gpt-oss-20b-cpu")
NEW_BACKENDS = ("torch-moe-loop-compile", "torch-moe-grouped-compile", "torch-moe-triton", "jax-moe-pallas")
FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet", "--cache", "warm"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread (tests/test_moe_cases.py's reason: the MoE loop's small ops on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(tmp_path: Path, *args: str) -> tuple[int, list[Result]]:
    """``python -m compare run ARGS`` through ``main``: its exit status and its results."""
    out = tmp_path / "out"
    status = main(["run", *args, *FAST, "--out", str(out)])
    return status, list(read_json(out / "results.json").results)


# Dynamo, tracing torch-moe-loop-compile's loop across its graph breaks, reads .grad of the per-expert weight views
# (unbind's outputs, not leaves), which warns; pytest's filterwarnings=error would make that an error of the run.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
@pytest.mark.parametrize("preset", PRESETS)
def test_each_new_backend_passes_the_gate_on_each_preset(tmp_path: Path, preset: str) -> None:
    """``run --preset P --mode fwd+bwd --dtype float32`` (mixtral-cpu also bfloat16) with the four new backends: each
    passes (``ok``), its routing judged on the golden and the fresh inputs, no wrong router."""
    dtypes = ["float32", "bfloat16"] if preset == "mixtral-cpu" else ["float32"]
    status, results = _run(
        tmp_path, "--preset", preset, "--mode", "fwd+bwd", "--dtype", *dtypes, "--backend", *NEW_BACKENDS
    )
    assert sorted((r.backend, r.dtype) for r in results) == sorted((b, d) for b in NEW_BACKENDS for d in dtypes)
    for r in results:
        assert r.status == "ok", (r.backend, r.dtype, r.reason)
        assert r.parity is not None and r.parity.routing is not None and not r.parity.routing.wrong_tokens
    assert status == 0


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
def test_each_new_backend_passes_the_gate_in_fwd_and_bwd(tmp_path: Path) -> None:
    """``--mode fwd bwd`` on gpt-oss-20b-cpu in float32: each new backend passes in both (``bwd`` replays one graph
    with ``retain_graph=True``: the compiled MoE blocks erred there until their steps ran with donated buffers off)."""
    status, results = _run(
        tmp_path, "--preset", "gpt-oss-20b-cpu", "--mode", "fwd", "bwd", "--dtype", "float32", "--backend",
        *NEW_BACKENDS,
    )  # fmt: skip
    assert sorted((r.backend, r.mode) for r in results) == sorted((b, m) for b in NEW_BACKENDS for m in ("fwd", "bwd"))
    assert all(r.status == "ok" for r in results), [(r.backend, r.mode, r.reason) for r in results]
    assert status == 0


# --- each kernel against the golden, and its negative controls ------------------------------------------------------


def _torch_block(spec: moe.MoeSpec, params: dict[str, np.ndarray], x: np.ndarray, dy: np.ndarray) -> Any:
    """``torch-moe-triton``'s block in float32: its ``y``, ``dx``, ``d<param>`` and experts."""
    pt = {k: torch.from_numpy(v).float().requires_grad_(True) for k, v in params.items()}
    xt = torch.from_numpy(x).float().requires_grad_(True)
    y, experts = moe_triton(xt, pt, spec)
    grads = torch.autograd.grad(y, [xt, *pt.values()], torch.from_numpy(dy).float())
    out = {"y": y, "dx": grads[0]} | {f"d{k}": g for k, g in zip(pt, grads[1:], strict=True)}
    return {k: v.detach().double().numpy() for k, v in out.items()}, experts.numpy()


def _jax_block(spec: moe.MoeSpec, params: dict[str, np.ndarray], x: np.ndarray, dy: np.ndarray) -> Any:
    """``jax-moe-pallas``'s block in float32 under ``jax.jit``: its ``y``, ``dx``, ``d<param>`` and experts."""
    pj = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}

    def step(p: Any, xx: jax.Array, d: jax.Array) -> Any:
        y, vjp, experts = jax.vjp(lambda p, xx: moe_pallas(p, xx, spec), p, xx, has_aux=True)
        dp, dx = vjp(d)
        return y, dx, dp, experts

    y, dx, dp, experts = jax.jit(step)(pj, jnp.asarray(x, jnp.float32), jnp.asarray(dy, jnp.float32))
    out = {"y": y, "dx": dx} | {f"d{k}": dp[k] for k in params}
    return {k: np.asarray(v, np.float64) for k, v in out.items()}, np.asarray(experts)


BLOCKS = {"triton": _torch_block, "pallas": _jax_block}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kernel", list(BLOCKS))
def test_each_kernel_is_the_golden_of_its_routing(kernel: str, preset: str) -> None:
    """On ``test_moe_torch_ops``' float32 draw (gpt-oss's clamp binds there) the block's ``y``, ``dx`` and every
    gradient are the golden of its routing (which is the golden's) to 4 ulps times the longest reduction."""
    spec = moe.MOE_PRESETS[preset].spec
    params, x, dy = ops_tests._draw(preset, torch.float32)
    ours, experts = BLOCKS[kernel](spec, params, x, dy)
    np.testing.assert_array_equal(experts, moe.route(ops_tests._logits(params, x), spec, moe.Arith.exact()).experts)
    gold = ops_tests._golden(preset, torch.float32, spec, experts)
    assert set(ours) == {"y", "dx"} | {f"d{k}" for k in params}
    assert ops_tests._worst(ours, gold) < ops_tests.DTYPES[torch.float32][1]


@pytest.mark.parametrize("kernel", list(BLOCKS))
def test_each_kernel_without_the_clamp_misses_the_golden(kernel: str) -> None:
    """Negative control: gpt-oss's block with ``limit`` infinite (the clamp dropped from the epilogue) is told
    apart from the golden of the true block by far more than the tolerance, on the draw where the clamp binds."""
    preset = "gpt-oss-20b-cpu"
    spec = moe.MOE_PRESETS[preset].spec
    params, x, dy = ops_tests._draw(preset, torch.float32)
    ours, experts = BLOCKS[kernel](dataclasses.replace(spec, limit=float("inf")), params, x, dy)
    gold = ops_tests._golden(preset, torch.float32, spec, experts)
    assert ops_tests._worst(ours, gold) > 100 * ops_tests.DTYPES[torch.float32][1]


def _swapped(spec: moe.MoeSpec) -> moe.MoeSpec:
    """``spec`` with gate and up taken in the other ``gate_up`` layout (concat <-> interleaved)."""
    return dataclasses.replace(spec, layout="concat" if spec.layout == "interleaved" else "interleaved")


class _SwappedTriton:
    """``torch-moe-triton``'s block launched with gate and up in the other layout (a wrong variant)."""

    name = "torch-moe-triton-swapped"

    def availability(self) -> Availability:
        return dev.triton_availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        block = moe_ops.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], moe_triton)
        block.spec = _swapped(block.spec)
        return torch_runner.prepare(problem, mode, block, timed=False)


class _SwappedPallas:
    """``jax-moe-pallas``'s block with gate and up in the other layout (a wrong variant)."""

    name = "jax-moe-pallas-swapped"

    def availability(self) -> Availability:
        return Availability(True, timed=False)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        def block(params: Any, x: jax.Array, spec: moe.MoeSpec) -> Any:
            return moe_pallas(params, x, _swapped(spec))

        return jax_runner.prepare_moe(problem, mode, block, timed=False)


#: the test variants' backend objects by name (:class:`_Given`)
_VARIANTS: dict[str, Any] = {b.name: b for b in (_SwappedTriton(), _SwappedPallas())}


class _Given(BackendSpec):
    """A registry line whose backend object is a test's variant (:data:`_VARIANTS`), not imported from ``target``."""

    def load(self) -> Any:
        return _VARIANTS[self.name]


SWAPPED = {
    kernel: _Given(name=name, framework=framework, target=__name__, about="a wrong variant", models=MOE_MODELS)
    for kernel, name, framework in (
        ("triton", _SwappedTriton.name, "torch"), ("pallas", _SwappedPallas.name, "jax")
    )
}  # fmt: skip


@pytest.mark.parametrize("kernel", list(SWAPPED))
def test_each_kernel_with_gate_and_up_swapped_fails_the_gate(tmp_path: Path, kernel: str) -> None:
    """Negative control through the command line: the kernel with its ``gate_up`` rows read in the other layout on
    mixtral-cpu (concat, read interleaved) fails parity on ``y``, its routing the golden's."""
    spec = SWAPPED[kernel]
    register(spec)
    try:
        status, (r,) = _run(tmp_path, "--preset", "mixtral-cpu", "--mode", "fwd", "--backend", spec.name)
    finally:
        unregister(spec.name)
    assert status == 1 and r.status == "parity-fail" and r.reason.startswith("y: "), r.reason
    assert r.parity is not None and r.parity.routing is not None and r.parity.routing.rerouted == 0
