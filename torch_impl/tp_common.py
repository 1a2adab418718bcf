"""What the torch tensor-parallel backends share (``compare.backends.tp``): Megatron's layout on local weight slices,
the DTensor plan, the step of each mode, the full gradients for the gate, the comm-only twin (replaying the
collectives ``torch_impl.collectives`` counted) and the compute-only twin.

Layout: gate/up (``fc1``, ``b1``) split by output rows, down (``fc2``) by input columns, ``b2`` whole on every rank
and added once, after the reduce. The world size must divide the hidden width (the DTensor plan would otherwise
rebuild wrong global shapes; JAX refuses uneven shards outright).

Megatron's two conjugate operators (the hand-written backend uses them as they are; the DTensor plan reaches the
same two all-reduces with a root ``PrepareModuleInput``):

- ``f`` (:class:`CopyToTP`) on the block's input: identity forward, all-reduce of the input gradient backward (the
  column-parallel layers' partial ``dx``, summed locally first, reduced ONCE);
- ``g`` (:class:`ReduceFromTP`) on the block's output: all-reduce forward (the row-parallel partial sums), identity
  backward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Replicate

from compare.backends.registry import Availability, Prepared
from compare.backends.tp import Collective, Group, TPParts
from compare.problem.cases import TP_MODELS
from compare.problem.golden import Problem
from compare.problem.weights import linear_weight
from torch_impl import device as dev
from torch_impl import profiling
from torch_impl.collectives import Call, Counted, count_eager
from torch_impl.models import EAGER_ACT_MUL, ActMul, build_module, canonical_params

#: The dimension of each canonical parameter split over the ranks (torch ``(out, in)`` layout); None: whole.
SHARD_DIM: dict[str, int | None] = {"gate": 0, "up": 0, "down": 1, "fc1": 0, "b1": 0, "fc2": 1, "b2": None}
#: Profiler events of a collective (counted as one kernel each, nothing inside them): the functional collectives
#: DTensor and torch.compile call, and the c10d op ``dist.all_reduce`` calls (gloo's own ``gloo:all_reduce`` runs on
#: its worker thread and may be missing from the trace).
COLLECTIVE_EVENTS: frozenset[str] = frozenset(
    {
        "_c10d_functional::all_reduce",
        "_c10d_functional::all_reduce_",
        "_c10d_functional::wait_tensor",
        "c10d::allreduce_",
    }
)

#: Collective bookkeeping ops the profiler records that launch nothing (moved to ``metadata_ops``).
_BOOKKEEPING = frozenset({"_c10d_functional::_wrap_tensor_autograd"})

Forward = Callable[[torch.Tensor], torch.Tensor]


class TorchTPBackend:
    """The base of the torch TP backends: they run wherever torch.distributed does (gloo on CPU, NCCL on CUDA)."""

    name = ""

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))


def check_case(backend: str, problem: Problem, world_size: int, models: Sequence[str] = TP_MODELS) -> None:
    """Refuse a model this backend does not split, or a world size that does not divide the hidden width."""
    model, hidden = problem.case.model, problem.case.shape.hidden
    if model not in models:
        raise ValueError(f"{backend} implements models {', '.join(models)} only, not {model!r}")
    if hidden % world_size:
        raise ValueError(f"{backend}: world size {world_size} does not divide the hidden width {hidden}")


def hidden_slice(hidden: int, rank: int, world_size: int) -> slice:
    """The rows of the hidden width that ``rank`` holds (even split)."""
    n = hidden // world_size
    return slice(rank * n, (rank + 1) * n)


def local_params(problem: Problem, group: Group, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """This rank's slices of the golden weights (canonical names and order, torch layout), as fresh leaf tensors."""
    sl = hidden_slice(problem.case.shape.hidden, group.rank, group.world_size)
    out = {}
    for name in problem.case.weight_shapes():  # canonical order: every rank gathers the gradients in the same order
        t = torch.from_numpy(linear_weight(problem.params[name], "torch"))
        dim = SHARD_DIM[name]
        if dim is not None:
            t = t.narrow(dim, sl.start, sl.stop - sl.start)
        out[name] = t.to(device=device, dtype=dtype).contiguous()
    return out


