"""Every backend against the committed goldens; the gate's own rules on synthetic data; what a backend may see."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from compare.backends.registry import BACKENDS, Availability, BackendSpec, Prepared, spec
from compare.formats.codec import to_json
from compare.gate.parity import Plain, UnusableCase, check_all, check_plain, check_tensor
from compare.problem import fixedbits
from compare.problem.cases import MODULE_MODEL, MOE_MODELS, PRESETS, Case
from compare.problem.golden import Golden, Problem, golden_for
from compare.problem.reference import GELU_CUBIC, SQRT_2_OVER_PI, compute, round_to_dtype
from compare.run import harness
from compare.run.cell import implausible, plain_reference
from compare.run.harness import run, run_one
from compare.run.options import RunOptions
from compare.timing.timer import TimingConfig
from tests.conftest import explain, parity_result
from tests.parity_backends import (
    CASES,
    GPU_ONLY,
    GROUPS,
    PAIRS,
    RUN_HERE,
    XLA_FLOAT32_TRANSCENDENTAL,
    jax_platform,
    known_deviations,
    unexplained_rms,
)
from tests.variants import VARIANTS
from torch_impl import runner
from torch_impl.models import GatedMLP, GeluMLP, build_module

pytestmark = pytest.mark.quick

TINY = PRESETS["tiny"].case("float32")


def _id(c: Case) -> str:
    return c.name


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_registered_backend_runs_here_or_needs_a_gpu(backend: str) -> None:
    """With torch and jax installed, a backend is either available (interpreted counts) or says it needs a GPU;
    on CPU only jax-triton needs one, and at least the baseline and one backend per framework run."""
    a = spec(backend).availability()
    assert a.ok or GPU_ONLY in a.reason, a.reason
    assert {"torch-eager", "jax-xla"} <= set(RUN_HERE)


def test_the_parity_groups_cover_every_backend_that_runs_here_once() -> None:
    """Each backend that runs here is in exactly one group of ``tests/parity_backends.py`` (one module each), and
    every group but ``other`` has a module of its own."""
    for b in RUN_HERE:
        assert sum(g(b) for g in GROUPS.values()) == 1, b
    for group in GROUPS:
        if group != "other":
            assert (Path(__file__).parent / f"test_parity_{group.replace('-', '_')}.py").is_file(), group


def test_the_new_families_are_committed_and_paired_with_every_backend_that_implements_them() -> None:
    """SwiGLU runs on every backend that runs GeGLU here (every one but those of a user's module file, which run
    module cases alone); GPT-2's MLP on torch-eager, torch-compile and its max-autotune twin, jax-xla, jax-unfused and
    the recomputation variants; the others skip it with a reason (``run_one`` on a model outside the registry's
    ``models``)."""
    gelu_mlp = {
        "torch-eager",
        "torch-compile",
        "torch-compile-max-autotune",
        "torch-eager-remat",
        "jax-xla",
        "jax-xla-remat",
        "jax-unfused",
    }
    built_in = {b for b in RUN_HERE if BACKENDS[b].models not in ((MODULE_MODEL,), MOE_MODELS)}
    assert set(RUN_HERE) - built_in == {
        "torch-module", "torch-module-compile", "torch-module-compile-max-autotune", "jax-module", "jax-module-unfused",
        "torch-moe-loop", "torch-moe-grouped", "jax-moe-dense", "jax-moe-ragged", "torch-moe-loop-compile",
        "torch-moe-grouped-compile", "torch-moe-triton", "jax-moe-pallas",
    }  # fmt: skip
    for model, want in (("swiglu", built_in), ("gelu-mlp", gelu_mlp)):
        cases = [c for c in CASES if c.model == model]
        assert {(c.shape, c.dtype) for c in cases} == {
            (PRESETS[p].shape, d) for p in ("tiny", "odd") for d in ("float32", "bfloat16", "float16")
        }
        paired = {b for b, c in PAIRS if c.model == model}
        assert paired == want, paired
    case = PRESETS["tiny"].case("float32", model="gelu-mlp")
    r = run_one(spec("torch-triton"), case, "fwd", plain_reference(case), TimingConfig(), {}, time_it=False)
    assert r.status == "skipped" and "not gelu-mlp" in r.reason, r.reason


# ---- the negative controls live in tests/test_controls.py (every dtype and mode) --------------------------------


def test_the_eager_module_is_the_seeds_shape() -> None:
    m = GatedMLP(96, 328)  # the blog post's SimpleGeGLUMLP
    assert [n for n, _ in m.named_parameters()] == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    assert all(mod.bias is None for mod in (m.gate_proj, m.up_proj, m.down_proj))
    g = GeluMLP(96, 328)
    assert [(n, tuple(p.shape)) for n, p in g.named_parameters()] == [
        ("fc1.weight", (328, 96)),
        ("fc1.bias", (328,)),
        ("fc2.weight", (96, 328)),
        ("fc2.bias", (96,)),
    ]


def test_a_raising_backend_is_an_error_result_not_a_crash() -> None:
    def boom() -> Prepared:
        raise RuntimeError("out of registers")

    r = run_one(spec("torch-eager"), TINY, "fwd", plain_reference(TINY), TimingConfig(), {}, prepare=boom)
    assert r.status == "error" and "RuntimeError: out of registers" in r.reason
    assert r.parity is None and r.timing is None


def test_plain_emulation_is_no_stand_in_for_the_reference() -> None:
    """The yardstick is a real same-dtype computation: its error is nonzero, and larger in bf16 than fp32."""
    errs = {}
    for dtype in ("float32", "bfloat16"):
        case = PRESETS["tiny"].case(dtype)
        errs[dtype] = float(np.max(np.abs(plain_reference(case)["y"] - golden_for(case).ref["y"])))
    assert 0 < errs["float32"] < 1e-4 < errs["bfloat16"]


# ---- what a backend may see, and what it must keep doing -----------------------------------------------------


class _Spy:
    """A backend that records what ``prepare`` was given, then runs the eager module."""

    name = "spy"

    def __init__(self) -> None:
        self.seen: list[object] = []

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        self.seen.append(problem)
        return spec("torch-eager").load().prepare(problem, mode)


@dataclasses.dataclass(frozen=True)
class _InlineSpec(BackendSpec):
    """A registry entry whose backend object is given inline (tests only)."""

    backend: Any = None

    def load(self) -> Any:
        return self.backend


def test_prepare_is_given_inputs_and_weights_but_no_reference() -> None:
    spy = _Spy()
    s = _InlineSpec(name="spy", framework="torch", target="-", about="records its argument", backend=spy)
    r = run_one(s, TINY, "fwd+bwd", plain_reference(TINY), TimingConfig(), {}, time_it=False)
    assert r.status == "ok", explain(r)
    (problem,) = spy.seen
    assert isinstance(problem, Problem) and not isinstance(problem, Golden)
    assert not hasattr(problem, "ref")
    assert {f.name for f in dataclasses.fields(problem)} == {"case", "inputs", "params"}
    assert set(problem.inputs) == {"x", "dy"}


def test_the_timed_calls_are_checked_too() -> None:
    """A backend that is right on its first call and wrong afterwards (a stale buffer, a replay) fails: on the
    calls the harness made and judged (``compare.run.pipeline.Feed``)."""
    golden = golden_for(TINY)
    module = build_module(golden.problem, torch.device("cpu"), torch.float32)
    calls = [0]

    def forward(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        y = module(x)
        return y if calls[0] == 1 else y * 0.5

    cfg = TimingConfig(warmup=1, min_samples=5, max_samples=5, budget_s=0.0, min_sample_s=0.0)
    r = run_one(
        spec("torch-eager"),
        TINY,
        "fwd",
        plain_reference(TINY),
        cfg,
        {},
        prepare=lambda: runner.prepare(golden.problem, "fwd", module, forward),
    )
    assert r.status == "parity-fail", explain(r)
    assert r.parity is not None and r.parity.passed  # the first call was right
    assert list(r.parity.checked) == ["first call", "fresh inputs"]
    assert r.parity.fresh is not None and r.parity.fresh.tier == "fail"
    assert r.parity.fresh.made is not None and r.parity.fresh.made >= 5 + 1  # warm-up, sizing and samples
    assert r.reason.startswith("fresh inputs (seed"), r.reason


@pytest.mark.standard
def test_a_replayed_answer_fails_on_fresh_inputs_and_is_flagged_implausible() -> None:
    """The answer rounded to the dtype passes every parity check on the golden inputs (it is as good as any
    correctly rounded result), but not on fresh ones, and it comes back faster than the matmul ceiling measured in
    the same run allows: ``parity-fail``, with the implausible time recorded beside it (``tests/test_fastest.py``
    has the three forms of this cheat and the ``implausible`` status of a step that passes)."""
    golden = golden_for(TINY)
    y = torch.from_numpy(golden.ref["y"]).to(torch.float32)

    class Rounded:
        name = "rounded-answer"

        def availability(self) -> Availability:
            return Availability(True)

        def prepare(self, problem: Problem, mode: str) -> Prepared:
            return Prepared(
                step=lambda: y,
                sync=lambda _: None,
                to_numpy=lambda t: {"y": t.double().numpy()},
                bind=lambda _in, _slot: lambda: y,
            )

    s = _InlineSpec(name="rounded-answer", framework="torch", target="-", about="cheats", backend=Rounded())
    cfg = TimingConfig(warmup=1, budget_s=0.05)
    doc = run([TINY], [spec("torch-eager"), s], ["fwd"], RunOptions(cfg, ceilings=True))
    rows = {r.backend: r for r in doc.results}
    cheat = rows["rounded-answer"]
    assert cheat.status == "parity-fail" and cheat.parity is not None and cheat.parity.tier == "pass", explain(cheat)
    assert cheat.reason.startswith("fresh inputs (seed "), cheat.reason
    assert cheat.implausible.startswith("implausible:"), cheat
    assert rows["torch-eager"].implausible == "" and rows["torch-eager"].status == "ok"
    assert "implausible" not in to_json(rows["torch-eager"])  # the flag is written only where it is raised
    assert implausible(1.19) == "" and implausible(1.21)


@pytest.mark.standard
def test_a_case_the_gate_cannot_judge_is_an_error_naming_the_tensor_and_the_others_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = plain_reference
    bad = PRESETS["tiny"].case("float16")

    def plain(case: Case, backward: bool = True) -> dict[str, np.ndarray]:
        out = real(case, backward)
        if case == bad:
            out = {**out, "y": np.full_like(out["y"], np.inf)}
            check_plain(case.name, case.dtype, golden_for(case).ref, out)
        return out

    monkeypatch.setattr(harness, "plain_reference", plain)
    doc = run([bad, TINY], [spec("torch-eager")], ["fwd"], RunOptions(TimingConfig(), ceilings=False))
    by_case = {r.case: r for r in doc.results}
    assert by_case[bad.name].status == "error"
    assert "plain float16 computation of 'y'" in by_case[bad.name].reason
    assert by_case[TINY.name].status == "ok"


def test_a_reference_beyond_the_dtype_is_refused() -> None:
    ref = {"y": np.array([1.0, 7e4])}
    with pytest.raises(UnusableCase, match="'y' reaches 7e\\+04, beyond float16's largest finite value 65504"):
        check_plain("c", "float16", ref, {"y": np.array([1.0, 6e4])})
    check_plain("c", "bfloat16", ref, {"y": np.array([1.0, 7e4])})  # bf16 has the range


#: A deviating max or rms in a cause: the statistic, its value, its ratio to the plain computation's and that value.
STATISTIC = r"(max|rms) error ([0-9.e+-]+), ([0-9.]+)x the plain computation's ([0-9.e+-]+)"


def _ref(shape: tuple[int, int] = (64, 96)) -> np.ndarray:
    """A float64 reference of 6144 elements (the ``where`` check is judged on it)."""
    return np.random.default_rng(7).standard_normal(shape)


@pytest.mark.quick
def test_more_error_in_a_16_bit_bias_gradient_is_an_unexplained_deviation_in_numbers() -> None:
    """A float16 bias gradient one ulp off at random (about 3.5x the rms error of the plain computation, which rounds
    once) deviates on its rms, and its cause says so in numbers: the statistic, its value and its ratio to the plain
    computation's, with no cause read off its name and dtype (no twin computation sums tokens in the low dtype)."""
    ref = _ref()
    plain = round_to_dtype(ref, "float16")
    ulp = np.spacing(np.abs(plain.astype(np.float16))).astype(np.float64)
    y = plain + np.random.default_rng(8).choice([-1.0, 1.0], ref.shape) * ulp
    t = check_tensor("db1", y, ref, plain, "float16")
    assert t.tier == "deviates" and t.deviated == ["rms"], t.why
    m = re.fullmatch(f"unexplained deviation: {STATISTIC}", t.cause)
    assert m is not None and m.group(1) == "rms", t.cause
    assert float(m.group(2)) == pytest.approx(t.rms_err, rel=1e-2)
    assert float(m.group(3)) == pytest.approx(t.rms_err / t.rms_plain, rel=1e-2) and 2.5 < float(m.group(3)) < 8
    assert float(m.group(4)) == pytest.approx(t.rms_plain, rel=1e-2)
    assert "likely" not in t.cause and "token sum" not in t.cause


