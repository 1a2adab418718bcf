"""``torch-eager-remat``: ``torch-eager``'s module with ``torch.utils.checkpoint`` (non-reentrant) around its tail,
the activation and the GEMM that reads it (GeGLU/SwiGLU: ``down(act(g) * u)``; GPT-2's MLP: ``fc2(gelu(f))``).

The forward keeps only the checkpoint's inputs, the GEMM outputs the activation reads (``g, u``; ``f``), besides
``x``; the backward first reruns the whole tail (the activation, the GLU's mul and the down GEMM, whose output is
dropped: non-reentrant checkpointing reruns its region up to the last tensor the region saved, and the down GEMM's
input is saved by the GEMM itself), 3 more kernels per fwd+bwd step for a GLU, 2 for GPT-2's MLP, as profiled. The
cost model's ``eager-remat`` plan. ``linear`` has no activation to recompute (the registry's ``models``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import GatedMLP, GeluMLP, build_module


class EagerRematBackend:
    name = "torch-eager-remat"

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        return runner.prepare(problem, mode, module, remat_forward(module))


def remat_forward(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward (a ``GatedMLP`` or ``GeluMLP`` of ``torch_impl.models``) with its tail checkpointed."""
    if not isinstance(module, GatedMLP | GeluMLP):
        raise ValueError(f"{type(module).__name__} has no activation between two GEMMs to recompute")

    def forward(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint(module.tail, *module.heads(x), use_reentrant=False)
        return out

    return forward


BACKEND = EagerRematBackend()
