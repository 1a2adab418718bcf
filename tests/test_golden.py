"""Golden files: integrity, byte-identical regeneration, and a reference checked against torch float64 autograd."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compare.gate.parity import DegenerateGolden, check_tensor
from compare.problem import golden as G
from compare.problem.cases import PRESETS, committed_cases
from compare.problem.reference import Arith, compute, round_to_dtype

pytestmark = pytest.mark.quick


def test_every_committed_file_matches_its_manifest() -> None:
    manifest = G.read_manifest()
    assert sorted(manifest["files"]) == sorted(f"{c.name}.safetensors" for c in committed_cases())
    for case in committed_cases():
        g = G.load_file(case)
        assert g.x.shape == case.input_shape() and g.ref["y"].dtype == np.float64
        assert {k: v.shape for k, v in g.params.items()} == case.weight_shapes(), case.name
        assert set(g.ref) == {"y", "dx", *(f"d{k}" for k in case.weight_shapes())}, case.name


def test_every_mlp_family_is_committed_on_tiny_and_odd_in_every_dtype() -> None:
    committed = {(c.model, c.shape, c.dtype) for c in committed_cases()}
    for model in ("geglu", "swiglu", "gelu-mlp"):
        for p in ("tiny", "odd"):
            for dtype in ("float32", "bfloat16", "float16"):
                assert (model, PRESETS[p].shape, dtype) in committed, (model, p, dtype)


@pytest.mark.standard
def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    G.write_all(tmp_path)
    for case in committed_cases():
        name = f"{case.name}.safetensors"
        assert (tmp_path / name).read_bytes() == (G.GOLDEN_DIR / name).read_bytes(), name
    assert json.loads((tmp_path / G.MANIFEST).read_text())["files"] == G.read_manifest()["files"]


@pytest.fixture
def golden_copy(tmp_path: Path) -> Path:
    shutil.copytree(G.GOLDEN_DIR, tmp_path / "golden")
    return tmp_path / "golden"


def test_hash_drift_is_detected_and_names_the_file(golden_copy: Path) -> None:
    case = PRESETS["tiny"].case("float32")
    path = golden_copy / f"{case.name}.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of one float
    path.write_bytes(bytes(data))
    with pytest.raises(G.GoldenError, match=rf"{case.name}\.safetensors does not match its manifest.*make_golden"):
        G.load_file(case, golden_copy)


def test_missing_file_says_how_to_regenerate(golden_copy: Path) -> None:
    case = PRESETS["odd"].case("bfloat16")
    (golden_copy / f"{case.name}.safetensors").unlink()
    with pytest.raises(G.GoldenError, match=r"is missing; regenerate with `python scripts/make_golden.py`"):
        G.load_file(case, golden_copy)


@pytest.mark.standard
def test_generation_is_a_pure_function_of_the_case() -> None:
    case = (
        PRESETS["cpu-mlp"]
        .case("bfloat16")
        .__class__(model="geglu", shape=PRESETS["tiny"].shape, dtype="bfloat16", dist="student_t", seed=7)
    )
    a, b = G.make_golden(case), G.make_golden(case)
    assert G.serialize(a) == G.serialize(b)
    assert not np.array_equal(a.x, G.make_golden(PRESETS["tiny"].case("bfloat16")).x)


def test_inputs_hold_dtype_values_and_two_distributions_are_committed() -> None:
    for case in committed_cases():
        g = G.golden_for(case)
        for arr in (g.x, g.dy, *g.params.values()):
            assert np.array_equal(arr, round_to_dtype(arr, case.dtype)), case.name
    dists = {c.dist for c in committed_cases()}
    assert dists == {"normal", "student_t"}
    heavy = G.golden_for(PRESETS["odd"].case("float32")).x
    assert np.max(np.abs(heavy)) > 8  # a normal of this size would almost never reach 8


@pytest.mark.standard
def test_weights_are_scaled_by_fan_in() -> None:
    g = G.make_golden(PRESETS["tiny"].case("float32"))
    d, h = PRESETS["tiny"].shape.dim, PRESETS["tiny"].shape.hidden
    assert abs(np.std(g.params["gate"]) * np.sqrt(d) - 1) < 0.05
    assert abs(np.std(g.params["down"]) * np.sqrt(h) - 1) < 0.05
    # gelu-mlp: biases drawn at their layer's fan-in, like linear's bias
    m = G.make_golden(PRESETS["tiny"].case("float32", model="gelu-mlp"))
    assert abs(np.std(m.params["fc1"]) * np.sqrt(d) - 1) < 0.05 and abs(np.std(m.params["fc2"]) * np.sqrt(h) - 1) < 0.05
    assert abs(np.std(m.params["b1"]) * np.sqrt(d) - 1) < 0.15  # 328 draws
    assert abs(np.std(m.params["b2"]) * np.sqrt(h) - 1) < 0.25  # 96 draws


def _torch_forward(model: str, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each model written out in torch.nn.functional, independently of compare.problem.reference."""
    if model == "geglu":
        return F.linear(F.gelu(F.linear(x, p["gate"]), approximate="tanh") * F.linear(x, p["up"]), p["down"])
    if model == "swiglu":
        return F.linear(F.silu(F.linear(x, p["gate"])) * F.linear(x, p["up"]), p["down"])
    if model == "gelu-mlp":
        return F.linear(F.gelu(F.linear(x, p["fc1"], p["b1"]), approximate="tanh"), p["fc2"], p["b2"])
    return F.linear(x, p["weight"], p["bias"])