@pytest.mark.quick
def test_an_error_the_envelope_twin_has_passes_and_one_beyond_it_gives_its_ratio_to_the_twin() -> None:
    """The envelope twin (the plain float32 computation with its tanh / exp 4 ulp off) measures what an ordinary
    float32 library does: an output with the twin's error (another draw of it) is within both pass lines, which are
    built from the twin, so it passes with no cause. An error 4x the twin's rms deviates, and its cause gives the
    ratio to the twin's beside the ratio to the plain computation's."""
    ref = _ref()
    rng = np.random.default_rng(9)

    def off(ulps: float) -> np.ndarray:
        return (ref * (1 + ulps * 2.0**-24 * rng.standard_normal(ref.shape))).astype(np.float32)

    plain = Plain({"y": ref.astype(np.float32)}, envelope={"y": off(8)})
    rms_envelope = float(np.sqrt(np.mean((plain.envelope["y"] - ref) ** 2)))
    (within,) = check_all({"y": off(8)}, {"y": ref}, plain, "float32").tensors
    assert within.tier == "pass" and within.cause == "" and within.rms_err > 2.5 * within.rms_plain, within.why
    (beyond,) = check_all({"y": off(32)}, {"y": ref}, plain, "float32").tensors
    assert beyond.tier == "deviates" and beyond.deviated == ["rms"], beyond.why
    m = re.fullmatch(f"unexplained deviation: {STATISTIC}, ([0-9.]+)x the envelope twin's ([0-9.e+-]+)", beyond.cause)
    assert m is not None and m.group(1) == "rms", beyond.cause
    assert float(m.group(5)) == pytest.approx(beyond.rms_err / rms_envelope, rel=1e-2) and 3 < float(m.group(5)) < 5
    assert float(m.group(6)) == pytest.approx(rms_envelope, rel=1e-2)


