"""Compile cost and shape generality of ``jax.jit``: one jitted nnx module, many token counts.

:func:`shape_sweep` builds the case's ``flax.nnx`` module once, jits its apply function once (state and inputs as
arguments, as ``jax_impl.runner`` does) and calls it on the inputs of each token count in turn. Per shape it records
(row schema in ``compare.report.shapes``):

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

from compare.problem.cases import check_name
from compare.problem.golden import Problem
from compare.problem.shape_cases import GoldenFactory, row_fields, sweep_goldens
from compare.timing import timer as timing
from jax_impl import device as dev

SWEEP_MODES: tuple[str, ...] = ("fwd", "fwd+bwd")
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


def shape_sweep(
    make: GoldenFactory,
    tokens: Sequence[int],
    *,
    name: str,
    build: Callable[[Problem], nnx.Module],
    mode: str = "fwd",
    budget_s: float = 0.2,
) -> list[dict[str, Any]]:
    """Call one ``jax.jit`` of a backend's nnx module (``build(problem)``, the backend's own) on each token count in
    turn; one row per shape, under the backend's ``name``.

    ``make(tokens)`` returns the :class:`~compare.problem.cases.Case` or :class:`~compare.problem.golden.Golden` of that
    token
    count (same model, dtype, dim and hidden for all); weights come from the first, ``x [batch, seq, dim]`` and
    ``dy`` from each. ``mode`` is ``fwd`` (``y = apply(state, x)``) or ``fwd+bwd`` (``jax.vjp`` in the same jit).
    """
    check_name("mode", mode, SWEEP_MODES)
    goldens = sweep_goldens(make, tokens)
    case0 = goldens[0].case
    dev.pin_precision()
    dtype = dev.JAX_DTYPES[case0.dtype]
    graphdef, state = nnx.split(build(goldens[0].problem))

    def apply(st: Any, xx: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, st)(xx)

    def fwd_bwd(st: Any, xx: jax.Array, g: jax.Array) -> tuple[jax.Array, tuple[Any, jax.Array]]:
        y, vjp = jax.vjp(apply, st, xx)
        return y, vjp(g)

    jitted = jax.jit(apply) if mode == "fwd" else jax.jit(fwd_bwd)
    rows = []
    events = _listen()
    try:
        for gold in goldens:
            c = gold.case
            x = jax.device_put(np.asarray(gold.x)).astype(dtype)
            dy = jax.device_put(np.asarray(gold.dy)).astype(dtype)
            jax.block_until_ready((x, dy))  # the conversions compile too: before the count starts
            step: Callable[[], Any]
            if mode == "fwd":

                def step(x: jax.Array = x) -> Any:
                    return jitted(state, x)
            else:

                def step(x: jax.Array = x, dy: jax.Array = dy) -> Any:
                    return jitted(state, x, dy)

            events.clear()
            before = _cache_size(jitted)
            first_s, out = timing.first_call(step, dev.sync)
            del out
            after = _cache_size(jitted)
            first_events = list(events)
            events.clear()
            t = timing.measure(step, dev.sync, first_call_s=first_s, budget_s=budget_s)
            grew, fired = _cache_size(jitted) - after, sum(e == BACKEND_COMPILE_EVENT for e, _ in events)
            if grew or fired:
                raise RuntimeError(
                    f"jax.jit compiled during the timed samples at {c.shape.tokens} tokens (cache "
                    f"+{grew}, {fired} backend compile events): the timing would measure compiles"
                )
            rows.append(
                {
                    "backend": name,
                    "framework": "jax",
                    "dynamic": False,
                    **row_fields(c),
                    "mode": mode,
                    "device": dev.platform(),
                    "compiles": after - before,
                    "compile_counter": CACHE_COUNTER,
                    "backend_compiles": sum(e == BACKEND_COMPILE_EVENT for e, _ in first_events),
                    "compile_s_reported": sum(d for e, d in first_events if e in COMPILE_EVENTS),
                    "first_call_s": first_s,
                    "median_s": t.median_s,
                    "iqr_s": t.iqr_s,
                    "timed": True,
                    "generic": False,
                    "note": "jax.jit specialises on every input shape",
                    "error": "",
                }
            )
    finally:
        _ACTIVE.remove(events)
    return rows
