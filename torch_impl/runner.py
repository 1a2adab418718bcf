"""Turn a torch forward callable into a ``Prepared`` step for a mode. Shared by every torch backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch import nn

from compare.backends.registry import Prepared
from compare.problem.cases import is_moe
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import memory as mem
from torch_impl import profiling
from torch_impl.models import canonical_params

#: ``Prepared.quick_profile``'s schedule (wait, warm-up, profiled): 2 calls where the full one makes 5.
QUICK_STEPS = (0, 1, 1)

Forward = Callable[[torch.Tensor], torch.Tensor]


def _np(t: torch.Tensor) -> np.ndarray:
    """``t`` copied to host memory in its own float type (bfloat16 as ``ml_dtypes.bfloat16``; a Llama 3 8B layer's
    weight gradients are 0.35 GB so, 1.4 GB in float64), float64 for any other type."""
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float16, torch.float32, torch.float64):
        return t.numpy().copy()
    return t.to(torch.float64).numpy()


def _routing(experts: torch.Tensor) -> dict[str, np.ndarray]:
    """A routed step's experts ``[T, k]`` as its output's ``routing`` (integers, in host memory)."""
    return {"routing": experts.detach().to("cpu", torch.int64).numpy().copy()}


def steps(
    mode: str,
    forward: Forward,
    params: dict[str, nn.Parameter],
    x: torch.Tensor,
    dy: torch.Tensor,
    routed: bool = False,
) -> tuple[Callable[[], Any], Callable[[Any], dict[str, np.ndarray]]]:
    """The step of ``mode`` (:func:`prepare`'s) over the inputs ``x [batch, seq, dim]`` and ``dy [batch, seq, out]``,
    gradients with respect to ``x`` and ``params`` (canonical names: ``dx``, ``d<name>``), and how to read its
    output as float64 arrays. For ``bwd`` the forward runs here, once: the step is the backward alone.

    ``routed`` (a mixture-of-experts case): ``forward`` returns ``(y, experts [T, k])``, the experts its router
    chose; every step's output carries them (``bwd``'s: its forward's) and reads them as ``routing``, which the gate
    takes apart from the tensors it judges (``compare.gate.routing``)."""
    names = ["dx", *(f"d{n}" for n in params)]

    def grads_np(grads: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
        return {n: _np(g) for n, g in zip(names, grads, strict=True)}

    def run(xx: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``(y, extra)``: the forward's output and, when ``routed``, ``(experts,)``."""
        out = forward(xx)
        return (out[0], (out[1],)) if routed else (out, ())

    def read(extra: tuple[Any, ...]) -> dict[str, np.ndarray]:
        return _routing(extra[0]) if routed else {}

    wrt = [x, *params.values()]
    if mode == "fwd":

        def fwd() -> Any:
            with torch.no_grad():
                y, extra = run(x)
            return (y, *extra) if routed else y

        if routed:
            return fwd, lambda out: {"y": _np(out[0]), **read(out[1:])}
        return fwd, lambda out: {"y": _np(out)}
    if mode == "fwd+bwd":
        x.requires_grad_(True)

        def fwd_bwd() -> tuple[Any, ...]:
            y, extra = run(x)
            return (y.detach(), torch.autograd.grad(y, wrt, dy), *extra)

        return fwd_bwd, lambda out: {"y": _np(out[0]), **grads_np(out[1]), **read(out[2:])}
    if mode == "bwd":
        x.requires_grad_(True)
        y_graph, extra_graph = run(x)

        def bwd() -> Any:
            grads = torch.autograd.grad(y_graph, wrt, dy, retain_graph=True)
            return (grads, *extra_graph) if routed else grads

        if routed:
            return bwd, lambda out: {**grads_np(out[0]), **read(out[1:])}
        return bwd, grads_np
    raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")


def prepare(
    problem: Problem,
    mode: str,
    module: nn.Module,
    forward: Forward | None = None,
    *,
    timed: bool = True,
    note: str = "",
) -> Prepared:
    """Build the step of ``mode`` for ``forward`` (default: the module itself) over the golden inputs.

    - ``fwd``: ``y = forward(x)`` under ``torch.no_grad()``;
    - ``fwd+bwd``: ``y = forward(x)`` then ``torch.autograd.grad(y, [x, *params], dy)``;
    - ``bwd``: the forward runs once here; each step is ``autograd.grad(..., retain_graph=True)`` over it.

    Inputs are moved to the device once, here; each step passes them as arguments.
    """
    precision = dev.pin_precision()
    forward = forward if forward is not None else module
    device = next(module.parameters()).device
    dtype = next(module.parameters()).dtype
    x = torch.from_numpy(problem.x).to(device=device, dtype=dtype)
    dy = torch.from_numpy(problem.dy).to(device=device, dtype=dtype)
    params = canonical_params(module, problem.case.model)
    routed = is_moe(problem.case.model)  # its forward returns (y, experts): :func:`steps`
    # no closure below holds ``problem``: its weights are the backend's own float32 copy, 4 bytes an element (0.7 GB
    # for a Llama 3 8B layer), which the module holds again in its dtype
    user_module = problem.case.module is not None

    def steps_on(
        x: torch.Tensor, dy: torch.Tensor, forward: Forward = forward
    ) -> tuple[Callable[[], Any], Callable[[Any], dict[str, np.ndarray]]]:
        """The step of ``mode`` over the inputs ``x``, ``dy`` (on the device), and how to read its output; ``forward``
        the backend's unless given (the FLOP count's eager module)."""
        return steps(mode, forward, params, x, dy, routed)

    step, to_numpy = steps_on(x, dy)
    slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
        """``Prepared.bind``: the slot's device buffers hold ``inputs`` (written in place through ``.data``: the
        tensor's address and autograd version stay, so neither says whether its values changed), and the step of
        ``mode`` over them (for ``bwd`` a new forward graph, built here)."""
        new_x = torch.from_numpy(inputs["x"]).to(device=device, dtype=dtype)
        new_dy = torch.from_numpy(inputs["dy"]).to(device=device, dtype=dtype)
        if slot not in slots:
            slots[slot] = new_x, new_dy
        else:
            for buf, new in zip(slots[slot], (new_x, new_dy), strict=True):
                buf.data.copy_(new)
        return steps_on(*slots[slot])[0]

    def profile(path: Path | None, steps: tuple[int, int, int] | None = None) -> dict[str, Any]:
        trace = None if path is None else path / "trace.json"
        if steps is None:
            steps = (profiling.WAIT, profiling.WARMUP, profiling.ACTIVE) if timed else (0, 0, 1)
        summary = profiling.profile_step(step, dev.sync, trace, device=str(device), steps=steps)
        if user_module:  # no cost-model plan models a user's module: count its FLOPs instead
            # on the eager module: torch.compile refuses to run under the counter's dispatch mode (same FLOPs)
            summary["flop_count"] = profiling.count_flops(steps_on(x, dy, module)[0], dev.sync)
        return summary

    def memory() -> dict[str, Any]:
        """``Prepared.memory`` (``torch_impl.memory``): one forward under the saved-tensor hooks, one step's peak."""
        kept = [x, *module.parameters(), *module.buffers()]
        return mem.record(mode, str(device), step, lambda: forward(x)[0] if routed else forward(x), kept)

    return Prepared(
        step=step,
        sync=dev.sync,
        to_numpy=to_numpy,
        timed=timed,
        note=note,
        device=str(device),
        threads=dev.threads(),
        precision=precision,
        profile=profile,
        quick_profile=(lambda path: profile(path, QUICK_STEPS)) if timed else None,
        bind=bind,
        memory=memory,
    )