@pytest.mark.quick
def test_a_zeroed_bias_gradient_is_not_explained_as_a_token_sum() -> None:
    """A float16 bias gradient zeroed whole is a different function (it fails); one with three of its small elements
    zeroed deviates on its max, and its cause gives that max error (the largest zeroed element's size) against the
    plain computation's, not a token sum: no twin computation measured one."""
    ref = _ref()
    plain = round_to_dtype(ref, "float16")
    zeroed = check_tensor("dbias", np.zeros_like(plain), ref, plain, "float16")
    assert zeroed.tier == "fail" and zeroed.cause.startswith("a different function: "), zeroed.cause
    y = plain.copy()
    small = [i for i in np.argsort(np.abs(ref), axis=None) if 0.015 < abs(ref.flat[i]) < 0.025][:3]
    y.flat[small] = 0.0
    t = check_tensor("dbias", y, ref, plain, "float16")
    assert t.tier == "deviates" and t.deviated == ["max"], t.why
    m = re.fullmatch(f"unexplained deviation: {STATISTIC}", t.cause)
    assert m is not None and m.group(1) == "max", t.cause
    assert float(m.group(2)) == pytest.approx(np.abs(plain.flat[small]).max(), rel=1e-2)
    assert float(m.group(3)) == pytest.approx(t.max_abs_err / t.plain_err, rel=1e-2)
    assert "token sum" not in zeroed.cause + t.cause and "likely" not in zeroed.cause + t.cause


