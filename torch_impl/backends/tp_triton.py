"""``torch-tp-triton``: the ``torch-tp`` DTensor plan with the project's hand-written Triton ``act(g) * u`` kernel
(GeGLU or SwiGLU) running unchanged on each rank's local ``[tokens, hidden/p]`` slices (ColwiseParallel hands it
plain local tensors). Under the Triton interpreter (no CUDA) it is parity only, like ``torch-triton``."""

from __future__ import annotations

from compare.backends.registry import Availability, Prepared
from compare.backends.tp import Group
from compare.problem.cases import GLU_MODELS
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import tp_common as tc
from torch_impl.backends.triton_glu import INTERPRETED_NOTE, triton_act_mul


class TritonTPBackend:
    name = "torch-tp-triton"

    def availability(self) -> Availability:
        return dev.triton_availability()

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        tc.check_case(self.name, problem, group.world_size, GLU_MODELS)
        avail = dev.require_triton_glu(self.name, problem.case.model)
        act_mul = triton_act_mul(problem.case.model)
        module, setup_s = tc.dtensor_module(problem, group, act_mul)
        return tc.prepared(
            problem,
            mode,
            group,
            tc.dtensor_step(problem, mode, group, module),
            compute_only=tc.local_twin(problem, mode, group, act_mul).run,
            setup_s=setup_s,
            layout=tc.dtensor_layout(problem, group) + "; act(g) * u: the Triton kernel on the local slices",
            timed=avail.timed,
            note="" if avail.timed else INTERPRETED_NOTE,
        )


BACKEND = TritonTPBackend()
