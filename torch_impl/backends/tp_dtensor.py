"""``torch-tp``: DTensor tensor parallelism (``parallelize_module``: ColwiseParallel gate/up or fc1, RowwiseParallel
down or fc2, a root ``PrepareModuleInput`` for Megatron's single ``dx`` reduce); eager. See ``torch_impl.tp_common``."""

from __future__ import annotations

from compare.backends.registry import Prepared
from compare.backends.tp import Group
from compare.problem.golden import Problem
from torch_impl import tp_common as tc


class DTensorTPBackend(tc.TorchTPBackend):
    name = "torch-tp"

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        tc.check_case(self.name, problem, group.world_size)
        module, setup_s = tc.dtensor_module(problem, group)
        return tc.prepared(
            problem,
            mode,
            group,
            tc.dtensor_step(problem, mode, group, module),
            compute_only=tc.local_twin(problem, mode, group).run,
            setup_s=setup_s,
            layout=tc.dtensor_layout(problem, group),
        )


BACKEND = DTensorTPBackend()