@pytest.mark.quick
def test_a_constant_shift_is_an_unexplained_deviation_of_the_mean_not_of_the_scale() -> None:
    """A bf16 output 3e-4 too large everywhere (a constant shift of about a tenth of a bf16 unit roundoff of
    rms(ref)) deviates on its shift alone, and its cause states that statistic: the mean error and how many standard
    errors it lies beyond the plain computation's, never the scale's bias (which did not deviate)."""
    ref = _ref()
    t = check_tensor("y", round_to_dtype(ref + 3e-4, "bfloat16"), ref, round_to_dtype(ref, "bfloat16"), "bfloat16")
    assert t.tier == "deviates" and t.deviated == ["shift"], t.why
    m = re.fullmatch(
        r"unexplained deviation: a constant shift: mean error ([0-9.e+-]+) lies ([0-9.]+) standard errors beyond the "
        r"plain computation's \(or zero\)",
        t.cause,
    )
    assert m is not None, t.cause
    assert float(m.group(1)) == pytest.approx(t.mean_err, rel=1e-2) and 2.9e-4 > float(m.group(1)) > 2.7e-4
    assert float(m.group(2)) > 5 and "unit roundoffs" not in t.cause


@pytest.mark.standard
@pytest.mark.isa
def test_the_jax_dbias_finding_in_numbers() -> None:
    """Finding 1 in numbers, on the committed cases: the bias gradients of 16-bit cases deviate on their rms (more
    than 2.5x the plain computation's, far below the fail line), with no bias of their own; nothing else deviates."""
    if jax_platform() != "cpu":
        pytest.skip("an XLA:CPU observation; on this JAX platform the gradient parity test expects a pass")
    for case in [c for c in CASES if c.model in ("linear", "gelu-mlp") and c.dtype != "float32"]:
        r = parity_result("jax-xla", case, "fwd+bwd")
        for t in r.parity.tensors:
            if t.tensor in known_deviations("jax-xla", case)[0]:
                assert t.deviated == ["rms"] or set(t.deviated) == {"max", "rms"}, explain(r)
                assert 2.5 * t.rms_plain < t.rms_err < 0.5 * t.rms_fail, explain(r)
                assert unexplained_rms(t.cause), t.cause
            else:
                assert t.tier == "pass", explain(r)


