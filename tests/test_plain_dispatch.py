"""The generic plain computation (``torch_impl.plain``) of the built-in torch modules gives the bits of
``compare.problem.reference.plain_run`` on every committed golden case, forward and backward, envelope and signature
twins included; controls that change one thing (the GELU form, the GEMM, one rounding) are told apart, an op without
a rule is refused by name, and the other rules compute the right math (against torch's own float64 autograd)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compare.problem.cases import PRESETS, Case, committed_cases
from compare.problem.golden import Golden, golden_for
from compare.problem.reference import Arith, plain_run
from torch_impl.models import PARAM_PATHS, build_module
from torch_impl.plain import PlainMode, UnsupportedOp, compute_under, plain_compute, plain_run_module
from torch_impl.plain_acts import NoActivation, acts_plain

pytestmark = pytest.mark.standard

CPU = torch.device("cpu")
PARTS = ("unrounded", "envelope", "signature")


def canonical(model: str, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The generic computation's ``d<torch parameter path>`` under the reference's canonical names."""
    rename = {f"d{path}": f"d{name}" for name, path in PARAM_PATHS[model].items()}
    return {rename.get(k, k): v for k, v in out.items()}


def differing(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> set[str]:
    assert set(got) == set(ref)
    return {k for k in ref if not np.array_equal(ref[k], got[k])}


def unrounded_reference(g: Golden) -> dict[str, np.ndarray]:
    return plain_run(g.case.model, g.case.dtype, g.case.seed, g.x, g.params, g.dy)[0]


def unrounded_arith(dtype: str) -> Arith:
    return Arith.plain(dtype, final=False)


@pytest.mark.parametrize("case", committed_cases(), ids=lambda c: c.name)
def test_the_generic_computation_gives_the_reference_bits_on_every_committed_case(case: Case) -> None:
    g = golden_for(case)
    ref = plain_run(case.model, case.dtype, case.seed, g.x, g.params, g.dy)
    got = plain_run_module(build_module(g.problem, CPU, torch.float64), case.dtype, case.seed, g.x, g.dy)
    twins = case.dtype == "float32" and case.model != "linear"
    for part, r, q in zip(PARTS, ref, got, strict=True):
        absent = part != "unrounded" and not twins
        assert (r is None, q is None) == (absent, absent), part
        if r is None or q is None:
            continue
        q = canonical(case.model, q)
        assert set(q) == {"y", "dx", *(f"d{k}" for k in case.weight_shapes())}, part
        for k in r:
            assert not np.isnan(r[k]).any() and not np.isnan(q[k]).any(), (part, k)
            assert q[k].shape == r[k].shape, (part, k)
        assert differing(r, q) == set(), part


def case_of(model: str, dtype: str) -> Golden:
    return golden_for(PRESETS["tiny"].case(dtype, model=model))


def test_control_erf_gelu_differs_everywhere_and_has_its_twins() -> None:
    """The erf GELU (``nn.GELU()``'s default) where the model has the tanh form: every tensor differs; its envelope
    twin (erf and exp 4 ulps off) and signatures exist, as the tanh form's do. An unknown kind has no form."""
    g = case_of("geglu", "float32")
    module = build_module(g.problem, CPU, torch.float64, act_mul=lambda a, u: F.gelu(a) * u)  # erf, not tanh
    got = plain_compute(module, g.x, g.dy, unrounded_arith("float32"), acts_plain("float32"))
    assert differing(unrounded_reference(g), canonical("geglu", got)) == {"y", "dx", "dgate", "dup", "ddown"}
    unrounded, envelope, signature = plain_run_module(module, "float32", g.case.seed, g.x, g.dy)
    assert envelope is not None and signature is not None
    assert differing(unrounded, envelope) == set(unrounded)
    assert all(signature[k].shape == (2, *unrounded[k].shape) and np.any(signature[k] != 0) for k in unrounded)
    with pytest.raises(NoActivation, match="no activation of kind 'swish'; kinds: gelu_tanh, gelu_erf, silu, mish"):
        acts_plain("float32")("swish")


def gemm_rounded_once(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A float32 GEMM of another accumulation than ``fixedbits.matmul32``'s sequential float32 sum: the product
    accumulated in float64 and rounded to float32 once (as an accurate GEMM writes it). torch's own float32 GEMM was
    the control before, but its order is the machine's: under MKL_CBWR=COMPATIBLE and ATen's AVX2 cap its y of the
    linear case matched the sequential sum bit for bit."""
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float32)


@pytest.mark.parametrize("model", ["linear", "swiglu"])
def test_control_another_float32_gemm_differs(model: str) -> None:
    # a float32 case: in bfloat16 the products and many of their sums are exact in float32, in any order
    g = case_of(model, "float32")
    ref = unrounded_reference(g)
    module = build_module(g.problem, CPU, torch.float64)
    got = plain_compute(module, g.x, g.dy, Arith("float32", final=False, gemm=gemm_rounded_once), acts_plain("float32"))
    assert {"y", "dx"} <= differing(ref, canonical(model, got))
    # the mode left out altogether: the module run by torch in float32 (as its dtype's accumulator)
    native = build_module(g.problem, CPU, torch.float32)
    x = torch.from_numpy(g.x).requires_grad_(True)
    y = native(x)
    grads = torch.autograd.grad(y, [x, *native.parameters()], torch.from_numpy(g.dy))
    names = ["y", "dx", *(f"d{k}" for k, _ in native.named_parameters())]
    torch_out = {k: v.detach().numpy() for k, v in zip(names, [y, *grads], strict=True)}
    assert {"y", "dx"} <= differing(ref, canonical(model, torch_out))


class SkipOneRounding(PlainMode):
    """Reads the GELU's input as stored (the float32 accumulator) instead of rounded to the dtype."""

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func.overloadpacket is not torch.ops.aten.gelu:
            return super().__torch_dispatch__(func, types, args, kwargs)
        ar, self.ar = self.ar, dataclasses.replace(self.ar, inner="float32")
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self.ar = ar


def test_control_one_skipped_rounding_in_bfloat16_differs_downstream_of_it() -> None:
    g = case_of("geglu", "bfloat16")
    module = build_module(g.problem, CPU, torch.float64)
    got = compute_under(SkipOneRounding(unrounded_arith("bfloat16"), acts_plain("float32")), module, g.x, g.dy)
    # act(g) moves: y, and through h and du every gradient but dgate (dg = da * gelu'(g) reads g rounded)
    assert differing(unrounded_reference(g), canonical("geglu", got)) == {"y", "ddown", "dup", "dx"}


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.lin(x), dim=-1)


class Casting(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * 2.0


def test_an_op_without_a_rule_is_refused_by_name() -> None:
    x, dy = np.ones((2, 4)), np.ones((2, 3))
    with pytest.raises(UnsupportedOp, match=r"no rule for aten\.cumsum\.default; aten ops with a rule: .*\bmm\b"):
        plain_compute(Cumulative(), x, dy, unrounded_arith("bfloat16"), acts_plain("float32"))
    with pytest.raises(UnsupportedOp, match=r"_to_copy.* dtype=torch\.float32.*a cast"):
        plain_compute(Casting(), x, None, unrounded_arith("bfloat16"), acts_plain("float32"))


class Mixed(nn.Module):
    """Every other rule: addmm, relu, tanh, sigmoid, neg, pow, div, sub, rsub, bmm, silu, erf GELU, Mish, sum over a
    dimension, an in-place add."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.randn(2, 5, 4, generator=gen, dtype=torch.float64))
        self.lin = nn.Linear(6, 5, dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(5, 6, generator=gen, dtype=torch.float64))
            self.lin.bias.copy_(torch.randn(5, generator=gen, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        a = 1.0 - (torch.relu(h) + torch.tanh(h) * torch.sigmoid(-h) - h**3 / 7.0)
        b = torch.bmm(a, self.w)
        b = F.silu(b) + F.gelu(b) + F.mish(b)
        out = b * b.sum(dim=1, keepdim=True)
        out.add_(b)
        return out


class Squashed(nn.Module):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * torch.sigmoid(self.lin(x)) + F.mish(self.lin(x))


def test_the_other_rules_compute_torchs_float64_math_and_the_twins_of_tanh_sigmoid_and_mish() -> None:
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 3, 4))
    module = Mixed()
    mode = PlainMode(Arith.exact(), acts_plain(None))
    got = compute_under(mode, module, x, dy)
    assert list(got) == ["y", "dx", *(f"d{k}" for k in module.state_dict())]
    assert mode.kinds == {"tanh", "sigmoid", "silu", "gelu_erf", "mish"}
    xt = torch.from_numpy(x).requires_grad_(True)
    y = module(xt)
    want = [y, *torch.autograd.grad(y, [xt, module.w, module.lin.weight, module.lin.bias], torch.from_numpy(dy))]
    for k, w in zip(got, want, strict=True):
        np.testing.assert_allclose(got[k], w.detach().numpy(), rtol=1e-12, atol=1e-13, err_msg=k)
    assert list(compute_under(PlainMode(Arith.exact(), acts_plain(None)), module, x, None)) == ["y"]
    # float32 twins for tanh, sigmoid and Mish
    squashed = Squashed(module.lin)
    unrounded, envelope, signature = plain_run_module(
        squashed, "float32", 0, x.astype(np.float32), dy[..., :1] + x[..., :5]
    )
    assert envelope is not None and signature is not None
    for k, v in unrounded.items():
        assert signature[k].shape == (2, *v.shape) and np.any(signature[k] != 0), k
        np.testing.assert_allclose(envelope[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
