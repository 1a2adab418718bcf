"""Compile cost and shape generality of the torch backends: one compiled module, many token counts.

:func:`shape_sweep` runs one backend's step, built once by the backend itself (its ``shape_sweep`` method passes
its own ``build``: a ``torch.compile``-d module, the plain module, the module with the Triton kernel), on the inputs
of each token count in turn, through the framework-neutral loop ``compare.timing.compile_sweep.run``; this module
gives it torch's part (the step over each shape's inputs, the compile counter). Per shape it records (row schema in
``compare.timing.compile_sweep``):

- ``compiles``: the compilations this shape's first call caused, read from the framework's own counters:
  ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (Dynamo adds one per graph it compiles; in torch 2.13
  it agrees with ``torch._dynamo.testing.CompileCounterWithBackend``, which the tests check, whereas
  ``counters["frames"]`` stays empty) plus, for ``torch-triton``, Triton's ``knobs.runtime.jit_post_compile_hook``
  (fires once per kernel specialisation Triton builds; never under the CPU interpreter, which compiles nothing);
- ``first_call_s`` (compile + run, ``compare.timing.timer.first_call``) and the steady state
  (``compare.timing.timer.measure``). If either counter moves during the timed samples the sweep raises: a timed
  loop that recompiles measures compiles, not steps.

What torch 2.13 does (observed on CPU, geglu 64 -> 128, tokens 1, 8, 33, fwd):

- ``dynamic=False``: one compile per new token count (1, 1, 1). ``dynamic=False`` turns automatic dynamic shapes
  off, so the second shape does not switch to a dynamic graph; past ``torch._dynamo.config.recompile_limit``
  (8) shapes, ``fullgraph=True`` makes the next call fail (``FailOnRecompileLimitHit``), recorded as the row's
  ``error``.
- ``dynamic=True``: 1, 1, 0. Dynamo specialises sizes 0 and 1 even when asked for dynamic shapes, so a single
  token gets its own static graph; 8 compiles the one dynamic graph, which 33 (and any larger count) reuses.
- ``dynamic=None`` (the default; not the project's ``torch-compile``) behaves like ``True`` from the second
  distinct size on (automatic dynamic shapes): 1, 1, 0.

With ``cold=True`` (the default) Inductor's on-disk FX-graph and AOTAutograd caches are off during the sweep, so a
compile is a compile; kernel-level caches (compiled C++/Triton binaries) may still be warm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from compare.problem.golden import Golden, Problem
from compare.problem.shape_cases import GoldenFactory
from compare.timing import compile_sweep
from torch_impl import runner

DYNAMO_COUNTER = "torch._dynamo.utils.counters['stats']['unique_graphs'] (one per graph Dynamo compiles)"
TRITON_COUNTER = "triton.knobs.runtime.jit_post_compile_hook (one per Triton kernel specialisation built)"


def dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process (``counters["stats"]["unique_graphs"]``)."""
    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def triton_compiles(enabled: bool = True) -> Iterator[list[int]]:
    """While active, ``box[0]`` counts Triton JIT compiles (chaining any hook already installed).

    Stays 0 when not ``enabled`` (triton is then not even imported) and on a Triton without ``triton.knobs``
    (before 3.4). Inductor's own Triton kernels are built through ``triton.compile`` and do not fire this hook.
    """
    box = [0]
    if not enabled:
        yield box
        return
    try:
        from triton import knobs
    except ImportError:
        yield box
        return
    old = knobs.runtime.jit_post_compile_hook

    def hook(*args: Any, **kwargs: Any) -> Any:
        box[0] += 1
        return old(*args, **kwargs) if old else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield box
    finally:
        knobs.runtime.jit_post_compile_hook = old


@contextlib.contextmanager
def _cold_caches(cold: bool) -> Iterator[None]:
    if not cold:
        yield
        return
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield


#: Builds a backend's step for a sweep from the first shape's problem: the module (whose parameters the step's
#: gradients are taken against) and the forward callable to call on each shape's ``x``.
Build = Callable[[Problem], tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]]


class _TorchCounter:
    """Dynamo's graph count plus Triton's JIT compiles (``triton_box[0]``, from :func:`triton_compiles`): the
    :class:`~compare.timing.compile_sweep.CompileCounter` of a torch sweep. It has no events to forget."""

    def __init__(self, description: str, triton_box: list[int]) -> None:
        self.description = description
        self._triton = triton_box

    def start(self) -> None:
        """Nothing to forget: the count is read as a difference."""

    def count(self) -> int:
        return dynamo_graphs() + self._triton[0]

    def first_call_fields(self) -> dict[str, Any]:
        return {}

    def moved(self, since: int) -> str:
        n = self.count() - since
        return f"{n} more compile(s)" if n else ""


def shape_sweep(
    make: GoldenFactory,
    tokens: Sequence[int],
    *,
    name: str,
    build: Build,
    compiled: bool = False,
    dynamic: bool | None = None,
    count_triton: bool = False,
    timed: bool = True,
    note: str = "",
    mode: str = "fwd",
    budget_s: float = 0.2,
    cold: bool = True,
) -> list[dict[str, Any]]:
    """Call one backend's step on each token count in turn; one row per shape (schema and loop in
    ``compare.timing.compile_sweep``).

    The backend supplies ``build`` (its own module and forward, e.g. a ``torch.compile``-d module) and says what
    it is: ``compiled`` (a compiler specialises it per shape: ``dynamic`` is recorded and Inductor's on-disk
    caches are off when ``cold``) or shape-generic; ``count_triton`` adds Triton's JIT hook to the counter;
    ``timed=False`` (an interpreted backend) records compiles only. ``make(tokens)`` returns the
    :class:`~compare.problem.cases.Case` (its golden data is loaded or generated) or the
    :class:`~compare.problem.golden.Golden` of that token count; every case must share model, dtype, dim and
    hidden. The module's weights come from the first; each shape's ``x`` (``[batch, seq, dim]``) and ``dy`` from
    its own. ``budget_s`` is the timer's sampling budget per shape. A first call that raises (e.g.
    ``FailOnRecompileLimitHit`` past the recompile limit: a finding) is its row's ``error``.
    """
    goldens = compile_sweep.goldens(make, tokens, mode)
    module, forward = build(goldens[0].problem)
    description = f"{DYNAMO_COUNTER} + {TRITON_COUNTER}" if count_triton else DYNAMO_COUNTER
    limit = f" (torch._dynamo.config.recompile_limit = {torch._dynamo.config.recompile_limit})" if compiled else ""

    def step_for(g: Golden) -> tuple[compile_sweep.Step, compile_sweep.Sync]:
        prepared = runner.prepare(g.problem, mode, module, forward, timed=timed, note=note)
        return prepared.step, prepared.sync

    with _cold_caches(cold and compiled), triton_compiles(count_triton) as tbox:
        return compile_sweep.run(
            goldens,
            backend=name,
            framework="torch",
            device=str(next(module.parameters()).device),
            step_for=step_for,
            counter=_TorchCounter(description, tbox),
            mode=mode,
            budget_s=budget_s,
            dynamic=dynamic if compiled else None,
            generic=not compiled,
            timed=timed,
            note=note,
            keep_errors=True,
            error_note=limit,
        )