def _jax_bf16_gelu_chain(g: np.ndarray, dtype: str, exact_constants: bool) -> np.ndarray:
    """gelu_tanh(g) as ``jax.nn.gelu(approximate=True)`` is written for a low-precision input (its jaxpr, the same on
    every platform): op by op, every intermediate rounded to the dtype, and the constants themselves rounded to it
    (in bf16, sqrt(2/pi) = 0.79788 becomes 0.796875 and 0.044715 becomes 0.0446777). tanh from
    compare.problem.fixedbits,
    so the emulation has the same bits on every CPU."""
    r = functools.partial(round_to_dtype, dtype=dtype)
    c_cubic, c_scale = np.float32(GELU_CUBIC), np.float32(SQRT_2_OVER_PI)
    if not exact_constants:
        c_cubic, c_scale = r(c_cubic), r(c_scale)
    t = r(r(g * g) * g)
    t = r(g + r(c_cubic * t))
    t = r(r(fixedbits.tanh(r(c_scale * t))) + 1.0)
    return r(g * r(0.5 * t))


def test_jax_gelu_uses_constants_rounded_to_the_dtype_on_every_platform() -> None:
    """The cause of the bf16 GELU finding is in jax.nn.gelu's jaxpr itself, before any backend lowers it: on a bf16
    input it multiplies by 0.796875 (sqrt(2/pi) rounded to bf16) and 0.044677734375, on every platform."""
    import jax
    import jax.numpy as jnp

    jaxpr = str(jax.make_jaxpr(lambda v: jax.nn.gelu(v, approximate=True))(jnp.ones(4, jnp.bfloat16)))
    assert "0.796875:bf16" in jaxpr and "0.044677734375:bf16" in jaxpr, jaxpr
    f32 = str(jax.make_jaxpr(lambda v: jax.nn.gelu(v, approximate=True))(jnp.ones(4, jnp.float32)))
    assert "0.796875" not in f32, f32


