"""``torch-triton-fused``: ``h = gelu_tanh(x @ Wg.T) * (x @ Wu.T)`` in ONE Triton GEMM kernel (gate and up never
reach memory), and the down projection as a Triton GEMM too. Backward: the fused step recomputes ``g, u`` with
torch GEMMs and runs the Triton GeGLU backward kernel; the down projection's backward is two Triton GEMMs."""

from __future__ import annotations

import torch

from compare.golden import Problem
from compare.registry import Availability, Prepared
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.backends.triton_geglu import INTERPRETED_NOTE
from torch_impl.models import build_module


class TritonFusedBackend:
    name = "torch-triton-fused"

    def availability(self) -> Availability:
        return dev.triton_availability()  # type: ignore[no-any-return]

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        avail = dev.require_triton_geglu(self.name, problem.case.model)
        from torch_impl.ops.geglu_matmul import fused_geglu, triton_linear

        m = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = fused_geglu(x, m.gate_proj.weight, m.up_proj.weight)  # [..., hidden]; g, u stay in registers
            return triton_linear(h, m.down_proj.weight)  # [..., dim]

        note = "down projection: Triton GEMM"
        return runner.prepare(problem, mode, m, forward, timed=avail.timed,
                              note=note if avail.timed else f"{INTERPRETED_NOTE}; {note}")


BACKEND = TritonFusedBackend()
