"""Every activation a real MLP uses, in a module file (``tests/modules/``): torch's default ``nn.GELU()`` (the erf
form), the tanh GELU, SiLU, ReLU, squared ReLU (``torch.square``) and Mish, each beside its JAX port, pass the parity
gate in float32 and bfloat16, forward and backward; and ``examples/gpt_neox_mlp.py`` (transformers' ``GPTNeoXMLP``,
the erf GELU of Pythia) on every backend of a module case. In float32 the erf GELU and Mish are judged with their
envelope twins and signatures (``torch_impl.plain_acts``); ReLU and squared ReLU have none (exact ops). The negative
controls are ``tests/test_module_file.py``'s (a port with the other GELU fails; an op without a rule exits 2).

Plain ReLU is judged without bfloat16 gradients: its derivative is a step, and JAX's port adds the bias after a
bfloat16 GEMM (two roundings where torch's addmm has one), which moves the sign of a few elements of ``h`` near 0
(4 of 36408 here), each changing ``dh`` by a whole gradient; on fresh inputs the gate's per-call check (an error
above 0.125 of a token's largest ``|dx|``) then fails on some seeds and not others. Squared ReLU's derivative is
continuous at 0, and float32's rounding too fine, for it to matter."""

from __future__ import annotations

from pathlib import Path

import pytest

from compare.cli.main import main
from compare.problem import datacache, golden
from compare.results.document import Result, read_json

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "tests" / "modules"
ACTIVATIONS = {
    name: MODULES / f"{name}_mlp.py"
    for name in ("gelu_erf", "gelu_tanh", "silu", "relu", "squared_relu_square", "mish")
}
GPT_NEOX = ROOT / "examples" / "gpt_neox_mlp.py"
FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet", "--cache", "warm"]
SIZES = ["--dim", "96", "--hidden", "328"]
GRID = [*SIZES, "--dtype", "float32", "bfloat16", "--mode", "fwd", "fwd+bwd"]
#: (dtypes, modes) judged per activation: every pair, except for ReLU (the module docstring).
EVERY = (("float32", "bfloat16"), ("fwd", "fwd+bwd"))
JUDGED: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {name: [EVERY] for name in ACTIVATIONS}
JUDGED["relu"] = [(("float32",), ("fwd", "fwd+bwd")), (("bfloat16",), ("fwd",))]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own data cache: a module case's golden is computed here, never read from another test's."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))


def _golden_state() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(golden.GOLDEN_DIR.iterdir()) if p.is_file()}


def _judged(r: Result) -> None:
    """No cell fails; every float32 cell and every torch one passes. JAX in bfloat16 may deviate (its activation
    evaluated in bfloat16, its bias gradients' token sums: docs/correctness.md's findings), never fail."""
    assert r.parity is not None and not r.parity.failed, (r.backend, r.dtype, r.mode, r.parity and r.parity.failed)
    if r.dtype == "float32" or r.backend.startswith("torch-"):
        assert r.status == "ok", (r.backend, r.dtype, r.mode, r.reason)
    else:
        assert r.status in ("ok", "deviates") and r.backend.startswith("jax-"), (r.backend, r.status, r.reason)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_activation_passes_in_float32_and_bfloat16_forward_and_backward(tmp_path: Path, name: str) -> None:
    backends = ["torch-module", "jax-module", "jax-module-unfused"]
    results = []
    for i, (dtypes, modes) in enumerate(JUDGED[name]):
        out = tmp_path / f"out{i}"
        args = ["run", "--module", str(ACTIVATIONS[name]), *SIZES, "--dtype", *dtypes, "--mode", *modes]
        assert main([*args, "--backend", *backends, *FAST, "--out", str(out)]) == 0
        rows = read_json(out / "results.json").results
        cells = sorted((b, d, m) for b in backends for d in dtypes for m in modes)
        assert sorted((r.backend, r.dtype, r.mode) for r in rows) == cells
        results += rows
    for r in results:
        _judged(r)
        if r.mode == "fwd+bwd":
            assert r.parity is not None
            assert {t.tensor for t in r.parity.tensors} == {
                "y", "dx", "dup.weight", "dup.bias", "ddown.weight", "ddown.bias",
            }  # fmt: skip


def test_gpt_neox_mlp_passes_on_every_module_backend(tmp_path: Path) -> None:
    """transformers' ``GPTNeoXMLP`` (erf GELU) against its hand-written JAX port: every module backend (the module
    eager and compiled, jitted JAX and op by op) in float32 and bfloat16, fwd and fwd+bwd; golden/ untouched."""
    before = _golden_state()
    out = tmp_path / "out"
    assert main(["run", "--module", str(GPT_NEOX), *GRID, *FAST, "--out", str(out)]) == 0
    doc = read_json(out / "results.json")
    assert {r.backend for r in doc.results} == {
        "torch-module", "torch-module-compile", "torch-module-compile-max-autotune", "jax-module", "jax-module-unfused",
    }  # fmt: skip
    assert len(doc.results) == 20
    for r in doc.results:
        _judged(r)
        if r.mode == "fwd+bwd":
            assert r.parity is not None
            assert {t.tensor for t in r.parity.tensors} == {
                "y", "dx", "ddense_h_to_4h.weight", "ddense_h_to_4h.bias", "ddense_4h_to_h.weight",
                "ddense_4h_to_h.bias",
            }  # fmt: skip
    assert _golden_state() == before
