"""Compile cost and shape generality of ``jax.jit``: one jitted nnx module, many token counts.

:func:`shape_sweep` builds the case's ``flax.nnx`` module once, jits its apply function once (state and inputs as
arguments, as ``jax_impl.runner`` does) and calls it on the inputs of each token count in turn, through the
framework-neutral loop ``compare.timing.compile_sweep.run``; this module gives it jax's part (the step over each
shape's inputs, the compile counter). Per shape it records (row schema in ``compare.timing.compile_sweep``):

- ``compiles``: the growth of the jitted function's own executable cache, ``jitted._cache_size()`` (one entry per
  input signature it compiled for); cross-checked by ``backend_compiles``, the number of
  ``/jax/core/compile/backend_compile_duration`` events JAX reports through ``jax.monitoring`` during the first
  call, and ``compile_s_reported``, the sum of JAX's own trace, lowering and backend-compile durations;
- ``first_call_s`` (trace + compile + run, ``compare.timing.timer.first_call``) and the steady state
  (``compare.timing.timer.measure``). If the cache grows or a compile event fires during the timed samples the sweep
  raises.

``jax.jit`` specialises on every input shape (there is no ``dynamic=True``): each new token count compiles once
(observed on CPU, geglu 64 -> 128, tokens 1, 8, 33: 1, 1, 1), and a token count seen before compiles nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from compare.problem.golden import Golden, Problem
from compare.problem.shape_cases import GoldenFactory
from compare.timing import compile_sweep
from jax_impl import device as dev

CACHE_COUNTER = "jitted._cache_size() (the jitted function's compiled-executable cache)"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: JAX's own compile-phase duration events, summed into ``compile_s_reported``.
COMPILE_EVENTS: tuple[str, ...] = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE_EVENT,
)


#: Event boxes currently listening; one process-wide listener feeds them (listeners cannot always be removed).
_ACTIVE: list[list[tuple[str, float]]] = []
_LISTENING = False


def _listener(event: str, duration_secs: float, **_kw: str | int) -> None:
    for box in _ACTIVE:
        box.append((event, duration_secs))


def _listen() -> list[tuple[str, float]]:
    global _LISTENING
    if not _LISTENING:
        jax.monitoring.register_event_duration_secs_listener(_listener)
        _LISTENING = True
    box: list[tuple[str, float]] = []
    _ACTIVE.append(box)
    return box


def _cache_size(jitted: Any) -> int:
    """How many executables the jitted function has compiled (a private counter of ``jax.jit``'s wrapper)."""
    return int(jitted._cache_size())


class _JitCounter:
    """``jitted._cache_size()``, with the ``jax.monitoring`` events of the current window (``events``, fed by
    :func:`_listen`): the :class:`~compare.timing.compile_sweep.CompileCounter` of a jax sweep."""

    description = CACHE_COUNTER

    def __init__(self, jitted: Any, events: list[tuple[str, float]]) -> None:
        self._jitted = jitted
        self._events = events

    def start(self) -> None:
        self._events.clear()

    def count(self) -> int:
        return _cache_size(self._jitted)

    def _backend_compiles(self) -> int:
        return sum(e == BACKEND_COMPILE_EVENT for e, _ in self._events)

    def first_call_fields(self) -> dict[str, Any]:
        """``backend_compiles`` (backend-compile events) and ``compile_s_reported`` (JAX's own trace, lowering and
        backend-compile seconds) of the first call."""
        return {
            "backend_compiles": self._backend_compiles(),
            "compile_s_reported": sum(d for e, d in self._events if e in COMPILE_EVENTS),
        }

    def moved(self, since: int) -> str:
        grew, fired = self.count() - since, self._backend_compiles()
        return f"cache +{grew}, {fired} backend compile events" if grew or fired else ""


#: A forward as parameters and a pure function of them and ``x``: ``(params, apply)``, ``apply(params, x) -> y``.
Applied = tuple[Any, Callable[[Any, jax.Array], jax.Array]]


def shape_sweep(
    make: GoldenFactory,
    tokens: Sequence[int],
    *,
    name: str,
    build: Callable[[Problem], nnx.Module] | Callable[[Problem], Applied],
    mode: str = "fwd",
    budget_s: float = 0.2,
) -> list[dict[str, Any]]:
    """Call one ``jax.jit`` of a backend's forward (``build(problem)``, the backend's own: an nnx module, or its
    :data:`Applied` parameters and pure function) on each token count in turn; one row per shape, under the
    backend's ``name`` (the loop is ``compare.timing.compile_sweep.run``).

    ``make(tokens)`` returns the :class:`~compare.problem.cases.Case` or :class:`~compare.problem.golden.Golden` of
    that token count (same model, dtype, dim and hidden for all); weights come from the first, ``x [batch, seq,
    dim]`` and ``dy`` from each. ``mode`` is ``fwd`` (``y = apply(state, x)``) or ``fwd+bwd`` (``jax.vjp`` in the
    same jit). A first call that raises ends the sweep.
    """
    goldens = compile_sweep.goldens(make, tokens, mode)
    dev.pin_precision()
    dtype = dev.JAX_DTYPES[goldens[0].case.dtype]
    built = build(goldens[0].problem)
    if isinstance(built, nnx.Module):
        graphdef, state = nnx.split(built)

        def merged(st: Any, xx: jax.Array) -> jax.Array:
            return nnx.merge(graphdef, st)(xx)

        built = (state, merged)
    state, apply = built

    def fwd_bwd(st: Any, xx: jax.Array, g: jax.Array) -> tuple[jax.Array, tuple[Any, jax.Array]]:
        y, vjp = jax.vjp(apply, st, xx)
        return y, vjp(g)

    jitted = jax.jit(apply) if mode == "fwd" else jax.jit(fwd_bwd)

    def step_for(gold: Golden) -> tuple[compile_sweep.Step, compile_sweep.Sync]:
        """The jitted step on this shape's ``x`` (and ``dy``), converted and on the device before the count starts
        (the conversions compile too)."""
        x = jax.device_put(np.asarray(gold.x)).astype(dtype)
        dy = jax.device_put(np.asarray(gold.dy)).astype(dtype)
        jax.block_until_ready((x, dy))
        if mode == "fwd":
            return lambda: jitted(state, x), dev.sync
        return lambda: jitted(state, x, dy), dev.sync

    events = _listen()
    try:
        return compile_sweep.run(
            goldens,
            backend=name,
            framework="jax",
            device=dev.platform(),
            step_for=step_for,
            counter=_JitCounter(jitted, events),
            mode=mode,
            budget_s=budget_s,
            dynamic=False,
            generic=False,
            note="jax.jit specialises on every input shape",
        )
    finally:
        _ACTIVE.remove(events)
