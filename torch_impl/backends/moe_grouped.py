"""``torch-moe-grouped``: a mixture-of-experts case's block with the token-expert assignments sorted by expert and
each expert GEMM one ``torch.nn.functional.grouped_mm`` over every expert (``torch_impl.moe_ops.moe_grouped``; where
``grouped_mm`` does not apply, a loop of ``mm`` over the groups), under the shared runner; its step's output carries
the experts its router chose (``routing``)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import moe_ops, runner


class MoeGroupedBackend:
    name = "torch-moe-grouped"

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        block = moe_ops.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], moe_ops.moe_grouped)
        return runner.prepare(problem, mode, block)


BACKEND = MoeGroupedBackend()