class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward; backward all-reduces the input gradient (once for all the layers)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() == 1:  # one rank holds the whole sum: no collective (as Megatron)
            return grad
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward (the partial sums of the row-parallel layer); identity backward."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() == 1:  # one rank holds the whole sum: no collective (as Megatron)
            return y
        y = y.contiguous()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def megatron_forward(
    model: str, params: dict[str, torch.Tensor], act_mul: ActMul | None = None, *, comm: bool = True
) -> Forward:
    """The block on this rank's slices, with ``f``/``g`` around it (``comm=False``: without them, a partial and
    wrong output: the compute-only twin). ``act_mul`` replaces a GLU model's eager ``act(g) * u``."""
    f = CopyToTP.apply if comm else _identity
    g = ReduceFromTP.apply if comm else _identity
    p = params
    if model == "gelu-mlp":

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = F.gelu(F.linear(f(x), p["fc1"], p["b1"]), approximate="tanh")
            return g(F.linear(h, p["fc2"])) + p["b2"]

        return forward
    act = act_mul if act_mul is not None else EAGER_ACT_MUL[model]

    def glu_forward(x: torch.Tensor) -> torch.Tensor:
        x = f(x)
        return g(F.linear(act(F.linear(x, p["gate"]), F.linear(x, p["up"])), p["down"]))

    return glu_forward


@functools.cache
def mesh(device_type: str, world_size: int) -> Any:
    """The 1-D ``tp`` device mesh over the default process group (built once per process)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("tp",))


def dtensor_module(problem: Problem, group: Group, act_mul: ActMul | None = None) -> tuple[nn.Module, dict[str, float]]:
    """The case's module under DTensor TP (Colwise gate/up or fc1, Rowwise down or fc2, plus a root
    ``PrepareModuleInput`` so that the input is made a replicated DTensor ONCE: its gradient is then reduced once,
    Megatron's 2 all-reduces per fwd+bwd instead of the default plan's 3). Weights: every rank holds the full golden
    tensors and slices its own (``src_data_rank=None``: no scatter). Returns the module and its set-up seconds."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    device = dev.device()
    t0 = time.perf_counter()
    module = build_module(problem, device, dev.TORCH_DTYPES[problem.case.dtype], act_mul)
    t1 = time.perf_counter()
    cols, row = (("fc1",), "fc2") if problem.case.model == "gelu-mlp" else (("gate_proj", "up_proj"), "down_proj")
    plan: dict[str, Any] = {
        "": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        **{c: ColwiseParallel() for c in cols},
        row: RowwiseParallel(),
    }
    parallelize_module(module, mesh(device.type, group.world_size), plan, src_data_rank=None)
    t2 = time.perf_counter()
    return module, {"build": t1 - t0, "weights": t2 - t1}


def wait(t: Any) -> Any:
    """A tensor whose collective is complete: RowwiseParallel's output (and the reduced input gradient) is an
    ``AsyncCollectiveTensor`` that waits for its all-reduce only when first used; this is that use."""
    if isinstance(t, AsyncCollectiveTensor):
        return t.wait()
    if isinstance(t, DTensor) and isinstance(t._local_tensor, AsyncCollectiveTensor):
        t._local_tensor.wait()
    return t


def _gather_dim(t: torch.Tensor, dim: int, world_size: int) -> torch.Tensor:
    """The full tensor from every rank's slice along ``dim`` (all-gather; outside any timed step)."""
    part = t.movedim(dim, 0).contiguous()
    out = torch.empty((world_size * part.shape[0], *part.shape[1:]), dtype=part.dtype, device=part.device)
    dist.all_gather_into_tensor(out, part)
    return out.movedim(0, dim)


