"""``torch-triton-fused``: ``h = act(x @ Wg.T) * (x @ Wu.T)`` in ONE Triton GEMM kernel (gate and up never reach
memory; ``act`` = ``gelu_tanh`` for GeGLU, ``silu`` for SwiGLU, the kernel's compile-time activation), and the down
projection as a Triton GEMM too. Backward: the fused step recomputes ``g, u`` with torch GEMMs and runs the Triton
elementwise backward kernel (same activation); the down projection's backward is two Triton GEMMs."""

from __future__ import annotations

import torch

from compare.backends.registry import Availability, Prepared
from compare.problem.cases import GLU_ACTIVATIONS
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.backends.triton_glu import INTERPRETED_NOTE
from torch_impl.models import build_module


class TritonFusedBackend:
    name = "torch-triton-fused"

    def availability(self) -> Availability:
        return dev.triton_availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        avail = dev.require_triton_glu(self.name, problem.case.model)
        from torch_impl.ops.glu_matmul import fused_glu, triton_linear

        act = GLU_ACTIVATIONS[problem.case.model]
        m = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        w = dict(m.named_parameters())  # gate_proj/up_proj [hidden, dim], down_proj [dim, hidden]

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = fused_glu(x, w["gate_proj.weight"], w["up_proj.weight"], act)  # [..., hidden]; g, u stay in registers
            return triton_linear(h, w["down_proj.weight"])  # [..., dim]

        note = "down projection: Triton GEMM"
        return runner.prepare(
            problem, mode, m, forward, timed=avail.timed, note=note if avail.timed else f"{INTERPRETED_NOTE}; {note}"
        )


BACKEND = TritonFusedBackend()
