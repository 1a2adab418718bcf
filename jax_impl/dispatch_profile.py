"""Kernels per step of a JAX step with no jit above it: one that dispatches one computation per op from Python
(``runner.prepare(..., outer_jit=False)``, the unfused baseline). Summary schema in ``compare.kernels.summary``.

``profiling.profile_jit`` reads one compiled program; such a step dispatches many. So :func:`profile_dispatched`

1. traces the step function (``jax.make_jaxpr``): outside any jit, each top-level equation is one program JAX
   compiles and dispatches when the step runs (a ``jit`` equation is an op's own jitted function, or the transpose
   JAX made of it for the backward; a bare primitive, such as the ``add_any`` summing dx's two terms, is dispatched
   as a little program of its own);
2. compiles each equation alone (its jaxpr, so the XLA program the step dispatches for it) and reads its optimized
   HLO as ``profiling.hlo_kernels`` reads one program; the step's kernels are all of theirs, merged by name, kind and
   absorbed ops (counts per step);
3. times them: the programs are replayed one after another on the step's own arguments (each one's outputs feeding
   the next, as in the step), once to warm up, then :data:`REPLAYS` times under ``jax.profiler.trace``. Each
   replayed program has a unique name, and XLA's trace names the program (``hlo_module``) and the instruction
   (``hlo_op``) of every kernel it runs, so a kernel's ``time_us`` is its events' total duration per replay. If any
   kernel has no event (a platform whose trace names kernels otherwise, a kernel inside a ``call``), no kernel gets a
   time: a partial table would misstate the split between GEMMs and the rest. The trace is read as
   ``profiling.profile_jit`` reads a jitted step's (``profiling.traced_run`` and ``profiling.kernel_times``);
4. its ``kernel_time`` likewise (``profiling.traced_kernel_time``): the union of the programs' kernel events per
   replay, and the mean replay (its ``profiling.STEP_NAME`` range) as the profiled step. A replay dispatches the
   programs from Python one after another as the step does, so its wall time includes that dispatch. None unless
   every kernel was timed.

What it cannot see: Python's dispatch overhead between the programs (no kernel: it is in the timed median, not here),
and a program the real step dispatches that its traced jaxpr does not show (a test counts the real step's
executions in a trace against the equations). With a ``trace_dir`` the trace written there is the replay's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
from jax.extend.core import DropVar, JaxprEqn, Literal

from compare.kernels import summary as ks
from jax_impl import profiling

#: Replays recorded under the profiler (after one warm-up).
REPLAYS = 3


@dataclass
class Program:
    """One dispatched computation of the step: its equation, the compiled program, and its HLO module's name."""

    label: str
    eqn: JaxprEqn
    compiled: Any
    module: str
    #: entry instruction name -> key of the kernel row it runs as (name, kind, absorbed)
    rows: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)


def _program(i: int, eqn: JaxprEqn) -> Callable[..., list[Any]]:
    """The equation as a function of its non-literal inputs, named ``op<i>_<what>`` (unique within the step)."""
    bound = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) before jax 0.7, params since
    subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
    literals = {j: v.val for j, v in enumerate(eqn.invars) if isinstance(v, Literal)}

    def program(*vals: Any) -> list[Any]:
        it = iter(vals)
        full = [literals[j] if j in literals else next(it) for j in range(len(eqn.invars))]
        out = eqn.primitive.bind(*subfuns, *full, **params)
        return list(out) if eqn.primitive.multiple_results else [out]

    what = re.sub(r"\W", "_", str(eqn.params.get("name", eqn.primitive.name))).strip("_") or "op"
    program.__name__ = program.__qualname__ = f"op{i}_{what}"
    return program


def programs(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[list[Program], Any]:
    """The programs ``fn(*args)`` dispatches, compiled, in order, and the traced jaxpr (``ClosedJaxpr``)."""
    closed = jax.make_jaxpr(fn)(*args)
    out = []
    for i, eqn in enumerate(closed.jaxpr.eqns):
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars if not isinstance(v, Literal)]
        program = _program(i, eqn)
        compiled = jax.jit(program).lower(*avals).compile()
        name = profiling.module_name(compiled.as_text() or "")
        out.append(Program(program.__name__, eqn, compiled, name or program.__name__))
    return out, closed