def full_grad(name: str, g: torch.Tensor, world_size: int) -> torch.Tensor:
    """The full gradient of canonical parameter ``name`` (``dx``: already full) from this rank's part."""
    if isinstance(g, DTensor):
        return g.full_tensor()
    dim = SHARD_DIM.get(name[1:]) if name != "dx" else None
    return g if dim is None else _gather_dim(g, dim, world_size)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


@dataclass
class Step:
    """One mode's step over a forward: ``run()`` on the case's inputs, ``to_numpy(output)`` (full tensors, gathered
    here) and ``bind(inputs, slot)``, the step on other inputs (``Prepared.bind``: the full ``x`` ``[batch, seq,
    dim]`` and ``dy`` ``[batch, seq, out]`` as numpy arrays, which every rank gets whole, as it gets the golden ones;
    placed anew at each bind), the weights unchanged."""

    run: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    bind: Callable[[dict[str, np.ndarray], int], Callable[[], Any]]


def build_step(
    problem: Problem, mode: str, forward: Forward, params: Mapping[str, torch.Tensor], world_size: int
) -> Step:
    """The step of ``mode`` (as ``torch_impl.runner``: ``fwd`` under no_grad; ``fwd+bwd``; ``bwd`` over a forward
    run once here) for ``forward`` with the canonical ``params`` it reads (local slices or DTensor parameters).
    Every output is waited for inside the step, so its collectives are inside the timing. Its ``bind`` makes the
    same step on other (full, replicated) inputs: for ``bwd`` over a new forward of the new ``x``, built (and its
    collectives run) at the bind, on every rank alike."""
    any_param = next(iter(params.values()))
    device, dtype = any_param.device, any_param.dtype
    names = ["dx", *(f"d{n}" for n in params)]
    weights = list(params.values())
    if mode != "fwd":
        for t in weights:
            t.requires_grad_(True)

    def placed(a: np.ndarray, grad: bool = False) -> torch.Tensor:
        t = torch.from_numpy(a).to(device=device, dtype=dtype)
        return t.requires_grad_(True) if grad else t

    def grads_np(grads: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
        return {n: _np(full_grad(n, g, world_size)) for n, g in zip(names, grads, strict=True)}

    if mode == "fwd":
        x = placed(problem.x)

        def fwd_on(xx: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return wait(forward(xx))

        def fwd_bind(new: dict[str, np.ndarray], _slot: int) -> Callable[[], Any]:
            xx = placed(new["x"])
            return lambda: fwd_on(xx)

        return Step(lambda: fwd_on(x), lambda out: {"y": _np(out)}, fwd_bind)
    if mode == "fwd+bwd":
        x, dy = placed(problem.x, grad=True), placed(problem.dy)

        def fwd_bwd_on(xx: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
            y = forward(xx)
            grads = torch.autograd.grad(y, [xx, *weights], g)
            return wait(y).detach(), [wait(d) for d in grads]

        def fwd_bwd_bind(new: dict[str, np.ndarray], _slot: int) -> Callable[[], Any]:
            xx, g = placed(new["x"], grad=True), placed(new["dy"])
            return lambda: fwd_bwd_on(xx, g)

        return Step(lambda: fwd_bwd_on(x, dy), lambda out: {"y": _np(out[0]), **grads_np(out[1])}, fwd_bwd_bind)
    if mode == "bwd":
        x, dy = placed(problem.x, grad=True), placed(problem.dy)
        y_graph = forward(x)
        wait(y_graph)  # the forward's all-reduce completes here, in set-up (the step is the backward alone)

        def bwd() -> list[torch.Tensor]:
            return [wait(g) for g in torch.autograd.grad(y_graph, [x, *weights], dy, retain_graph=True)]

        def bwd_bind(new: dict[str, np.ndarray], _slot: int) -> Callable[[], Any]:
            x2, dy2 = placed(new["x"], grad=True), placed(new["dy"])
            y2 = forward(x2)
            wait(y2)
            return lambda: [wait(g) for g in torch.autograd.grad(y2, [x2, *weights], dy2, retain_graph=True)]

        return Step(bwd, grads_np, bwd_bind)
    raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")


def replay(calls: Sequence[Call], device: torch.device) -> Callable[[], list[torch.Tensor]]:
    """A zero-argument callable that issues ``calls`` alone, in their order: each of its kind (``dist.all_reduce``,
    ``all_gather_single``, ``reduce_scatter_single``, ``all_to_all_single``, ``broadcast``) on a zero buffer of
    its counted bytes and dtype (zeros stay finite however often they are summed). A kind it cannot issue is a
    ``ValueError`` naming it, never a silently shorter twin."""
    world = dist.get_world_size()
    ops: list[Callable[[], Any]] = []
    outs: list[torch.Tensor] = []
    for c in calls:
        n = c.nbytes // c.dtype.itemsize
        buf = torch.zeros(n, dtype=c.dtype, device=device)
        if c.kind == "all-reduce":
            ops.append(functools.partial(dist.all_reduce, buf))
            outs.append(buf)
        elif c.kind == "all-gather":
            out = torch.zeros(n * world, dtype=c.dtype, device=device)
            ops.append(functools.partial(dist.all_gather_single, out, buf))
            outs.append(out)
        elif c.kind == "reduce-scatter" and n % world == 0:
            out = torch.zeros(n // world, dtype=c.dtype, device=device)
            ops.append(functools.partial(dist.reduce_scatter_single, out, buf))
            outs.append(out)
        elif c.kind == "all-to-all" and n % world == 0:
            out = torch.zeros_like(buf)
            ops.append(functools.partial(dist.all_to_all_single, out, buf))
            outs.append(out)
        elif c.kind == "broadcast":
            ops.append(functools.partial(dist.broadcast, buf, 0))
            outs.append(buf)
        else:
            raise ValueError(f"the comm-only twin cannot replay a counted {c.kind!r} of {c.nbytes} B at world {world}")

    def run() -> list[torch.Tensor]:
        for op in ops:
            op()
        return outs

    return run


def comm_only(counted: Callable[[], Counted], device: torch.device) -> Callable[[], Any]:
    """The step's collectives alone: exactly the calls ``counted`` for the step (each kind, count and size, in the
    order issued; :func:`replay`), which is what ``TPParts.collectives`` reports. Built on its first call, from the
    count (``counted`` is run once and kept, :func:`counted_twins`: that first call may run one step under the
    counter, on every rank alike). So, as on the JAX side (``jax_impl.tp_common.comm_twin`` replays the all-reduce
    ops read off the step's own compiled HLO), what is timed alone is what the step was seen to issue, not what the
    communication model says it should: a step that issues more, fewer or other collectives than Megatron's shows
    it in both places."""
    return lazy(lambda: replay(counted().calls, device))


def counted_twins(
    count: Callable[[], Counted], device: torch.device
) -> tuple[Callable[[], list[Collective]], Callable[[], Any]]:
    """``TPParts.collectives`` and ``TPParts.comm_only`` from ONE count of the step's collectives (``count`` runs once,
    on the first use of either, and is kept): what is reported is what is replayed."""
    counted = functools.cache(count)
    return (lambda: list(counted().collectives)), comm_only(counted, device)


def lazy(build: Callable[[], Callable[[], Any]]) -> Callable[[], Any]:
    """A callable built on its first call (a compute-only twin that compiles costs nothing unless it is timed)."""
    built: list[Callable[[], Any]] = []

    def run() -> Any:
        if not built:
            built.append(build())
        return built[0]()

    return run


def profile_fn(run: Callable[[], Any], device: str, timed: bool) -> Callable[[Path | None], dict[str, Any]]:
    """``Prepared.profile`` of a TP step: ``torch_impl.profiling`` with the collectives counted as one kernel each
    (kind ``collective``: ``compare.kernels.summary`` classifies them by name)."""

    def profile(path: Path | None) -> dict[str, Any]:
        trace = None if path is None else path / "trace.json"
        steps = (profiling.WAIT, profiling.WARMUP, profiling.ACTIVE) if timed else (0, 0, 1)
        opaque = profiling.interpreted_regions() | COLLECTIVE_EVENTS
        summary = profiling.profile_step(run, dev.sync, trace, device=device, steps=steps, opaque=opaque)
        kernels = []
        for k in summary["kernels"]:
            if k["name"] in _BOOKKEEPING:  # wraps a collective's output for autograd: launches nothing
                summary["metadata_ops"].append({"name": k["name"], "count": k["count"]})
                continue
            kernels.append(k)
        summary["kernels"] = kernels
        summary["kernels_per_step"] = sum(k["count"] for k in kernels)
        notes = [n for n in summary["notes"].split("; ") if n]
        if not any(k["kind"] == "custom" for k in kernels):  # no interpreted Triton launch among the kernels
            notes = [n for n in notes if not n.startswith("Triton interpreter")]
        summary["notes"] = "; ".join(notes)
        return summary

    return profile


def prepared(
    problem: Problem,
    mode: str,
    group: Group,
    step: Step,
    *,
    compute_only: Callable[[], Any],
    count: Callable[[], Counted] | None = None,
    setup_s: dict[str, float],
    layout: str,
    timed: bool = True,
    note: str = "",
) -> Prepared:
    """The ``Prepared`` of a TP step with its ``TPParts`` and its ``bind`` (``Step.bind``). ``count`` counts the
    collectives of one step (``CommDebugMode`` of ``step.run`` by default); it runs once, and the comm-only twin
    replays what it counted (:func:`counted_twins`)."""
    precision = dev.pin_precision()
    device = dev.device()
    collectives, comm = counted_twins(count if count is not None else lambda: count_eager(step.run), device)
    tp = TPParts(
        collectives=collectives,
        comm_only=comm,
        compute_only=compute_only,
        setup_s=setup_s,
        layout=layout,
    )
    return Prepared(
        step=step.run,
        sync=dev.sync,
        to_numpy=step.to_numpy,
        timed=timed,
        note=note,
        device=str(device),
        threads=dev.threads(),
        precision=precision,
        profile=profile_fn(step.run, str(device), timed),
        tp=tp,
        extras={"world_size": group.world_size},
        bind=step.bind,
    )


def local_twin(
    problem: Problem,
    mode: str,
    group: Group,
    act_mul: ActMul | None = None,
    wrap: Callable[[Forward], Forward] | None = None,
) -> Step:
    """The compute-only twin: Megatron's block on this rank's slices with no collective (a partial output);
    ``wrap`` wraps its forward (``torch.compile``)."""
    device, dtype = dev.device(), dev.TORCH_DTYPES[problem.case.dtype]
    params = local_params(problem, group, device, dtype)
    fwd = megatron_forward(problem.case.model, params, act_mul, comm=False)
    return build_step(problem, mode, fwd if wrap is None else wrap(fwd), params, group.world_size)


def dtensor_step(problem: Problem, mode: str, group: Group, module: nn.Module, forward: Forward | None = None) -> Step:
    """The step of a DTensor-parallel ``module`` (or of ``forward`` over it, e.g. its compiled form)."""
    params = dict(canonical_params(module, problem.case.model))
    return build_step(problem, mode, forward if forward is not None else module, params, group.world_size)


def dtensor_layout(problem: Problem, group: Group) -> str:
    cols, row = ("fc1, b1", "fc2") if problem.case.model == "gelu-mlp" else ("gate, up", "down")
    return (
        f"DTensor TP over {group.world_size} ranks: ColwiseParallel({cols}), RowwiseParallel({row}), root "
        "PrepareModuleInput(Replicate) (one dx reduce); weights sliced on each rank (src_data_rank=None)"
    )
