"""Test-only backends for the memory controls (issue 19, item 5), registered by the tests that use them.

- ``hoarder``: torch-eager whose act(g) * u secretly keeps a copy of g and one of u for the backward (an identity
  ``autograd.Function`` on h that saves them): its measured saved bytes are torch-eager's plus exactly those of g
  and u. Its registry line claims torch-eager's plan, so the memory check against the cost model must find it.

- ``remat-control``: torch-eager's MLP under ``torch.utils.checkpoint`` (non-reentrant), registered as the
  recomputation twin of torch-eager (``remat_of``): it keeps no activation for the backward (only its input, which
  is not counted) and runs the forward's kernels again in the backward.

- with ``FUSION_COMPARE_TEST_MEMORY=stash``, ``hoarder`` keeps its copy of g in a list of its own instead (outside
  autograd, a new copy every forward): the saved-tensor hooks cannot see it, the allocator's cross-check must.

(The control with no memory hook is torch-eager's own ``Prepared`` without it: :func:`silent`.)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import EAGER_ACT_MUL, build_module

MODE_ENV = "FUSION_COMPARE_TEST_MEMORY"
#: ``stash`` mode's copies of g, kept outside autograd (the test clears it)
STASH: list[torch.Tensor] = []
HOARDER = BackendSpec(
    name="hoarder",
    framework="torch",
    target="tests.memory_backends",
    about="torch-eager that secretly keeps a copy of g and u for the backward",
    models=("geglu", "swiglu"),
    plan="eager",
)


REMAT = BackendSpec(
    name="remat-control",
    framework="torch",
    target="tests.memory_backends",
    about="torch-eager's MLP under torch.utils.checkpoint",
    models=("geglu", "swiglu"),
    plan="eager",
    remat_of="torch-eager",
)


class _KeepCopies(torch.autograd.Function):
    """``h`` unchanged; its backward passes the gradient through, but the forward saves copies of g and u."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g.detach().clone(), u.detach().clone())
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, dh: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return dh, None, None


def silent(problem: Problem, mode: str) -> Prepared:
    """torch-eager's step with no memory hook: its result must read "not measured" with the reason, never 0."""
    return dataclasses.replace(spec("torch-eager").load().prepare(problem, mode), memory=None)


class Hoarder:
    """``hoarder``, or with ``FUSION_COMPARE_TEST_MEMORY=remat`` set by the test, ``remat-control`` (the module's one
    ``BACKEND`` serves the line that loaded it: the test registers one at a time)."""

    name = "hoarder"

    def availability(self) -> Availability:
        return spec("torch-eager").availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        if os.environ.get(MODE_ENV) == "remat":
            module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])

            def checkpointed(x: torch.Tensor) -> torch.Tensor:
                out: torch.Tensor = checkpoint(module, x, use_reentrant=False)
                return out

            return runner.prepare(problem, mode, module, checkpointed)
        act_mul = EAGER_ACT_MUL[problem.case.model]
        stash = os.environ.get(MODE_ENV) == "stash"

        def hoarding(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            if stash:
                STASH.append(g.detach().clone())
                return act_mul(g, u)
            out: torch.Tensor = _KeepCopies.apply(act_mul(g, u), g, u)
            return out

        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], hoarding)
        return runner.prepare(problem, mode, module)


BACKEND = Hoarder()
