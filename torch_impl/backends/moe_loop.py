"""``torch-moe-loop``: a mixture-of-experts case's block eager, transformers' form (``torch_impl.moe_ops.moe_loop``:
a Python loop over the experts that have tokens, one ``mm`` per expert and GEMM, ``index_add_`` to combine), under
the shared runner; its step's output carries the experts its router chose (``routing``)."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import moe_ops, runner


class MoeLoopBackend:
    name = "torch-moe-loop"

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        block = moe_ops.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], moe_ops.moe_loop)
        return runner.prepare(problem, mode, block)


BACKEND = MoeLoopBackend()