def replay(progs: list[Program], closed: Any, args: tuple[Any, ...]) -> list[Any]:
    """Run the programs in order on ``args`` (flattened as the jaxpr's inputs), as the step dispatches them; returns
    the jaxpr's outputs, all complete."""
    flat = jax.tree_util.tree_leaves(args)
    jaxpr = closed.jaxpr
    if len(flat) != len(jaxpr.invars):
        raise ValueError(f"{len(flat)} argument leaves for {len(jaxpr.invars)} jaxpr inputs")
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, closed.consts, strict=True))
    env.update(zip(jaxpr.invars, flat, strict=True))
    for p in progs:
        vals = [env[v] for v in p.eqn.invars if not isinstance(v, Literal)]
        for var, val in zip(p.eqn.outvars, p.compiled(*vals), strict=True):
            if not isinstance(var, DropVar):
                env[var] = val
    outs = [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]
    return jax.block_until_ready(outs)


def _sum_costs(costs: list[dict[str, Any]]) -> dict[str, Any]:
    """XLA's cost estimates of the programs, summed per key. XLA leaves a zero out (a GEMM's program has no
    ``transcendentals``), so a key is None only where no program has it."""
    out: dict[str, Any] = {}
    for key in ("flops", "bytes_accessed", "transcendentals"):
        vals = [c[key] for c in costs if c.get(key) is not None]
        out[key] = float(sum(vals)) if vals else None
    errors = sorted({c["error"] for c in costs if c.get("error")})
    if errors:
        out["error"] = "; ".join(errors)
    return out


def profile_dispatched(
    fn: Callable[..., Any], args: tuple[Any, ...], step: Callable[[], Any], trace_dir: Path | None = None
) -> dict[str, Any]:
    """The kernel summary (counts and ``time_us`` per step) of a step that calls ``fn(*args)`` with no jit above
    it (see the module docstring). ``step`` is not run: the programs are replayed on ``args`` instead. With
    ``trace_dir`` the replay's trace is kept there (``"trace"``), else it goes to a temporary folder."""
    del step  # the replay runs the same programs on the same arguments, each under a name the trace can match
    progs, closed = programs(fn, args)
    rows: dict[tuple[str, str, tuple[str, ...]], int] = {}
    meta: dict[str, int] = {}
    fusions: dict[str, int] = {}
    for p in progs:
        module = profiling.parse_hlo(p.compiled.as_text() or "")
        for ins in module.computations.get(module.entry, []):
            # the kernels of one entry instruction: the program's HLO with its entry cut down to that instruction
            alone = profiling.HloModule({**module.computations, module.entry: [ins]}, module.entry)
            kernels, metadata, kinds = profiling.hlo_kernels(alone)
            for op in metadata:
                meta[op["name"]] = meta.get(op["name"], 0) + op["count"]
            for label, n in kinds.items():
                fusions[label] = fusions.get(label, 0) + n
            for kern in kernels:
                key = (kern["name"], kern["kind"], tuple(kern["absorbed"]))
                rows[key] = rows.get(key, 0) + kern["count"]
                if len(kernels) == 1:
                    p.rows[ins.name] = key
    run = profiling.traced_run(lambda: replay(progs, closed, args), REPLAYS, trace_dir)
    sites = [((p.module, name), key) for p in progs for name, key in p.rows.items()]
    timing = profiling.kernel_times(rows, sites, run.events, REPLAYS)
    kernels = []
    for key, count in rows.items():
        name, kind, absorbed = key
        time_us = None if timing.times is None else timing.times[key]
        kernels.append(ks.kernel_entry(name, count, kind=kind, absorbed=list(absorbed), time_us=time_us))
    kernel_time, kt_note = profiling.traced_kernel_time(kernels, (site for site, _ in sites), run, REPLAYS)
    notes = [f"{len(progs)} XLA programs dispatched per step (one per op, forward or backward)"]
    notes.append(timing.note(f"{REPLAYS} replays of those programs"))
    if kt_note:
        notes.append(kt_note)
    if fusions:
        notes.append("XLA fusion kinds: " + ", ".join(f"{k} x{n}" for k, n in fusions.items()))
    s = ks.summary(
        "xla-hlo",
        jax.default_backend(),
        kernels,
        [{"name": k, "count": v} for k, v in meta.items()],
        trace=run.trace,
        notes="; ".join(notes),
        kernel_time=kernel_time,
    )
    s["xla_cost"] = _sum_costs([profiling.xla_cost(p.compiled) for p in progs])
    return s
