"""``torch-tp-compile``: the ``torch-tp`` DTensor module under ``torch.compile`` (Inductor). The forward all-reduce
runs inside the compiled graph; the root ``PrepareModuleInput`` makes a second graph, and the backward ``dx`` reduce
runs outside the graphs (an eager DTensor redistribute), which ``collectives()`` reports and the comm-only twin
replays. Counted from ``torch.profiler`` events: ``CommDebugMode`` cannot see into a compiled graph."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from compare.backends.registry import Prepared
from compare.backends.tp import Group
from compare.problem.golden import Problem
from torch_impl import collectives, profiling
from torch_impl import device as dev
from torch_impl import tp_common as tc


def _compile(fn: Callable[..., Any]) -> Any:
    return torch.compile(fn, dynamic=False)


@contextlib.contextmanager
def _replayable(mode: str) -> Iterator[None]:
    """Timing the backward alone replays one graph with ``retain_graph=True``, which AOTAutograd's donated buffers
    forbid (as ``torch-compile``); the forward, and its compile, run inside set-up."""
    if mode != "bwd":
        yield
        return
    with torch._functorch.config.patch(donated_buffer=False):
        yield


class CompiledTPBackend(tc.TorchTPBackend):
    name = "torch-tp-compile"

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        tc.check_case(self.name, problem, group.world_size)
        module, setup_s = tc.dtensor_module(problem, group)
        torch._dynamo.reset()  # this backend's compiles only (a clean recompile budget, its own first call)
        dev.key_inductor_cache()  # before the first compile (torch-compile says why)
        profiling.enable_inductor_kernel_profile()
        with _replayable(mode):
            step = tc.dtensor_step(problem, mode, group, module, _compile(module))
        bind_step = step.bind

        def bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
            with _replayable(mode):  # the same compile settings as the step's (no recompile on other inputs)
                run = bind_step(inputs, slot)

            def replayed() -> Any:
                with _replayable(mode):
                    return run()

            return replayed

        step = dataclasses.replace(step, bind=bind)

        def compute_only() -> Callable[[], Any]:
            with _replayable(mode):
                return tc.local_twin(problem, mode, group, wrap=_compile).run

        dtype = dev.TORCH_DTYPES[problem.case.dtype]
        return tc.prepared(
            problem,
            mode,
            group,
            step,
            compute_only=tc.lazy(compute_only),
            count=lambda: collectives.count_profiled(step.run, dtype),
            setup_s=setup_s,
            layout=tc.dtensor_layout(problem, group) + "; torch.compile (Inductor, dynamic=False)",
            note="first call includes Inductor compile; the compute-only twin compiles on its first call",
        )


BACKEND = CompiledTPBackend()
