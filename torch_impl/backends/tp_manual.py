"""``torch-tp-manual``: Megatron's tensor parallelism written by hand on local weight slices: ``f`` (identity
forward, all-reduce of ``dx`` backward) on the input, the block on this rank's slices, ``g`` (ONE ``dist.all_reduce``
of ``y`` forward, identity backward) on the output; ``b2`` added after the reduce. See ``torch_impl.tp_common``."""

from __future__ import annotations

import time

from compare.backends.registry import Prepared
from compare.backends.tp import Group
from compare.problem.golden import Problem
from torch_impl import device as dev
from torch_impl import tp_common as tc


class ManualTPBackend(tc.TorchTPBackend):
    name = "torch-tp-manual"

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        tc.check_case(self.name, problem, group.world_size)
        t0 = time.perf_counter()
        params = tc.local_params(problem, group, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        setup_s = {"weights": time.perf_counter() - t0}
        step = tc.build_step(problem, mode, tc.megatron_forward(problem.case.model, params), params, group.world_size)
        return tc.prepared(
            problem,
            mode,
            group,
            step,
            compute_only=tc.local_twin(problem, mode, group).run,
            setup_s=setup_s,
            layout=(
                f"hand-written Megatron over {group.world_size} ranks: local row slices of gate/up (fc1, b1), "
                "column slices of down (fc2), sliced on each rank from the full weights; f/g autograd functions "
                "(one dist.all_reduce of y forward, one of dx backward)"
            ),
        )


BACKEND = ManualTPBackend()
