"""What the torch tensor-parallel backends share (``compare.tp``): Megatron's layout on local weight slices, the
DTensor plan, the step of each mode, the full gradients for the gate, the collective count and the comm-only and
compute-only twins.

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
from torch.distributed.tensor.debug import CommDebugMode

from compare.golden import Problem
from compare.registry import Availability, Prepared
from compare.tp import Collective, Group, TPParts, megatron_allreduces
from compare.weights import linear_weight
from torch_impl import device as dev
from torch_impl import profiling
from torch_impl.models import EAGER_ACT_MUL, ActMul, build_module, canonical_params

#: The models run tensor-parallel (``linear`` has no column/row pair).
TP_MODELS: tuple[str, ...] = ("geglu", "swiglu", "gelu-mlp")
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
    """One mode's step over a forward: ``run()`` and ``to_numpy(output)`` (full tensors, gathered here)."""

    run: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]


def build_step(
    problem: Problem, mode: str, forward: Forward, params: Mapping[str, torch.Tensor], world_size: int
) -> Step:
    """The step of ``mode`` (as ``torch_impl.runner``: ``fwd`` under no_grad; ``fwd+bwd``; ``bwd`` over a forward
    run once here) for ``forward`` with the canonical ``params`` it reads (local slices or DTensor parameters).
    Every output is waited for inside the step, so its collectives are inside the timing."""
    any_param = next(iter(params.values()))
    device, dtype = any_param.device, any_param.dtype
    x = torch.from_numpy(problem.x).to(device=device, dtype=dtype)
    dy = torch.from_numpy(problem.dy).to(device=device, dtype=dtype)
    names = ["dx", *(f"d{n}" for n in params)]
    wrt = [x, *params.values()]
    if mode != "fwd":
        for t in wrt:
            t.requires_grad_(True)

    def grads_np(grads: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
        return {n: _np(full_grad(n, g, world_size)) for n, g in zip(names, grads, strict=True)}

    if mode == "fwd":

        def fwd() -> torch.Tensor:
            with torch.no_grad():
                return wait(forward(x))

        return Step(fwd, lambda out: {"y": _np(out)})
    if mode == "fwd+bwd":

        def fwd_bwd() -> tuple[torch.Tensor, list[torch.Tensor]]:
            y = forward(x)
            grads = torch.autograd.grad(y, wrt, dy)
            return wait(y).detach(), [wait(g) for g in grads]

        return Step(fwd_bwd, lambda out: {"y": _np(out[0]), **grads_np(out[1])})
    if mode == "bwd":
        y_graph = forward(x)
        wait(y_graph)  # the forward's all-reduce completes here, in set-up (the step is the backward alone)

        def bwd() -> list[torch.Tensor]:
            return [wait(g) for g in torch.autograd.grad(y_graph, wrt, dy, retain_graph=True)]

        return Step(bwd, grads_np)
    raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")


class _NoModuleTracker:
    """Stands in for ``CommDebugMode``'s module tracker, whose backward hooks refuse ``torch.autograd.grad`` (the
    steps' backward): every collective is then counted under one module, ``Global``."""

    name = "Global"
    is_bw = False
    activation_checkpointing = False
    module_parents_dict: dict[str, set[str]] = {"Global": set()}  # noqa: RUF012 (read-only)

    def __enter__(self) -> _NoModuleTracker:
        return self

    def __exit__(self, *args: object) -> None:
        return None


class _SizedCommMode(CommDebugMode):
    """``CommDebugMode`` (without its module tracker) that also records the payload bytes of every all-reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.advanced_module_tracker = _NoModuleTracker()  # type: ignore[assignment]
        self.allreduce_bytes: list[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = str(getattr(func, "_overloadpacket", func))
        if out is not NotImplemented and ("all_reduce" in name or "allreduce" in name):
            first = args[0]
            tensors = first if isinstance(first, list | tuple) else [first]
            self.allreduce_bytes.append(sum(t.numel() * t.element_size() for t in tensors))
        return out


def count_eager(run: Callable[[], Any]) -> list[Collective]:
    """The all-reduces of one call of ``run``, counted by ``CommDebugMode`` (sizes from the reduced tensors)."""
    with _SizedCommMode() as mode:
        dev.sync(run())
    counts = {str(k): v for k, v in mode.get_comm_counts().items()}
    others = {k: v for k, v in counts.items() if "all_reduce" not in k and "allreduce" not in k}
    if others:
        raise RuntimeError(f"collectives other than all-reduce in a TP step: {others}")
    return [all_reduces(mode.allreduce_bytes, "CommDebugMode", ", ".join(f"{k} x{v}" for k, v in counts.items()))]


#: Profiler events of one all-reduce call each (``c10d::allreduce_`` nested in a functional one is the same call).
_ALLREDUCE_EVENTS = frozenset({"_c10d_functional::all_reduce", "_c10d_functional::all_reduce_", "c10d::allreduce_"})


def count_profiled(run: Callable[[], Any], itemsize: int) -> list[Collective]:
    """The all-reduces of one call of ``run``, counted from ``torch.profiler`` events (``CommDebugMode`` cannot see
    into a compiled graph: under a dispatch mode the compiled code is not what runs). Each outermost all-reduce
    event is one call, its payload the recorded shape x ``itemsize``; ``detail`` says how many ran inside a compiled
    graph (``## Call CompiledFxGraph``) and how many outside it (eager DTensor redistributes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dev.sync(run())
    sizes, inside = [], 0
    for e in prof.events():
        if e.name not in _ALLREDUCE_EVENTS:
            continue
        chain = []
        p = e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        if any(n in _ALLREDUCE_EVENTS for n in chain):
            continue
        sizes.append(int(np.prod(e.input_shapes[0])) * itemsize if e.input_shapes and e.input_shapes[0] else 0)
        inside += any(n.startswith("## Call CompiledFxGraph") for n in chain)
    detail = f"{inside} inside a compiled graph, {len(sizes) - inside} outside (eager)"
    return [all_reduces(sizes, "torch.profiler", detail)]


def all_reduces(sizes: Sequence[int], source: str, detail: str) -> Collective:
    """One :class:`Collective` line for the all-reduces of ``sizes`` bytes each."""
    each = sorted(set(sizes))
    return Collective(
        "all-reduce", len(sizes), int(sum(sizes)), source, f"{detail}; bytes each: {', '.join(map(str, each))}"
    )


def comm_only(problem: Problem, mode: str, dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
    """The step's all-reduces alone: one ``[batch, seq, dim]`` buffer per all-reduce of ``mode`` (zeros: they stay
    finite however often they are summed)."""
    count = megatron_allreduces(mode) if dist.get_world_size() > 1 else 0  # one rank: nothing to reduce
    bufs = [torch.zeros(problem.case.output_shape(), dtype=dtype, device=device) for _ in range(count)]

    def run() -> list[torch.Tensor]:
        for b in bufs:
            dist.all_reduce(b)
        return bufs

    return run


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
    (kind ``collective``: ``compare.kernels`` classifies them by name)."""

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
    collectives: Callable[[], list[Collective]] | None = None,
    setup_s: dict[str, float],
    layout: str,
    timed: bool = True,
    note: str = "",
) -> Prepared:
    """The ``Prepared`` of a TP step with its ``TPParts`` (collectives counted by ``CommDebugMode`` by default)."""
    precision = dev.pin_precision()
    device, dtype = dev.device(), dev.TORCH_DTYPES[problem.case.dtype]
    tp = TPParts(
        collectives=collectives if collectives is not None else lambda: count_eager(step.run),
        comm_only=comm_only(problem, mode, dtype, device),
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
