"""``jax-unfused`` really is unfused: one XLA program per op, so XLA never sees the activation next to a GEMM.

The sturdiest check reads the programs themselves (``jax_impl.dispatch_profile.programs``: the step's top-level
equations, each compiled as the step dispatches it): no program holds both a ``dot`` and the activation's
transcendental, so no kernel can fuse them. What it cannot see: XLA's choices inside one op's program (e.g. whether
a bias add runs in its GEMM's kernel), and Python's dispatch cost between programs (a time, not a kernel). A trace of
the real step checks that it dispatches exactly the programs its jaxpr shows; the kernel counts per step compare the
profile with jax-xla's on the tiny case.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from compare.backends.registry import spec
from compare.gate import fresh
from compare.problem.cases import PRESETS
from compare.problem.golden import golden_for
from jax_impl import dispatch_profile, profiling
from jax_impl.backends.unfused import op_by_op
from jax_impl.models import build_module

pytestmark = pytest.mark.standard

TINY = PRESETS["tiny"]
#: The HLO opcodes of each model's activation (GELU's tanh form; SiLU's sigmoid, which XLA:CPU expands to
#: 1 / (1 + exp(-s))).
TRANSCENDENTAL = {"geglu": {"tanh"}, "swiglu": {"logistic", "exponential"}, "gelu-mlp": {"tanh"}}


def _step_function(model: str, mode: str) -> tuple[Any, tuple[Any, ...]]:
    """The function jax-unfused's step calls, and its arguments, on the tiny case in float32."""
    problem = golden_for(TINY.case("float32", model=model)).problem
    module = build_module(problem)
    forward = op_by_op(module, model)
    _, state = nnx.split(module)
    x, dy = jax.numpy.asarray(problem.x), jax.numpy.asarray(problem.dy)
    if mode == "fwd":
        return forward, (state, x)
    return (lambda st, xx, g: jax.vjp(forward, st, xx)[1](g)), (state, x, dy)


def _opcodes(program: dispatch_profile.Program) -> set[str]:
    """Every HLO opcode of a compiled program, fused computations included."""
    module = profiling.parse_hlo(program.compiled.as_text())
    return {ins.opcode for body in module.computations.values() for ins in body}


@pytest.mark.compile
@pytest.mark.parametrize("model", ["geglu", "swiglu", "gelu-mlp"])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_no_program_holds_a_gemm_and_the_activation(model: str, mode: str) -> None:
    fn, args = _step_function(model, mode)
    progs, _ = dispatch_profile.programs(fn, args)
    ops = [_opcodes(p) for p in progs]
    act = TRANSCENDENTAL[model]
    assert not [p.label for p, o in zip(progs, ops, strict=True) if "dot" in o and act & o]
    assert sum(bool(act & o) for o in ops) == (1 if mode == "fwd" else 2)  # the activation; its backward recomputes it
    gemms = sum("dot" in o for o in ops)
    linears = 2 if model == "gelu-mlp" else 3
    assert gemms == linears if mode == "fwd" else gemms == 2 * linears  # each linear's forward, then its backward
    if model != "gelu-mlp":  # the gating mul is a program of its own: a multiply and nothing else that computes
        assert any(o - profiling.SKIPPED - profiling.METADATA - {"fusion"} == {"multiply"} for o in ops), ops


@pytest.mark.compile
def test_more_kernels_per_step_than_jax_xla_each_timed() -> None:
    """The forward: 3 GEMMs, the GELU and the mul apart (5) where jax-xla fuses GELU and mul (4); the profile of
    jax-unfused has a time per kernel (XLA's trace), so its headroom outside GEMMs can be measured."""
    problem = golden_for(TINY.case("float32")).problem
    counts = {}
    for name in ("jax-unfused", "jax-xla"):
        prepared = spec(name).load().prepare(problem, "fwd")
        summary = prepared.profile(None)  # type: ignore[misc]
        counts[name] = summary["kernels_per_step"]
        if name == "jax-unfused":
            kernels = summary["kernels"]
            assert all(k["time_us"] and k["time_us"] > 0 for k in kernels), kernels
            assert sum(k["count"] for k in kernels if k["kind"] == "gemm") == 3
            assert "5 XLA programs dispatched per step" in summary["notes"]
    assert counts == {"jax-unfused": 5, "jax-xla": 4}


@pytest.mark.compile
def test_the_real_step_dispatches_the_programs_the_profile_reads(tmp_path: Path) -> None:
    """A trace of the real fwd+bwd step: one XLA execution per program of the jaxpr (forward ops, their backward
    computations, dx's sum), no more, no fewer."""
    problem = golden_for(TINY.case("float32")).problem
    prepared = spec("jax-unfused").load().prepare(problem, "fwd+bwd")
    prepared.sync(prepared.step())
    steps = 3
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(steps):
            prepared.sync(prepared.step())
    (trace,) = tmp_path.rglob("*.trace.json.gz")
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    runs = {e["args"]["run_id"] for e in events if "hlo_module" in (e.get("args") or {}) and "run_id" in e["args"]}
    progs, _ = dispatch_profile.programs(*_step_function("geglu", "fwd+bwd"))
    assert len(progs) == 11  # gate, up, act, mul, down; the backward of each; dx's sum of its two terms
    assert len(runs) == steps * len(progs)


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_fresh_inputs_give_jax_xlas_answer(mode: str) -> None:
    """``Prepared.bind``: the same op-by-op programs on inputs never seen, close to jax-xla's answer on them."""
    case = TINY.case("float32")
    problem = golden_for(case).problem
    inputs = fresh.draw(case, 1234, problem.params)
    outs = {}
    for name in ("jax-unfused", "jax-xla"):
        prepared = spec(name).load().prepare(problem, mode)
        assert prepared.bind is not None
        outs[name] = prepared.to_numpy(prepared.bind(inputs, 0)())
        if mode != "bwd":
            assert not np.allclose(outs[name]["y"], prepared.to_numpy(prepared.step())["y"])  # new inputs, new y
    assert outs["jax-unfused"].keys() == outs["jax-xla"].keys()
    for k, v in outs["jax-unfused"].items():
        np.testing.assert_allclose(v, outs["jax-xla"][k], rtol=1e-4, atol=1e-4 * np.abs(v).max(), err_msg=k)
