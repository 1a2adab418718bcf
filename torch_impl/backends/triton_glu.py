"""``torch-triton``: eager GEMMs, with ``act(g) * u`` (and its backward) in hand-written Triton kernels: GeGLU
(``gelu_tanh``) or SwiGLU (``silu``), the kernels' compile-time activation picked from the case's model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from compare.backends.registry import Availability, Prepared
from compare.problem.cases import GLU_ACTIVATIONS
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import ActMul, build_module

INTERPRETED_NOTE = "Triton interpreter (TRITON_INTERPRET=1) on CPU: parity only, not timed"


def triton_act_mul(model: str) -> ActMul:
    """``act_mul(g, u) = act(g) * u`` of the GLU ``model`` through the Triton kernels (differentiable), ``act`` its
    activation (``compare.problem.cases.GLU_ACTIVATIONS``); ``g, u, h: [..., hidden]``."""
    from torch_impl.ops.glu import glu

    act = GLU_ACTIVATIONS[model]

    def act_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return glu(g, u, act)

    return act_mul


class TritonGLUBackend:
    name = "torch-triton"

    def availability(self) -> Availability:
        return dev.triton_availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        avail = dev.require_triton_glu(self.name, problem.case.model)
        module = build_module(
            problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], act_mul=triton_act_mul(problem.case.model)
        )
        return runner.prepare(problem, mode, module, timed=avail.timed, note="" if avail.timed else INTERPRETED_NOTE)

    def shape_sweep(
        self, make: GoldenFactory, tokens: Sequence[int], *, budget_s: float, mode: str = "fwd"
    ) -> list[dict[str, Any]]:
        """The compile-cost sweep: the module with the Triton kernel over every token count; Triton's JIT hook
        counts the kernel specialisations it builds (none under the CPU interpreter, which is also not timed)."""
        from torch_impl import recompiles

        ok, reason, interpreted = dev.triton_status()
        if not ok:
            raise RuntimeError(f"{self.name} cannot run here: {reason}")

        def build(problem: Problem) -> tuple[nn.Module, nn.Module]:
            module = build_module(
                problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], act_mul=triton_act_mul(problem.case.model)
            )
            return module, module

        return recompiles.shape_sweep(
            make,
            tokens,
            name=self.name,
            build=build,
            count_triton=True,
            timed=not interpreted,
            note=INTERPRETED_NOTE if interpreted else "",
            mode=mode,
            budget_s=budget_s,
        )


BACKEND = TritonGLUBackend()
