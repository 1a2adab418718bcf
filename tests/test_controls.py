"""Negative controls: backends that are wrong on purpose must fail the parity gate, in every dtype and mode.

Each control wraps the real ``torch-eager`` step (or replaces it) and goes through ``harness.run_one``, the path
every backend takes, on the committed ``tiny`` and ``odd`` cases of every MLP family (GeGLU, SwiGLU, GPT-2's
GELU MLP). A control may pass only where the gate's measured resolution (``compare.gate.resolution``, the
same gate bisected on the golden data) says its perturbation is below what the dtype can resolve on that case,
and then the test asserts exactly that, with the numbers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compare.backends.registry import Prepared, spec
from compare.gate.resolution import REL_PRECISION, ResolutionRow, lookup
from compare.problem.cases import DTYPES, MODES, PRESETS, Case, committed_cases
from compare.problem.golden import golden_for
from compare.results.document import Result
from compare.run.cell import MODE_TENSORS, plain_reference
from compare.run.harness import case_resolution, run_one
from compare.timing.timer import TimingConfig
from tests.conftest import case_reference, explain
from torch_impl import runner
from torch_impl.models import build_module

pytestmark = pytest.mark.quick

#: The MLP families' committed cases (``tiny`` and ``odd``, every dtype), per family.
FAMILY_CASES = {
    m: [PRESETS[p].case(d, model=m) for p in ("tiny", "odd") for d in DTYPES] for m in ("geglu", "swiglu", "gelu-mlp")
}
GEGLU_CASES = FAMILY_CASES["geglu"]
MLP_CASES = [c for cases in FAMILY_CASES.values() for c in cases]
ALL_CASES = committed_cases()
TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The lower-precision math of each run: bf16 in fp32 and fp16 runs; fp8 (e4m3) intermediates in a bf16 run.
LOWER = {"float32": torch.bfloat16, "float16": torch.bfloat16, "bfloat16": torch.float8_e4m3fn}

Make = Callable[[Case, str], Prepared]


@functools.cache
def _plain(case: Case) -> dict[str, np.ndarray]:
    return plain_reference(case)


@functools.cache
def _resolution(case: Case) -> tuple[ResolutionRow, ...]:
    return tuple(case_resolution(case, _plain(case), MODES))


def _run(case: Case, mode: str, make: Make) -> Result:
    return run_one(
        spec("torch-eager"),
        case,
        mode,
        _plain(case),
        TimingConfig(),
        {},
        prepare=lambda: make(case, mode),
        time_it=False,
        reference=case_reference(case),
    )


def _eager(
    case: Case,
    mode: str,
    act_mul: Callable[..., torch.Tensor] | None = None,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Prepared:
    problem = golden_for(case).problem
    kw = {"act_mul": act_mul} if act_mul else {}
    module = build_module(problem, torch.device("cpu"), TORCH[case.dtype], **kw)
    return runner.prepare(problem, mode, module, forward)


def _map_outputs(p: Prepared, fn: Callable[[torch.Tensor], torch.Tensor]) -> Prepared:
    """``p`` with ``fn`` applied to every tensor it outputs (``y`` and every gradient), in the run's dtype."""

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return fn(o)
        if isinstance(o, tuple | list):
            return type(o)(walk(v) for v in o)
        return o

    step = p.step
    return dataclasses.replace(p, step=lambda: walk(step()))


def zeros(case: Case, mode: str) -> Prepared:
    return _map_outputs(_eager(case, mode), torch.zeros_like)


