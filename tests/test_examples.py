"""``examples/llama_mlp.py``: transformers' ``LlamaMLP`` against a hand-written JAX port, on a checkpoint written
with Hugging Face names (``model.layers.0.mlp.gate_proj.weight``, ...), through ``run --module --weights --prefix``
as the README shows it; and the same port with its gate and up projections swapped, which the gate must fail with
the tensors named. (``examples/squared_relu_mlp.py`` is ``tests/test_module_file.py``'s.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from compare.cli.main import main
from compare.problem import datacache
from compare.results.document import read_json
from torch_impl import user_module

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama_mlp.py"
PREFIX = "model.layers.0.mlp."
FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet", "--cache", "warm"]


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bf16 checkpoint holding one Llama layer's MLP under Hugging Face names, and a tensor of another module
    beside it (a checkpoint holds the whole model; the prefix picks the MLP)."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))
    module = user_module.load(user_module.describe(str(LLAMA), 3, 37, 96, 328)).torch_module(96, 328)
    g = torch.Generator().manual_seed(3)
    tensors = {
        PREFIX + name: (torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5).to(torch.bfloat16)
        for name, p in module.state_dict().items()
    }
    tensors["model.layers.0.input_layernorm.weight"] = torch.ones(96, dtype=torch.bfloat16)
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path


def _run(tmp_path: Path, module: Path, weights: Path) -> int:
    args = ["run", "--module", str(module), "--dim", "96", "--hidden", "328", "--dtype", "bfloat16"]
    args += ["--mode", "fwd+bwd", "--backend", "torch-module", "jax-module", "--weights", str(weights)]
    return main([*args, "--prefix", PREFIX, *FAST, "--out", str(tmp_path / "out")])


def test_llama_mlp_and_its_jax_port_agree_on_a_hugging_face_checkpoint(tmp_path: Path, checkpoint: Path) -> None:
    assert _run(tmp_path, LLAMA, checkpoint) == 0
    doc = read_json(tmp_path / "out" / "results.json")
    assert [r.backend for r in doc.results] == ["torch-module", "jax-module"]
    for r in doc.results:
        assert r.status == "ok" and r.parity is not None and r.parity.tier == "pass", (r.backend, r.reason)
        assert {t.tensor for t in r.parity.tensors} == {
            "y", "dx", "dgate_proj.weight", "dup_proj.weight", "ddown_proj.weight",
        }  # fmt: skip
        assert r.weights is not None and r.weights.prefix == PREFIX
    report = (tmp_path / "out" / "REPORT.md").read_text(encoding="utf-8")
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() in report
    assert "llama_mlp.py" in report


def test_a_port_with_gate_and_up_swapped_fails_naming_the_tensors(tmp_path: Path, checkpoint: Path) -> None:
    swapped = tmp_path / "llama_mlp_swapped.py"
    source = LLAMA.read_text(encoding="utf-8")
    wrong = source.replace('params["gate_proj.weight"].T\n', 'params["up_proj.weight"].T  # swapped\n', 1)
    wrong = wrong.replace('params["up_proj.weight"].T\n', 'params["gate_proj.weight"].T\n', 1)
    assert wrong.count("# swapped") == 1 and wrong != source
    swapped.write_text(wrong, encoding="utf-8")
    assert _run(tmp_path, swapped, checkpoint) == 1  # a finding: parity fails
    torch_row, jax_row = read_json(tmp_path / "out" / "results.json").results
    assert torch_row.status == "ok"
    assert jax_row.status == "parity-fail" and jax_row.parity is not None
    assert {f.split(":")[0] for f in jax_row.parity.failed} >= {"y", "dx", "dgate_proj.weight", "dup_proj.weight"}
