"""``torch-triton``: eager GEMMs, with ``gelu_tanh(g) * u`` (and its backward) in hand-written Triton kernels."""

from __future__ import annotations

from compare.golden import Problem
from compare.registry import Availability, Prepared
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import build_module

INTERPRETED_NOTE = "Triton interpreter (TRITON_INTERPRET=1) on CPU: parity only, not timed"


class TritonGeGLUBackend:
    name = "torch-triton"

    def availability(self) -> Availability:
        return dev.triton_availability()  # type: ignore[no-any-return]

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        avail = dev.require_triton_geglu(self.name, problem.case.model)
        from torch_impl.ops.geglu import geglu

        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype], act_mul=geglu)
        return runner.prepare(problem, mode, module, timed=avail.timed, note="" if avail.timed else INTERPRETED_NOTE)


BACKEND = TritonGeGLUBackend()