@pytest.mark.slow
def test_the_jax_bf16_gelu_finding_in_numbers() -> None:
    """A real finding only the statistical gate makes: on cpu-mlp (786k outputs) jax-xla's bf16 forward is
    systematically low by about 0.016% (a 25th of a bf16 ulp: it deviates, far below the fail line of a unit
    roundoff), beyond the plain bf16 computation's own bias. The cause: jax.nn.gelu evaluates bf16 op by op with its
    constants rounded to bf16 (its jaxpr, every platform; the test above); a numpy emulation of that chain reproduces
    the slope, and the same chain with the constants in fp32 is biased the other way. How a platform lowers the bf16
    ops decides the size: the numbers are XLA:CPU's, which keeps every intermediate in bf16."""
    if jax_platform() != "cpu":
        pytest.skip("the numbers are XLA:CPU's lowering (every intermediate in bf16); the cause is checked above")
    case = PRESETS["cpu-mlp"].case("bfloat16")
    plain = plain_reference(case)
    r = parity_result("jax-xla", case, "fwd")  # the fresh draw shared with torch-eager's below
    (t,) = r.parity.tensors
    assert r.status == "deviates" and t.deviated == ["scale"], explain(r)
    assert -2e-4 < t.scale_err < -1.2e-4 and abs(t.scale_err - t.scale_plain) > 10 * t.scale_se, t
    assert abs(t.scale_err - t.scale_plain) < t.scale_fail, t
    golden = golden_for(case)
    x = golden.x.reshape(-1, case.shape.dim)
    gate, up = (round_to_dtype(fixedbits.matmul32(x, golden.params[k].T), "bfloat16") for k in ("gate", "up"))
    ref = golden.ref["y"]
    slopes = {}
    for exact in (False, True):
        h = round_to_dtype(_jax_bf16_gelu_chain(gate, "bfloat16", exact) * up, "bfloat16")
        y = round_to_dtype(fixedbits.matmul32(h, golden.params["down"].T), "bfloat16").reshape(ref.shape)
        slopes[exact] = check_tensor("y", y, ref, plain["y"], "bfloat16").scale_err
    assert abs(slopes[False] - t.scale_err) < 2 * t.scale_se, (slopes, t.scale_err)
    assert slopes[True] > slopes[False] + 10 * t.scale_se, slopes
    # torch evaluates GELU in fp32 (its opmath) and passes on the same case
    assert parity_result("torch-eager", case, "fwd").status == "ok"


@pytest.mark.slow
def test_the_activation_in_bf16_deviates_on_cpu_mlp_as_jax_xla_does() -> None:
    """The activation evaluated op by op in bf16 with its constants rounded (jax.nn.gelu's way on a bf16 input) is
    too small to see on the committed cases (a hundred tokens: it passes there) and deviates on cpu-mlp (786k
    outputs): y about 0.016% low, a bias far below the fail line (a unit roundoff), reported as measured and left
    unexplained (the gate names a cause only where a twin computation predicts its size). Beside the JAX finding
    above: both read the plain bf16 computation of cpu-mlp (about 16 s), computed once for the module's worker."""
    case = PRESETS["cpu-mlp"].case("bfloat16")
    g = golden_for(case)
    variant = next(v for v in VARIANTS if v.name == "activation-in-dtype")
    y = compute(case.model, g.x, g.params, None, variant.arith(case))["y"]
    (t,) = check_all({"y": y}, {"y": g.ref["y"]}, plain_reference(case), case.dtype).tensors
    assert t.tier == "deviates" and t.deviated == ["scale"], t.why
    assert -2e-4 < t.scale_err < -1.2e-4 and abs(t.scale_err - t.scale_plain) < 0.1 * 2.0**-8, t
    assert (
        t.cause
        == f"unexplained deviation: a systematic bias of {t.scale_err / 2.0**-8:+.2g} unit roundoffs of bfloat16"
    )


