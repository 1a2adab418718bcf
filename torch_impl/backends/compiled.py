"""``torch-compile``: ``torch.compile`` of the eager module (Inductor; ``dynamic=False``: shape-specialised).

:class:`CompileBackend` takes ``torch.compile``'s ``mode``: ``torch_impl.backends.compiled_max_autotune`` is the same
backend with ``max-autotune-no-cudagraphs``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from compare.backends.registry import Availability, Prepared
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory
from torch_impl import device as dev
from torch_impl import profiling, runner
from torch_impl.models import Build, build_module


def _without_donation(prepared: Prepared) -> Prepared:
    """``prepared`` (a ``bwd`` step) with its step, and every step ``bind`` builds (and the forward it runs), under the
    donated-buffer patch too. A MoE block's compiled backward is compiled at its first replay, outside ``prepare``,
    and there AOTAutograd refused the replay's ``retain_graph=True`` ("compiled with non-empty donated buffers") with
    the patch around ``prepare`` alone; with it around every call it ran as with the option off for the process."""

    def off(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with torch._functorch.config.patch(donated_buffer=False):
                return fn(*args)

        return call

    bind = prepared.bind
    return dataclasses.replace(
        prepared,
        step=off(prepared.step),
        bind=None if bind is None else off(lambda inputs, slot: off(bind(inputs, slot))),
    )


class CompileBackend:
    """``torch.compile(module, mode=mode, dynamic=False, fullgraph=fullgraph)``; ``mode`` None is Inductor's default;
    ``build`` makes the module (default: the case's built-in model, ``torch_impl.models.build_module``);
    ``fullgraph=False`` lets Dynamo split the forward at data-dependent Python (a MoE loop over the experts hit);
    ``dynamic`` is ``torch.compile``'s (None: a frame met at a second shape is recompiled once with dynamic sizes);
    ``lazy_backward``: a ``bwd`` step runs with donated buffers off at every call, not only in ``prepare``
    (:func:`_without_donation`; the MoE blocks need it, the dense ones' timed steps are left as they were)."""

    def __init__(
        self,
        name: str = "torch-compile",
        mode: str | None = None,
        build: Build = build_module,
        fullgraph: bool = True,
        dynamic: bool | None = False,
        lazy_backward: bool = False,
    ) -> None:
        self.name = name
        self.mode = mode
        self.build = build
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.lazy_backward = lazy_backward

    def availability(self) -> Availability:
        return Availability(True, device=str(dev.device()))

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = self.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        # Every nn.Linear shares one forward code object, and Dynamo's recompile limit counts per code object:
        # start each backend instance from a clean Dynamo state so its first call is its own compile.
        torch._dynamo.reset()
        # Inductor's C++ kernels appear in torch.profiler only with this set before compiling (cheap check per call)
        profiling.enable_inductor_kernel_profile()
        cache = dev.key_inductor_cache()  # before the first compile: another ISA's cached code is wrong here
        compiled = torch.compile(module, mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph)
        note = "first call includes Inductor compile (its on-disk FX graph cache may be warm)"
        if not self.fullgraph:
            note += "; graph breaks allowed"
        if self.dynamic is not False:
            note += f"; dynamic={self.dynamic}"
        if self.mode is not None:
            note += f"; mode={self.mode}"
        if mode != "bwd":
            prepared = runner.prepare(problem, mode, module, compiled, note=note)
        else:
            # Timing the backward alone replays one graph with retain_graph=True, which AOTAutograd's donated
            # buffers forbid; the forward (and its compile) runs inside prepare, so the patch covers it.
            with torch._functorch.config.patch(donated_buffer=False):
                note += "; donated buffers off (bwd replay)"
                prepared = runner.prepare(problem, mode, module, compiled, note=note)
            if self.lazy_backward:
                prepared = _without_donation(prepared)
        return dataclasses.replace(prepared, precision={**prepared.precision, **cache})

    def shape_sweep(
        self,
        make: GoldenFactory,
        tokens: Sequence[int],
        *,
        budget_s: float,
        dynamic: bool | None = False,
        mode: str = "fwd",
        compile_backend: Any = "inductor",
    ) -> list[dict[str, Any]]:
        """The compile-cost sweep: one ``torch.compile(module, dynamic=...)`` over every token count, its compiles
        read from Dynamo's counter. ``compile_backend`` is ``torch.compile``'s ``backend`` (tests pass a
        ``CompileCounterWithBackend`` to cross-check the counter)."""
        from torch_impl import recompiles

        def build(problem: Problem) -> tuple[torch.nn.Module, Any]:
            module = self.build(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
            torch._dynamo.reset()  # this sweep's compiles only: no graphs of the module's forward left from before
            return module, torch.compile(
                module, mode=self.mode, dynamic=dynamic, fullgraph=True, backend=compile_backend
            )

        return recompiles.shape_sweep(
            make, tokens, name=self.name, build=build, compiled=True, dynamic=dynamic, mode=mode, budget_s=budget_s
        )


BACKEND = CompileBackend()
