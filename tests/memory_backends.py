"""Test-only backends for the memory controls (issue 19, item 5), registered by the tests that use them.

- ``hoarder``: torch-eager whose act(g) * u secretly keeps a copy of g and one of u for the backward (an identity
  ``autograd.Function`` on h that saves them): its measured saved bytes are torch-eager's plus exactly those of g
  and u. Its registry line claims torch-eager's plan, so the memory check against the cost model must find it.

(The control with no memory hook is torch-eager's own ``Prepared`` without it: :func:`silent`.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compare.backends.registry import Availability, BackendSpec, Prepared, spec
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import EAGER_ACT_MUL, build_module

HOARDER = BackendSpec(
    name="hoarder",
    framework="torch",
    target="tests.memory_backends",
    about="torch-eager that secretly keeps a copy of g and u for the backward",
    models=("geglu", "swiglu"),
    plan="eager",
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
    name = "hoarder"

    def availability(self) -> Availability:
        return spec("torch-eager").availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        act_mul = EAGER_ACT_MUL[problem.case.model]

        def hoarding(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = _KeepCopies.apply(act_mul(g, u), g, u)
            return out

        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], hoarding)
        return runner.prepare(problem, mode, module)


BACKEND = Hoarder()
