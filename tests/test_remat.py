"""The recomputation variants (``remat_of`` in the registry) against their plain twins (issue 19, item 5): each keeps
less for the backward, exactly what its cost-model plan says it keeps, and its backward runs more kernels (the
recomputation), as many more as its plan says.

What the forward keeps is measured directly, not through the report: in torch, the storages the forward created that
are still alive once it has returned (every op's output recorded by a dispatch mode as a weak reference; the
intermediates a forward does not keep die with it), which sees the tensors a checkpoint holds as well as autograd's
saved ones; in JAX, ``saved_residuals`` of the forward (the residuals ``jax.vjp`` keeps, arguments left out)."""

from __future__ import annotations

import math
from typing import Any

import jax
import pytest
import torch
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from compare.backends.registry import BACKENDS, spec
from compare.cost.model import cost
from compare.problem.cases import PRESETS, REMAT_MODELS, Case
from compare.problem.golden import Problem, golden_for
from jax_impl import models as jax_models
from jax_impl.backends import xla_remat
from torch_impl import models as torch_models
from torch_impl.backends import eager_remat

pytestmark = pytest.mark.standard

REMAT = {name: s.remat_of for name, s in BACKENDS.items() if s.remat_of}


def _case(model: str) -> Case:
    return PRESETS["tiny"].case("float32", model=model)


def _problem(case: Case) -> Problem:
    return golden_for(case).problem


def _plan_saved_bytes(case: Case, backend: str) -> int:
    """Bytes of the tensors the backend's cost-model plan says its forward keeps (its inputs aside)."""
    c = cost(case, backend, "fwd+bwd")
    return sum(t.bytes for t in c.tensors if t.name in c.saved)


class _Outputs(TorchDispatchMode):
    """Records a weak reference to the storage of every op's output."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: list[tuple[StorageWeakRef, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.storages.append((StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes()))
        return out


def torch_kept_bytes(module: torch.nn.Module, forward: Any, x: torch.Tensor) -> int:
    """Bytes of the storages ``forward(x)`` created that are alive after it returned, its output's aside."""
    before = {StorageWeakRef(t.untyped_storage()).cdata for t in (x, *module.parameters())}
    rec = _Outputs()
    with rec:
        y = forward(x)
    out = StorageWeakRef(y.untyped_storage()).cdata
    alive = {w.cdata: n for w, n in rec.storages if not w.expired() and w.cdata not in before | {out}}
    del y
    return sum(alive.values())


@pytest.mark.parametrize("model", REMAT_MODELS)
def test_torch_eager_remat_keeps_less_than_torch_eager_and_what_its_plan_says(model: str) -> None:
    assert REMAT["torch-eager-remat"] == "torch-eager"
    case = _case(model)
    problem = _problem(case)
    module = torch_models.build_module(problem, torch.device("cpu"), torch.float32)
    x = torch.from_numpy(problem.x).requires_grad_(True)
    plain = torch_kept_bytes(module, module, x)
    remat = torch_kept_bytes(module, eager_remat.remat_forward(module), x)
    assert plain == _plan_saved_bytes(case, "torch-eager"), (plain, cost(case, "torch-eager", "fwd+bwd").saved)
    assert remat == _plan_saved_bytes(case, "torch-eager-remat"), (remat, cost(case, "torch-eager-remat", "fwd+bwd"))
    assert 0 < remat < plain
    # the control: without a backward to feed (no grad), the same forward keeps nothing
    with torch.no_grad():
        assert torch_kept_bytes(module, module, x.detach()) == 0


def jax_residual_bytes(forward: Any, state: Any, x: jax.Array) -> int:
    """Bytes of the residuals ``jax.vjp(forward, state, x)`` keeps, its arguments aside."""
    res = saved_residuals(forward, state, x)
    return sum(math.prod(a.shape) * a.dtype.itemsize for a, src in res if not src.startswith("from the argument"))


@pytest.mark.parametrize("model", REMAT_MODELS)
def test_jax_xla_remat_keeps_less_than_jax_xla_and_what_its_plan_says(model: str) -> None:
    assert REMAT["jax-xla-remat"] == "jax-xla"
    case = _case(model)
    module = jax_models.build_module(_problem(case))
    graphdef, state = nnx.split(module)
    x = jax.numpy.asarray(_problem(case).x)
    plain = jax_residual_bytes(lambda st, xx: nnx.merge(graphdef, st)(xx), state, x)
    remat = jax_residual_bytes(xla_remat.remat_forward(module), state, x)
    assert remat == _plan_saved_bytes(case, "jax-xla-remat"), remat
    assert 0 < remat < plain
    # jax-xla's forward before XLA fuses it keeps more than its plan's g, u, h (XLA keeps what its fusions read)
    assert plain >= _plan_saved_bytes(case, "jax-xla")


def _kernels_per_step(backend: str, case: Case) -> int:
    prepared = spec(backend).load().prepare(_problem(case), "fwd+bwd")
    assert prepared.profile is not None
    return int(prepared.profile(None)["kernels_per_step"])


@pytest.mark.parametrize("remat", sorted(REMAT))
@pytest.mark.parametrize("model", REMAT_MODELS)
def test_a_remat_backend_runs_more_kernels_than_its_twin_as_its_plan_says(remat: str, model: str) -> None:
    """The backward's recomputation in the profiled kernel counts (fwd+bwd): more than the twin's, by the plan's
    count of recomputed kernels."""
    case = _case(model)
    twin = REMAT[remat]
    extra = _kernels_per_step(remat, case) - _kernels_per_step(twin, case)
    planned = cost(case, remat, "fwd+bwd").model_kernels_per_step - cost(case, twin, "fwd+bwd").model_kernels_per_step
    assert planned > 0
    assert extra == planned, (remat, model, extra, planned)