def nan(case: Case, mode: str) -> Prepared:
    def poison(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[t.numel() // 2] = float("nan")
        return t

    return _map_outputs(_eager(case, mode), poison)


def _last_linear_scaled(layer: torch.nn.Linear, factor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer`` computed in float32 and scaled by ``factor`` there, then rounded once to the run's dtype: the error is
    made before the final rounding, as a backend makes it (a wrong constant in a GEMM's epilogue); autograd carries
    the factor into every gradient the same way, before their rounding."""

    def apply(h: torch.Tensor) -> torch.Tensor:
        b = None if layer.bias is None else layer.bias.float()
        return (F.linear(h.float(), layer.weight.float(), b) * factor).to(h.dtype)

    return apply


def scaled(factor: float) -> Make:
    """Every output and gradient ``factor`` too large or small, the error made before the last rounding to the dtype
    (in bf16, scaling the already-rounded output by 0.999 would change no bit: half an ulp is 0.2% to 0.4%)."""

    def make(case: Case, mode: str) -> Prepared:
        problem = golden_for(case).problem
        module = build_module(problem, torch.device("cpu"), TORCH[case.dtype])
        if case.model == "linear":
            forward = _last_linear_scaled(module, factor)
        elif case.model == "gelu-mlp":
            fc2 = _last_linear_scaled(module.fc2, factor)
            forward = lambda x: fc2(F.gelu(module.fc1(x), approximate="tanh"))  # noqa: E731
        else:
            down = _last_linear_scaled(module.down_proj, factor)
            forward = lambda x: down(module.act_mul(module.gate_proj(x), module.up_proj(x)))  # noqa: E731
        return runner.prepare(problem, mode, module, forward)

    make.__name__ = f"scaled_{factor}"
    return make


def shifted(case: Case, mode: str) -> Prepared:
    """Every tensor plus a constant of 1% of its own RMS (rounded to the dtype)."""

    def shift(t: torch.Tensor) -> torch.Tensor:
        c = 0.01 * t.float().pow(2).mean().sqrt()
        return (t.float() + c).to(t.dtype)

    return _map_outputs(_eager(case, mode), shift)


def _gelu_mlp_forward(module: torch.nn.Module, gelu: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    """GPT-2's MLP forward on ``module``'s own parameters with ``gelu`` in place of its tanh GELU."""
    return lambda x: module.fc2(gelu(module.fc1(x)))


def exact_gelu(case: Case, mode: str) -> Prepared:
    """The exact (erf) GELU where the model has a tanh GELU (GeGLU, GPT-2's MLP)."""
    if case.model == "gelu-mlp":
        problem = golden_for(case).problem
        module = build_module(problem, torch.device("cpu"), TORCH[case.dtype])
        return runner.prepare(problem, mode, module, _gelu_mlp_forward(module, F.gelu))
    assert case.model == "geglu", f"{case.model} has no GELU"
    return _eager(case, mode, act_mul=lambda g, u: F.gelu(g) * u)


#: The plain ``act(g) * u`` of each GLU family.
ACT_MUL = {"geglu": lambda g, u: F.gelu(g, approximate="tanh") * u, "swiglu": lambda g, u: F.silu(g) * u}


def lower_precision(case: Case, mode: str) -> Prepared:
    """fp32 and fp16 runs compute in bf16; a bf16 run rounds its hidden activation through fp8 (e4m3): a GLU's
    ``h = act(g) * u``, GPT-2's MLP's ``gelu(fc1(x) + b1)``."""
    low = LOWER[case.dtype]
    problem = golden_for(case).problem
    high = build_module(problem, torch.device("cpu"), TORCH[case.dtype])
    if low == torch.float8_e4m3fn and case.model == "gelu-mlp":
        return runner.prepare(
            problem, mode, high, _gelu_mlp_forward(high, lambda f: F.gelu(f, approximate="tanh").to(low).to(f.dtype))
        )
    if low == torch.float8_e4m3fn:
        act_mul = ACT_MUL[case.model]
        return _eager(case, mode, act_mul=lambda g, u: act_mul(g, u).to(low).to(g.dtype))

    # the same parameters, cast down inside the step, so gradients flow back to them
    def forward(x: torch.Tensor) -> torch.Tensor:
        params = {k: v.to(low) for k, v in high.named_parameters()}
        return torch.func.functional_call(high, params, (x.to(low),)).to(x.dtype)

    return runner.prepare(problem, mode, high, forward)


class _ReturnsTheReference:
    """A backend that looked the answer up (it has to load the golden itself: ``prepare`` is never given it)."""

    @staticmethod
    def make(case: Case, mode: str) -> Prepared:
        ref = {k: v for k, v in golden_for(case).ref.items() if MODE_TENSORS[mode](k)}
        return Prepared(
            step=lambda: ref, sync=lambda _: None, to_numpy=lambda out: dict(out), bind=lambda _in, _slot: lambda: ref
        )


returns_the_reference = _ReturnsTheReference.make

CONTROLS: dict[str, Make] = {
    "zeros": zeros,
    "nan": nan,
    "exact-erf-gelu": exact_gelu,
    "scaled-0.99": scaled(0.99),
    "scaled-0.999": scaled(0.999),
    "shifted-1%-rms": shifted,
    "lower-precision-math": lower_precision,
    "returns-the-reference": returns_the_reference,
}
#: The perturbation each scale control makes, for the resolution table.
SCALE = {"scaled-0.99": 0.01, "scaled-0.999": 0.001}


#: (control, model, dtype) -> tensors the control does not touch at all, which therefore pass: the bf16 run of the
#: lower-precision control rounds only the hidden activation, and GPT-2's MLP's ``db2 = sum(dy)`` does not depend on
#: it (nor on anything else the model computes).
UNTOUCHED: dict[tuple[str, str, str], set[str]] = {("lower-precision-math", "gelu-mlp", "bfloat16"): {"db2"}}


def _expect_fail_or_below_resolution(name: str, case: Case, r: Result) -> None:
    """Every tensor fails, except where the measured resolution says the perturbation cannot be resolved (or the
    control does not touch the tensor at all: :data:`UNTOUCHED`)."""
    assert r.parity is not None, explain(r)
    for t in r.parity.tensors:
        if not t.passed or t.tensor in UNTOUCHED.get((name, case.model, case.dtype), set()):
            continue
        row = lookup(_resolution(case), case.name, t.tensor)
        assert row is not None, f"{name}: {t.tensor} passed and has no resolution row\n{explain(r)}"
        if name in SCALE:
            # the table's resolution is for a backend with the plain computation's bits or its sums reversed; the
            # scale is judged paired, so a backend whose rounding differs more has a coarser one of its own: its
            # pass line beyond the honest interval (the plain's own scale or none)
            s, res = SCALE[name], row.scale_resolution
            own = t.scale_bound + abs(t.scale_plain)
            assert res is not None and s < max(res, REL_PRECISION * own), (
                f"{name} passed on {t.tensor} although the gate resolves scale errors of {res} (< {s}) on "
                f"{case.name}, and {own:.3g} on this output\n{explain(r)}"
            )
        elif name == "exact-erf-gelu":
            assert row.erf_distinguishable is False, (
                f"erf GELU passed on {t.tensor} although the resolution table says the gate tells erf from tanh "
                f"on {case.name}\n{explain(r)}"
            )
        else:
            pytest.fail(f"control {name} passed the gate on {t.tensor} of {case.name}:\n{explain(r)}")


#: (control, case): every control on every MLP family's committed cases; the exact-erf GELU only where there is a
#: GELU to replace (not SwiGLU).
CONTROL_PAIRS = [(n, c) for n in CONTROLS for c in MLP_CASES if not (n == "exact-erf-gelu" and c.model == "swiglu")]


@pytest.mark.standard
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "case"), CONTROL_PAIRS, ids=[f"{n}-{c.name}" for n, c in CONTROL_PAIRS])
def test_control_fails_unless_below_resolution(name: str, case: Case, mode: str) -> None:
    r = _run(case, mode, CONTROLS[name])
    assert r.status in ("parity-fail", "deviates", "ok"), explain(r)
    want = [k for k in golden_for(case).ref if MODE_TENSORS[mode](k)]
    assert sorted(t.tensor for t in r.parity.tensors) == sorted(want)
    _expect_fail_or_below_resolution(name, case, r)


#: The negative controls that must land in the fail tier, per dtype (every other control may also deviate where the
#: dtype cannot call it a different function: the exact-erf GELU and bf16 math in 16-bit runs, 0.1% in bf16).
MUST_FAIL: dict[str, tuple[str, ...]] = {
    "zeros": DTYPES,
    "nan": DTYPES,
    "scaled-0.99": DTYPES,
    "scaled-0.999": ("float32",),
    "shifted-1%-rms": DTYPES,
    "exact-erf-gelu": ("float32",),
    "lower-precision-math": ("float32", "float16"),
    "returns-the-reference": DTYPES,
}


@pytest.mark.standard
@pytest.mark.isa
@pytest.mark.parametrize(("name", "case"), CONTROL_PAIRS, ids=[f"{n}-{c.name}" for n, c in CONTROL_PAIRS])
def test_a_control_that_must_fail_fails(name: str, case: Case) -> None:
    """fwd+bwd: the control's status is parity-fail wherever :data:`MUST_FAIL` says so, on every machine (this test
    reruns under capped instruction sets in CI)."""
    r = _run(case, "fwd+bwd", CONTROLS[name])
    if case.dtype in MUST_FAIL[name]:
        assert r.status == "parity-fail", explain(r)
    else:
        assert r.status in ("parity-fail", "deviates", "ok"), explain(r)


@pytest.mark.standard
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_one_percent_too_small_fails_every_tensor_of_every_committed_case(case: Case) -> None:
    """``y * 0.99`` (and every gradient * 0.99) fails on every committed case in every dtype: 1% is above every
    case's measured scale resolution."""
    r = _run(case, "fwd+bwd", scaled(0.99))
    assert r.parity is not None
    verdict = {t.tensor: t.passed for t in r.parity.tensors}
    assert not any(verdict.values()), explain(r)
    for t in r.parity.tensors:
        assert "scale" in t.failed, explain(r)


@pytest.mark.standard
@pytest.mark.parametrize("case", [c for c in MLP_CASES if c.dtype != "bfloat16"], ids=lambda c: c.name)
def test_a_tenth_of_a_percent_fails_in_float32_and_float16(case: Case) -> None:
    r = _run(case, "fwd+bwd", scaled(0.999))
    assert r.status == "parity-fail" and all(not t.passed for t in r.parity.tensors), explain(r)


@pytest.mark.standard
@pytest.mark.parametrize("case", [c for c in MLP_CASES if c.dtype == "bfloat16"], ids=lambda c: c.name)
def test_a_tenth_of_a_percent_in_bfloat16_changes_the_bits_and_is_judged_by_the_resolution(case: Case) -> None:
    """A 0.1% scale error made before the final rounding (as a backend makes it) changes many bf16 outputs (made after
    it, it would change none: the control would be no control). It is a quarter of a bf16 unit roundoff, under the
    fail line: where the measured resolution is finer than 0.1% it deviates, elsewhere it may pass, never fails."""
    r = _run(case, "fwd+bwd", scaled(0.999))
    plain = _run(case, "fwd+bwd", lambda c, m: _eager(c, m))
    assert r.status in ("ok", "deviates") and plain.status == "ok", explain(r)
    assert r.parity is not None and plain.parity is not None
    moved = [
        a.tensor for a, b in zip(r.parity.tensors, plain.parity.tensors, strict=True) if a.scale_err != b.scale_err
    ]
    assert moved == [t.tensor for t in r.parity.tensors], moved
    _expect_fail_or_below_resolution("scaled-0.999", case, r)


@pytest.mark.standard
def test_exact_gelu_is_caught_in_float32_and_not_resolvable_in_half_precision() -> None:
    """erf and tanh GELU differ by about 2e-4 relative (rms, float64): many float32 ulps, under one bf16/fp16 ulp."""
    for case in GEGLU_CASES:
        rows = _resolution(case)
        distinguishable = {r.erf_distinguishable for r in rows}
        assert all(2e-5 < r.erf_rel_rms < 1e-3 for r in rows), rows
        if case.dtype == "float32":
            assert distinguishable == {True}, rows
            assert _run(case, "fwd+bwd", exact_gelu).status == "parity-fail"
        else:
            assert distinguishable == {False}, rows


@pytest.mark.standard
def test_exact_gelu_is_caught_in_float32_on_gpt2_mlp() -> None:
    """GPT-2's MLP: in float32 the erf GELU is distinguishable (and fails) on every tensor that depends on the GELU,
    that is every one but ``db2`` (the sum of ``dy``, which no activation touches: erf and tanh give it exactly)."""
    for case in [c for c in FAMILY_CASES["gelu-mlp"] if c.dtype == "float32"]:
        rows = {r.tensor: r for r in _resolution(case)}
        assert rows["db2"].erf_rel_rms == 0 and rows["db2"].erf_distinguishable is False, rows["db2"]
        others = [r for t, r in rows.items() if t != "db2"]
        assert all(r.erf_distinguishable and 2e-5 < r.erf_rel_rms < 1e-3 for r in others), others
        r = _run(case, "fwd+bwd", exact_gelu)
        failing = {t.tensor for t in r.parity.tensors if not t.passed}
        assert failing == {t for t in rows if t != "db2"}, explain(r)


class _DropsActDerivative(torch.autograd.Function):
    """A wrong backward: the right forward ``act(g) * u``, but dg = dh * u (the activation's derivative dropped)."""

    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, u: torch.Tensor, act: Callable[..., torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        ctx.act = act
        return act(g) * u

    @staticmethod
    def backward(ctx: Any, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        g, u = ctx.saved_tensors
        return dh * u, dh * ctx.act(g), None


#: Each GLU family's activation alone.
ACT = {"geglu": lambda g: F.gelu(g, approximate="tanh"), "swiglu": F.silu}
GLU_CASES = FAMILY_CASES["geglu"] + FAMILY_CASES["swiglu"]


@pytest.mark.standard
@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
@pytest.mark.parametrize("case", GLU_CASES, ids=lambda c: c.name)
def test_a_backward_that_drops_the_activation_derivative_fails_exactly_where_it_should(case: Case, mode: str) -> None:
    """GeGLU's GELU' or SwiGLU's SiLU' dropped: exactly the gradients that flow through it (dx, dgate) fail."""
    act = ACT[case.model]
    r = _run(case, mode, lambda c, m: _eager(c, m, act_mul=lambda g, u: _DropsActDerivative.apply(g, u, act)))
    assert r.status == "parity-fail", explain(r)
    verdict = {t.tensor: t.passed for t in r.parity.tensors}
    want = {"y": True, "dx": False, "dgate": False, "dup": True, "ddown": True}
    assert verdict == {k: v for k, v in want.items() if k in verdict}, explain(r)


@pytest.mark.standard
@pytest.mark.parametrize("case", GLU_CASES, ids=lambda c: c.name)
def test_the_other_glu_activation_fails_every_tensor(case: Case) -> None:
    """SiLU on a GeGLU case, GeGLU's GELU on a SwiGLU case (a backend that ignores the model's activation): every
    tensor fails, in every dtype."""
    other = {"geglu": "swiglu", "swiglu": "geglu"}[case.model]
    r = _run(case, "fwd+bwd", lambda c, m: _eager(c, m, act_mul=ACT_MUL[other]))
    assert r.status == "parity-fail" and not any(t.passed for t in r.parity.tensors), explain(r)


class _GeluWithoutDerivative(torch.autograd.Function):
    """GELU (tanh form) whose backward passes the gradient through unchanged (its derivative dropped)."""

    @staticmethod
    def forward(ctx: Any, f: torch.Tensor) -> torch.Tensor:
        return F.gelu(f, approximate="tanh")

    @staticmethod
    def backward(ctx: Any, da: torch.Tensor) -> torch.Tensor:
        return da


@pytest.mark.standard
@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
@pytest.mark.parametrize("case", FAMILY_CASES["gelu-mlp"], ids=lambda c: c.name)
def test_a_gpt2_mlp_backward_that_drops_gelu_derivative_fails_exactly_where_it_should(case: Case, mode: str) -> None:
    """The gradients behind the GELU (dx, dfc1, db1) fail; those before it (dfc2, db2) and y pass."""

    def make(c: Case, m: str) -> Prepared:
        problem = golden_for(c).problem
        module = build_module(problem, torch.device("cpu"), TORCH[c.dtype])
        return runner.prepare(problem, m, module, _gelu_mlp_forward(module, _GeluWithoutDerivative.apply))

    r = _run(case, mode, make)
    assert r.status == "parity-fail", explain(r)
    verdict = {t.tensor: t.passed for t in r.parity.tensors}
    want = {"y": True, "dx": False, "dfc1": False, "db1": False, "dfc2": True, "db2": True}
    assert verdict == {k: v for k, v in want.items() if k in verdict}, explain(r)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_returning_the_stored_reference_fails_the_dtype_check(case: Case) -> None:
    r = _run(case, "fwd+bwd", returns_the_reference)
    assert r.status == "parity-fail", explain(r)
    assert all("dtype" in t.failed for t in r.parity.tensors), explain(r)


#: (control, linear case): the bf16 run's lower-precision control rounds GeGLU's intermediate ``h``, which a linear
#: layer does not have, so it is not paired with bf16 linear cases.
LINEAR_PAIRS = [
    (n, c)
    for c in ALL_CASES
    if c.model == "linear"
    for n in ("zeros", "nan", "shifted-1%-rms", "lower-precision-math")
    if not (n == "lower-precision-math" and c.dtype == "bfloat16")
]


@pytest.mark.parametrize(("name", "case"), LINEAR_PAIRS, ids=[f"{n}-{c.name}" for n, c in LINEAR_PAIRS])
def test_model_independent_controls_fail_on_linear_too(name: str, case: Case) -> None:
    r = _run(case, "fwd+bwd", CONTROLS[name])
    assert r.status == "parity-fail" and not any(t.passed for t in r.parity.tensors), explain(r)