@pytest.mark.parametrize("model", ["geglu", "linear", "swiglu", "gelu-mlp"])
def test_numpy_reference_matches_torch_float64_autograd(model: str) -> None:
    """The golden math is checked against an independent implementation: torch autograd in float64."""
    case = PRESETS["odd"].case("float32", model=model)
    g = G.golden_for(case)
    x = torch.tensor(g.x, dtype=torch.float64, requires_grad=True)
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in g.params.items()}
    y = _torch_forward(model, x, p)
    grads = torch.autograd.grad(y, [x, *p.values()], torch.tensor(g.dy, dtype=torch.float64))
    np.testing.assert_allclose(g.ref["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    names = ["dx", *(f"d{k}" for k in p)]
    for name, grad in zip(names, grads, strict=True):
        np.testing.assert_allclose(g.ref[name], grad.numpy(), rtol=1e-10, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("model", ["swiglu", "gelu-mlp"])
def test_plain_emulation_rounds_what_eager_torch_writes(model: str) -> None:
    """The plain same-dtype computation of the new families is eager torch's in bf16, tensor for tensor, up to GEMM
    summation order: its error against float64 is of the size of torch's own (within 2x, either way)."""
    case = PRESETS["tiny"].case("bfloat16", model=model)
    g = G.golden_for(case)
    plain = compute(model, g.x, g.params, g.dy, Arith.plain("bfloat16"))
    x = torch.tensor(g.x, dtype=torch.bfloat16, requires_grad=True)
    p = {k: torch.tensor(v, dtype=torch.bfloat16, requires_grad=True) for k, v in g.params.items()}
    y = _torch_forward(model, x, p)
    grads = torch.autograd.grad(y, [x, *p.values()], torch.tensor(g.dy, dtype=torch.bfloat16))
    got = {"y": y, **dict(zip(["dx", *(f"d{k}" for k in p)], grads, strict=True))}
    for name, t in got.items():
        e_torch = np.abs(t.detach().double().numpy() - g.ref[name]).mean()
        e_plain = np.abs(plain[name] - g.ref[name]).mean()
        assert 0.5 < e_plain / e_torch < 2.0, (name, e_plain, e_torch)


def test_bf16_rounding_matches_torch() -> None:
    a = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    want = torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(round_to_dtype(a, "bfloat16"), want)


def test_a_degenerate_reference_is_refused() -> None:
    ref = np.full((4, 4), 1e-6)
    with pytest.raises(DegenerateGolden, match="degenerate"):
        check_tensor("y", ref, ref, ref, "float32")
