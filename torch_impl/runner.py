"""Turn a torch forward callable into a ``Prepared`` step for a mode. Shared by every torch backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from compare.golden import Problem
from compare.registry import Prepared
from torch_impl import device as dev
from torch_impl import profiling
from torch_impl.models import canonical_params

Forward = Callable[[torch.Tensor], torch.Tensor]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


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
    names = ["dx", *(f"d{n}" for n in params)]
    wrt = [x, *params.values()]

    def grads_np(grads: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
        return {n: _np(g) for n, g in zip(names, grads, strict=True)}

    step: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    if mode == "fwd":

        def step() -> torch.Tensor:
            with torch.no_grad():
                return forward(x)

        def to_numpy(out: torch.Tensor) -> dict[str, np.ndarray]:
            return {"y": _np(out)}
    elif mode == "fwd+bwd":
        x.requires_grad_(True)

        def step() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            y = forward(x)
            return y.detach(), torch.autograd.grad(y, wrt, dy)

        def to_numpy(out: tuple[torch.Tensor, tuple[torch.Tensor, ...]]) -> dict[str, np.ndarray]:
            return {"y": _np(out[0]), **grads_np(out[1])}
    elif mode == "bwd":
        x.requires_grad_(True)
        y_graph = forward(x)

        def step() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(y_graph, wrt, dy, retain_graph=True)

        to_numpy = grads_np
    else:
        raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")

    def profile(path: Path | None) -> dict[str, Any]:
        trace = None if path is None else path / "trace.json"
        steps = (profiling.WAIT, profiling.WARMUP, profiling.ACTIVE) if timed else (0, 0, 1)
        return profiling.profile_step(step, dev.sync, trace, device=str(device), steps=steps)

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
    )
