"""``torch-moe-triton``: a mixture-of-experts case's block with its experts as hand-written Triton grouped GEMMs
(``torch_impl.ops.moe_triton.moe_triton``: the ``gate_up`` GEMM over the assignments sorted by expert with the gated
activation in its epilogue, then the ``down`` grouped GEMM; router, sort and combine in torch), under the shared
runner. Its backward: Triton for ``dh``, the recomputed activation's gradient and ``dx``, torch for the weight and bias
gradients and the scatter-adds. Under Triton's CPU interpreter it is parity only, not timed."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import moe_ops, runner
from torch_impl.backends.triton_glu import INTERPRETED_NOTE


class MoeTritonBackend:
    name = "torch-moe-triton"

    def availability(self) -> Availability:
        return dev.triton_availability()

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        avail = self.availability()
        if not avail.ok:
            raise RuntimeError(avail.reason)
        from torch_impl.ops.moe_triton import moe_triton

        block = moe_ops.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], moe_triton)
        return runner.prepare(problem, mode, block, timed=avail.timed, note="" if avail.timed else INTERPRETED_NOTE)


BACKEND = MoeTritonBackend()