@functools.cache
def _accurate_gelu() -> Any:
    """``jax.nn.gelu``'s stand-in with an accurate derivative: the same forward, and a backward that evaluates
    gelu' in float32 through the Pallas kernel's stable formula (no 1 + tanh, 1 - tanh^2 cancellation) and rounds
    once to the dtype, as a plain framework's fp32-opmath GELU backward does."""
    import jax
    import jax.numpy as jnp

    from jax_impl.ops.glu_pallas import _gelu_tanh_and_grad_f32

    gelu = jax.nn.gelu

    @jax.custom_vjp
    def accurate(v: jax.Array) -> jax.Array:
        return gelu(v, approximate=True)

    def bwd(v: jax.Array, d: jax.Array) -> tuple[jax.Array]:
        return ((d.astype(jnp.float32) * _gelu_tanh_and_grad_f32(v.astype(jnp.float32))[1]).astype(v.dtype),)

    accurate.defvjp(lambda v: (accurate(v), v), bwd)
    return lambda v, approximate=True: accurate(v)


@pytest.mark.standard
def test_the_jax_gelu_mlp_findings_in_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jax-xla findings on GPT-2's MLP, in numbers. Observed on XLA:CPU.

    1. XLA's GELU derivative on the ``odd`` float32 case: ``jax.grad(jax.nn.gelu(approximate=True))`` is exactly 0
       below about f = -4.5 where gelu' is still above 1e-6 in size (with AVX2, -3.5e-6 at f = -4.87): its largest
       error is more than 2.5x the plain float32 formula's. It
       reaches ``dfc1 = df^T x`` as a few elements: within 8x the plain computation's worst here, so ``dfc1`` passes
       (under a capped XLA instruction set it may deviate: finding 2 of the table above); it never fails.
    2. With an accurate GELU derivative in its place, the same backend passes everything in float32, and only bias
       gradients (finding 1: token sums in the low dtype) deviate, only in bf16/fp16.
    """
    if jax_platform() != "cpu":
        pytest.skip("an XLA:CPU observation; on this JAX platform the gradient parity test expects a pass")
    import jax

    from compare.problem.reference import activations_in, gelu_tanh_grad

    odd = PRESETS["odd"].case("float32", model="gelu-mlp")
    g = golden_for(odd)
    x = g.x.reshape(-1, odd.shape.dim)
    f = (fixedbits.matmul64(x, g.params["fc1"].T) + g.params["b1"]).astype(np.float32)
    truth = gelu_tanh_grad(f.astype(np.float64))
    d_jax = np.asarray(jax.jit(jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=True))))(f.ravel()))
    err_jax = np.abs(d_jax.reshape(f.shape) - truth)
    plain_grad = activations_in("gelu-mlp", "tanh", "float32")[1]  # the plain float32 formula, op by op
    err_plain = float(np.max(np.abs(plain_grad(f.astype(np.float64)) - truth)))
    # XLA's tanh is chosen by its instruction set: with AVX2 (or wider) it rounds to -1 below about f = -4.5 and
    # gelu' is exactly 0 where its true value is above 1e-6 in size (-3.5e-6 at f = -4.87); capped at AVX it does
    # not saturate there, and its error lies elsewhere. Either way it is several times the plain formula's.
    zeroed = (d_jax.reshape(f.shape) == 0) & (truth != 0) & (f < -4.5)
    capped = re.search(r"--xla_cpu_max_isa=(\w+)", os.environ.get("XLA_FLAGS", ""))
    if capped is None or capped.group(1).upper().startswith(("AVX2", "AVX512")):
        assert zeroed.any() and np.abs(truth[zeroed]).max() > 1e-6, np.abs(truth[zeroed]).max(initial=0)
    assert 2.5 * err_plain < err_jax.max(), (err_jax.max(), err_plain)
    r = parity_result("jax-xla", odd, "fwd+bwd")
    assert r.status != "parity-fail", explain(r)
    t = {x.tensor: x for x in r.parity.tensors}["dfc1"]
    assert t.tier in ("pass", "deviates") and t.max_abs_err > t.plain_err, t

    monkeypatch.setattr(jax.nn, "gelu", _accurate_gelu())
    for case in [c for c in CASES if c.model == "gelu-mlp"]:
        r = run_one(spec("jax-xla"), case, "fwd+bwd", plain_reference(case), TimingConfig(), {}, time_it=False)
        deviating = {x.tensor for x in r.parity.tensors if x.tier != "pass"}
        if case.dtype == "float32":
            assert deviating <= XLA_FLOAT32_TRANSCENDENTAL["gelu-mlp"], explain(r)
        else:
            assert "db2" in deviating and deviating <= {"db1", "db2"} and r.status == "deviates", explain(r)
