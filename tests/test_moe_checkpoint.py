"""A MoE block's weights read from a checkpoint by their Hugging Face names (``--weights``,
``compare.problem.checkpoint.MOE_NAMES``): a hub checkpoint's one tensor per expert (Qwen3-MoE's
``experts.{e}.gate_proj.weight``, Mixtral's ``experts.{e}.w1.weight``) and transformers' fused experts (all three
blocks), each judged by what matters: the golden computed from the weights read equals transformers' own block in
float64 on those weights. Negative controls: a checkpoint with each expert's gate and up swapped is read, and its
golden differs from the block; a missing expert tensor is refused, named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compare.cli.main import main
from compare.problem import checkpoint
from compare.problem.cases import PRESETS, Case
from compare.problem.golden import golden_for
from tests.test_moe_reference import BLOCKS

pytestmark = pytest.mark.standard

PREFIX = "model.layers.3.mlp."
#: block (tests/test_moe_reference.py) -> its CPU preset; the per-expert names of a hub checkpoint: gate, up, down
PRESET = {"qwen3-moe": "qwen3-moe-cpu", "mixtral": "mixtral-cpu", "gpt-oss": "gpt-oss-20b-cpu"}
PER_EXPERT = {"qwen3-moe": ("gate_proj", "up_proj", "down_proj"), "mixtral": ("w1", "w3", "w2")}


def _block(name: str, seed: int = 0) -> torch.nn.Module:
    """transformers' block ``name`` (CPU-sized) in float64 holding random float32 values (a float32 case's)."""
    block = BLOCKS[name][0]()[0].double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in block.named_parameters():
            scale = 1.0 / np.sqrt(p.shape[-1] if p.ndim > 1 else 4)
            p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float32) * scale).double())
    return block


def _save(block: torch.nn.Module, path: Path, per_expert: tuple[str, str, str] | None, swap: bool = False) -> None:
    """``block``'s weights as float32 under ``PREFIX``: its own fused names, or one tensor per expert (gate and up
    taken from ``experts.gate_up_proj``'s two halves, swapped with ``swap``)."""
    sd = {k: v.float().contiguous() for k, v in block.state_dict().items()}
    if per_expert is not None:
        gate_up, down = sd.pop("experts.gate_up_proj"), sd.pop("experts.down_proj")
        hidden = gate_up.shape[1] // 2
        names = (per_expert[1], per_expert[0]) if swap else per_expert[:2]
        for e in range(gate_up.shape[0]):
            sd[f"experts.{e}.{names[0]}.weight"] = gate_up[e, :hidden].contiguous()
            sd[f"experts.{e}.{names[1]}.weight"] = gate_up[e, hidden:].contiguous()
            sd[f"experts.{e}.{per_expert[2]}.weight"] = down[e].contiguous()
    save_file({PREFIX + k: v for k, v in sd.items()}, str(path))


def _case(name: str, path: Path) -> Case:
    """The float32 case of ``name``'s CPU preset with its weights read from ``path`` (as ``--weights`` makes it)."""
    base = PRESETS[PRESET[name]].case("float32")
    with checkpoint.Checkpoint(str(path)) as ck:
        present = ck.names()
    w = checkpoint.weights(str(path), PREFIX, checkpoint.bare_names(base.model, None, present))
    return Case(base.model, base.shape, "float32", weights=w)


def _off(case: Case, block: torch.nn.Module) -> float:
    """The golden's ``y`` against the block's on the golden's inputs: the largest difference over ``max |y|``."""
    g = golden_for(case)
    with torch.no_grad():
        out = block(torch.from_numpy(np.asarray(g.x, np.float64)))
    theirs = (out[0] if isinstance(out, tuple) else out).numpy()
    ours = np.asarray(g.ref["y"], np.float64)
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


LAYOUTS = [(n, "per-expert") for n in PER_EXPERT] + [(n, "fused") for n in BLOCKS]


@pytest.mark.parametrize(("name", "layout"), LAYOUTS, ids=[f"{n}-{lay}" for n, lay in LAYOUTS])
def test_the_golden_of_a_checkpoint_s_block_is_the_block(tmp_path: Path, name: str, layout: str) -> None:
    """Saved in ``layout``, read back: the golden of the case equals transformers' block on the same weights (its
    tolerance: tests/test_moe_reference.py), the weights read are every tensor the layout names."""
    block = _block(name)
    path = tmp_path / "model.safetensors"
    _save(block, path, PER_EXPERT[name] if layout == "per-expert" else None)
    case = _case(name, path)
    assert case.weights is not None
    with checkpoint.Checkpoint(str(path)) as ck:
        present = set(ck.names())
    assert {PREFIX + n for n in checkpoint.bare_names(case.model, None, present)} == present  # every tensor, read
    assert _off(case, block) < BLOCKS[name][2]


@pytest.mark.parametrize("name", list(PER_EXPERT))
def test_a_checkpoint_with_gate_and_up_swapped_is_not_the_block(tmp_path: Path, name: str) -> None:
    """The control: each expert's gate and up saved under each other's names: read as they are named, the golden is
    another block's."""
    block = _block(name)
    path = tmp_path / "model.safetensors"
    _save(block, path, PER_EXPERT[name], swap=True)
    assert _off(_case(name, path), block) > 1e-3


def test_a_missing_expert_tensor_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Mixtral checkpoint without expert 5's ``w3``: ``run --weights`` exits 2 naming it, before measuring."""
    block = _block("mixtral")
    path = tmp_path / "model.safetensors"
    _save(block, path, PER_EXPERT["mixtral"])
    from safetensors.torch import load_file

    sd = load_file(str(path))
    del sd[PREFIX + "experts.5.w3.weight"]
    save_file(sd, str(path))
    out = tmp_path / "o"
    args = ["run", "--preset", "mixtral-cpu", "--dtype", "float32", "--weights", str(path), "--prefix", PREFIX]
    assert main([*args, "--backend", "torch-moe-loop", "--no-ceilings", "--out", str(out)]) == 2
    assert f"{PREFIX}experts.5.w3.weight is not in" in capsys.readouterr().err


def test_a_checkpoint_s_moe_layer_runs_end_to_end(tmp_path: Path) -> None:
    """``run --preset mixtral-cpu --weights F --prefix P`` with a hub-layout checkpoint: the MoE backends pass on
    the checkpoint's weights (the case is named by them)."""
    path = tmp_path / "model.safetensors"
    _save(_block("mixtral"), path, PER_EXPERT["mixtral"])
    out = tmp_path / "o"
    args = ["run", "--preset", "mixtral-cpu", "--dtype", "float32", "--weights", str(path), "--prefix", PREFIX]
    fast = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet", "--mode", "fwd+bwd"]
    assert main([*args, "--backend", "torch-moe-grouped", "jax-moe-ragged", *fast, "--out", str(out)]) == 0
