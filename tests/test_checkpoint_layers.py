"""Every layer of a checkpoint: ``--weights model.safetensors.index.json --prefix 'model.layers.{i}.mlp.' --layers
all`` (``compare.problem.checkpoint``: the index, each tensor from its shard, a layer's case identified by the tensors
it reads; ``compare.report.layers``: the per-layer table and plot), on a generated Llama-named bfloat16 checkpoint of 4
layers in 2 shards (layer 1's ``down_proj`` in the second shard, the rest of it in the first).

- each layer is its own case with its own golden, read from its shards; ``--layers 1-2`` gives two;
- its identity: the sha256 of its own tensors (names, dtypes, shapes, bytes), so a change to another layer leaves it
  as it was, and a change to its own on one shard after the run started is refused naming that shard (the negative
  control);
- bfloat16 weights serve a float32 case, widened (exact), and the results and the report say so; a narrowing that is
  not exact stays refused;
- every bad input (a template without ``{i}``, ``{i}`` without ``--layers``, no layer matched, an index missing, a
  bad range) exits 2 with one line, before anything is measured;
- the layers fan out like any cells: a sweep's grid holds one case per layer, and a worker rebuilds each from the
  job's JSON (``compare.run.cell_worker``: what a Ray task runs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compare.backends import registry
from compare.cli.main import main
from compare.formats.codec import from_json, to_json
from compare.gate.parity_record import ParityRecord
from compare.problem import checkpoint, datacache, golden
from compare.problem.cases import Case, InputError, Shape, Weights
from compare.results.document import Result, Results, read_json
from compare.run import cell_worker
from compare.run.grid import Cell, cells_from_config, grid_config
from compare.timing.timer import TimingConfig
from tests import numpy_backend

#: in-process and well under a second each; the CLI runs are standard
pytestmark = pytest.mark.quick

TEMPLATE = "model.layers.{i}.mlp."
INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
DIM, HIDDEN = 96, 328
SHAPE = Shape(1, 16, DIM, HIDDEN)
NAMES = checkpoint.bare_names("swiglu")
FAST = ["--budget", "0.05", "--no-ceilings", "--quiet"]
RUN = ["run", "--model", "swiglu", "--dim", str(DIM), "--hidden", str(HIDDEN), "--batch", "1", "--seq", "16"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own data cache (a layer's reference is computed, never read from another test's)."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))


def make_checkpoint(folder: Path, layers: int = 4, dtype: torch.dtype = torch.bfloat16) -> dict[str, np.ndarray]:
    """A Llama-named checkpoint of ``layers`` layers (random weights, each layer its own) in 2 shards with its index
    in ``folder``; besides the MLPs an embedding and each layer's attention projection (names the templates must not
    take). Layer 1's ``down_proj`` lies in the second shard. Returns every tensor as float32 values."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn((10, DIM), generator=g)}
    for i in range(layers):
        p = TEMPLATE.format(i=i)
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn((DIM, DIM), generator=g)
        tensors[p + "gate_proj.weight"] = torch.randn((HIDDEN, DIM), generator=g) * DIM**-0.5
        tensors[p + "up_proj.weight"] = torch.randn((HIDDEN, DIM), generator=g) * DIM**-0.5
        tensors[p + "down_proj.weight"] = torch.randn((DIM, HIDDEN), generator=g) * HIDDEN**-0.5
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    half = layers // 2
    second = {n for n in tensors if any(n.startswith(f"model.layers.{i}.") for i in range(half, layers))}
    second.add(TEMPLATE.format(i=1) + "down_proj.weight")
    weight_map = {n: SHARDS[1] if n in second else SHARDS[0] for n in tensors}
    for shard in SHARDS:
        save_file({n: t for n, t in tensors.items() if weight_map[n] == shard}, str(folder / shard))
    meta = {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}
    (folder / INDEX).write_text(json.dumps({"metadata": meta, "weight_map": weight_map}, indent=2))
    return {k: v.float().numpy() for k, v in tensors.items()}


def _case(w: Weights, dtype: str = "float32") -> Case:
    return Case("swiglu", SHAPE, dtype, weights=w)


def _flip(path: Path, name: str) -> None:
    """Change one bit of tensor ``name``'s first value in safetensors file ``path``, in place."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    begin = 8 + n + json.loads(data[8 : 8 + n])[name]["data_offsets"][0]
    data[begin] ^= 0x01
    path.write_bytes(bytes(data))


# --- the checkpoint -----------------------------------------------------------------------------------------------


def test_layer_specs() -> None:
    assert checkpoint.parse_layers("all") is None
    assert checkpoint.parse_layers("0-3") == [0, 1, 2, 3]
    assert checkpoint.parse_layers("0,5,7") == [0, 5, 7]
    assert checkpoint.parse_layers("0-1, 7") == [0, 1, 7]
    assert checkpoint.span([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    for bad, says in (
        ("", "is empty"),
        ("x", "'x' is not a layer index"),
        ("-1", "'-1' is not a layer index"),
        ("3-1", "the range 3-1 runs down"),
        ("0,2,0", "layer 0 is given twice"),
        ("1-", "'1-' is not a layer index"),
    ):
        with pytest.raises(InputError, match=says):
            checkpoint.parse_layers(bad)


def test_each_layer_reads_its_tensors_from_their_shards_and_is_identified_by_them(tmp_path: Path) -> None:
    values = make_checkpoint(tmp_path / "ck")
    index = tmp_path / "ck" / INDEX
    layers = checkpoint.layer_weights(str(index), TEMPLATE, "all", NAMES)
    assert [w.layer for w in layers] == [0, 1, 2, 3]
    assert [w.prefix for w in layers] == [TEMPLATE.format(i=i) for i in range(4)]
    assert {w.path for w in layers} == {str(index.resolve())} and all(w.sharded for w in layers)
    assert all(w.dtypes == ("BF16",) for w in layers)
    # the sha256: per tensor the layer reads, the sha256 of a JSON line of its name, dtype and shape, its byte count
    # and its bytes; then of the lines "name digest", in name order
    with checkpoint.Checkpoint(str(index)) as ck:
        lines = ""
        for name in sorted(TEMPLATE.format(i=1) + n for n in NAMES):
            file, mm, e = ck.entry(name) or ("", None, None)
            assert e is not None and mm is not None
            h = hashlib.sha256(json.dumps([name, "BF16", list(e.shape)]).encode() + b"\n")
            h.update((e.end - e.begin).to_bytes(8, "little") + mm[e.begin : e.end])
            lines += f"{name} {h.hexdigest()}\n"
            assert Path(file).name == (SHARDS[1] if name.endswith("1.mlp.down_proj.weight") else SHARDS[0])
    assert layers[1].sha256 == hashlib.sha256(lines.encode()).hexdigest()
    # names: stable (made again, the same) and one per layer
    names = [_case(w).name for w in layers]
    assert len(set(names)) == 4 and names[1].endswith(f"-l1-w{layers[1].sha256[:12]}-p" + names[1].rsplit("-p", 1)[1])
    assert [_case(w).name for w in checkpoint.layer_weights(str(index), TEMPLATE, "0-3", NAMES)] == names
    assert checkpoint.layer_weights(str(index), TEMPLATE, "1-2", NAMES) == layers[1:3]
    # each layer's parameters are its own, from its shards (layer 1 from both), widened to float32 as they are
    for w in layers:
        params = checkpoint.load_params(_case(w))
        for canonical, hf in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            assert np.array_equal(params[canonical], values[f"{w.prefix}{hf}.weight"]), (w.layer, canonical)
    # one --prefix alone reads the same tensors as its layer (no layer index: another name, the same sha256)
    one = checkpoint.weights(str(index), TEMPLATE.format(i=2), NAMES)
    assert one.sha256 == layers[2].sha256 and one.layer is None and _case(one).name != names[2]
    with pytest.raises(ValueError, match="give their names"):
        checkpoint.weights(str(index), TEMPLATE.format(i=2))


def test_each_layer_has_its_own_golden(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck")
    layers = checkpoint.layer_weights(str(tmp_path / "ck" / INDEX), TEMPLATE, "all", NAMES)
    goldens = [golden.golden_for(_case(w)) for w in layers]
    for a in range(4):
        assert np.array_equal(goldens[a].x, goldens[0].x)  # the inputs: the seed's, the same for every layer
        for b in range(a):
            assert not np.allclose(goldens[a].ref["y"], goldens[b].ref["y"], rtol=0.1, atol=0.1), (a, b)


def test_a_layer_changed_on_its_shard_after_the_run_started_is_refused(tmp_path: Path) -> None:
    """The negative control: one bit of layer 1's ``down_proj`` on the second shard, changed after the case was
    made, is refused naming that shard, by the loader and by a worker rebuilding the case from its job; a change to
    another layer's tensor (layer 3's, on the same shard) leaves layer 1's case as it was."""
    make_checkpoint(tmp_path / "ck")
    index = tmp_path / "ck" / INDEX
    shard = (tmp_path / "ck" / SHARDS[1]).resolve()
    l1 = checkpoint.layer_weights(str(index), TEMPLATE, "1", NAMES)[0]
    case = _case(l1)
    _flip(shard, TEMPLATE.format(i=3) + "up_proj.weight")  # another layer's tensor on the same shard
    golden.golden_for.cache_clear()
    golden.make_problem(case)  # the control: layer 1 is as it was
    assert checkpoint.layer_weights(str(index), TEMPLATE, "1", NAMES)[0].sha256 == l1.sha256
    _flip(shard, TEMPLATE.format(i=1) + "down_proj.weight")  # one bit of layer 1's own, after its case was made
    with pytest.raises(checkpoint.WeightsChanged, match=rf"weights file {shard} changed since the run started"):
        golden.make_problem(case)
    registry.register(numpy_backend.SPEC)
    try:
        sent = cell_worker.payload(
            numpy_backend.SPEC, Cell(numpy_backend.NAME, case, "fwd"), TimingConfig(budget_s=0.01)
        )
        golden.golden_for.cache_clear()  # a worker process starts without the driver's golden data
        r = from_json(Result, cell_worker.run_payload(json.loads(json.dumps(sent)))["result"])
    finally:
        registry.unregister(numpy_backend.NAME)
    assert r.status == "error" and f"weights file {shard} changed since the run started" in r.reason
    assert f"changed since the run started: {TEMPLATE.format(i=1)}down_proj.weight (index" in r.reason
    assert r.weights == l1


def test_narrower_weights_serve_a_wider_case_only_when_exact(tmp_path: Path) -> None:
    values = make_checkpoint(tmp_path / "bf16")
    (w,) = checkpoint.layer_weights(str(tmp_path / "bf16" / INDEX), TEMPLATE, "0", NAMES)
    params = checkpoint.load_params(_case(w, "float32"))  # bfloat16 for float32: widened, exact
    assert np.array_equal(params["gate"], values[TEMPLATE.format(i=0) + "gate_proj.weight"])
    assert checkpoint.widened(w, "float32") == ["bfloat16"] and checkpoint.widened(w, "bfloat16") == []
    with pytest.raises(InputError, match=r"is BF16 in .*; the case \(swiglu, float16\) needs F16, or F32 holding"):
        checkpoint.load_params(_case(w, "float16"))  # not a widening: float16 holds not every bfloat16 value
    make_checkpoint(tmp_path / "f16", dtype=torch.float16)
    (h,) = checkpoint.layer_weights(str(tmp_path / "f16" / INDEX), TEMPLATE, "0", NAMES)
    assert h.dtypes == ("F16",) and checkpoint.widened(h, "float32") == ["float16"]
    checkpoint.load_params(_case(h, "float32"))
    with pytest.raises(InputError, match=r"is F16 in .*; the case \(swiglu, bfloat16\) needs BF16"):
        checkpoint.load_params(_case(h, "bfloat16"))


def test_a_layer_case_travels_as_json_and_a_sweep_grid_holds_every_layer(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck")
    layers = checkpoint.layer_weights(str(tmp_path / "ck" / INDEX), TEMPLATE, "0,3", NAMES)
    case = _case(layers[1])
    back = from_json(Case, json.loads(json.dumps(to_json(case))))
    assert back == case and back.name == case.name and back.layer == 3 and back.weights is not None
    assert back.weights.dtypes == ("BF16",)
    # an older document's weights (no layer, no dtypes) read as they always did
    old = {k: v for k, v in to_json(layers[0]).items() if k not in ("layer", "dtypes")}
    assert from_json(Weights, old).layer is None and "layer" not in to_json(dataclasses.replace(layers[0], layer=None))
    grid = grid_config("swiglu", DIM, HIDDEN, [4, 16], seq=4, weights=layers)
    assert "weights" not in grid and len(grid["layers"]) == 2
    cells = cells_from_config({"grid": grid, "dtypes": ["float32"], "modes": ["fwd"], "backends": ["torch-eager"]})
    assert [(c.case.layer, c.case.shape.tokens) for c in cells] == [(0, 4), (0, 16), (3, 4), (3, 16)]
    assert {c.case.weights for c in cells} == set(layers)
    # a single checkpoint without --layers keeps the grid it always had
    assert "layers" not in grid_config(
        "swiglu", DIM, HIDDEN, [4], weights=[checkpoint.weights(str(tmp_path / "ck" / INDEX), "", [])]
    )


# --- the command line ---------------------------------------------------------------------------------------------


@pytest.mark.standard
def test_every_layer_of_a_sharded_checkpoint_end_to_end(tmp_path: Path) -> None:
    """``run --layers all`` with a template on the bfloat16 checkpoint, a float32 run: one case per layer, each
    widened and said so, REPORT.md with a row per layer and backend and the layer plot next to it; ``--layers 1-2``
    gives two layers."""
    make_checkpoint(tmp_path / "ck")
    index = str(tmp_path / "ck" / INDEX)
    out = tmp_path / "out"
    args = [*RUN, "--backend", "torch-eager", "--mode", "fwd", "--dtype", "float32", *FAST, "--out", str(out)]
    assert main([*args, "--weights", index, "--prefix", TEMPLATE, "--layers", "all"]) == 0
    doc = read_json(out / "results.json")
    assert [(r.weights.layer if r.weights else None) for r in doc.results] == [0, 1, 2, 3]
    assert all(r.status == "ok" for r in doc.results), [r.reason for r in doc.results]
    assert all(r.weights is not None and r.weights.dtypes == ("BF16",) for r in doc.results)
    assert len({r.case for r in doc.results}) == 4
    report = (out / "REPORT.md").read_text()
    assert "## Layers" in report and "bfloat16 weights widened to float32" in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and "| torch-eager | float32 | fwd |" in line]
    assert [line.split(" | ")[0] for line in rows] == ["| 0", "| 1", "| 2", "| 3"]
    plot = "plots/layers-swiglu-d96-h328.png"
    assert (out / plot).is_file() and f"]({plot})" in report and plot in doc.plots
    # two layers of the four
    out2 = tmp_path / "two"
    args2 = [*args[:-1], str(out2), "--no-plots", "--weights", index, "--prefix", TEMPLATE, "--layers", "1-2"]
    assert main(args2) == 0
    assert [r.weights.layer for r in read_json(out2 / "results.json").results if r.weights] == [1, 2]
    assert "## Layers" in (out2 / "REPORT.md").read_text()


@pytest.mark.standard
def test_a_sweep_fans_the_layers_out_to_its_workers(tmp_path: Path) -> None:
    """``sweep --layers 0,3 --isolate``: every cell runs in a worker process that rebuilds its layer's case from the
    job's JSON and reads the layer from its shards (what a Ray task does); a row per layer and token count, the grid
    holding both layers, the report its Layers section."""
    make_checkpoint(tmp_path / "ck")
    out = tmp_path / "sweep"
    args = ["sweep", "--model", "swiglu", "--dim", str(DIM), "--hidden", str(HIDDEN), "--tokens", "4", "16"]
    args += ["--seq", "4", "--backend", numpy_backend.NAME, "--weights", str(tmp_path / "ck" / INDEX)]
    args += ["--prefix", TEMPLATE, "--layers", "0,3", "--isolate", "--budget", "0.02", "--no-ceilings", "--quiet"]
    registry.register(numpy_backend.SPEC)
    try:
        assert main([*args, "--out", str(out)]) == 0
    finally:
        registry.unregister(numpy_backend.NAME)
    doc = read_json(out / "results.json")
    got = [(r.weights.layer if r.weights else None, r.shape.tokens, r.status) for r in doc.results]
    assert got == [(0, 4, "ok"), (0, 16, "ok"), (3, 4, "ok"), (3, 16, "ok")], [r.reason for r in doc.results]
    assert doc.config.grid is not None and [w["layer"] for w in doc.config.grid["layers"]] == [0, 3]
    report = (out / "REPORT.md").read_text()
    assert "## Layers" in report and "| 3 | numpy-plain | float32 | fwd | 16 | ok |" in report
    assert (out / "plots" / "layers-swiglu-d96-h328.png").is_file()


@pytest.mark.standard
@pytest.mark.parametrize(
    ("what", "extra", "message"),
    [
        (
            "no {i}",
            ["--prefix", "model.layers.0.mlp.", "--layers", "all"],
            "--layers needs a --prefix template with {i}",
        ),
        ("{i} alone", ["--prefix", TEMPLATE], f"--prefix '{TEMPLATE}' is a layer template ({{i}}): give --layers"),
        ("no match", ["--prefix", "transformer.h.{i}.mlp.", "--layers", "all"], "--layers all: no layer of {index}"),
        ("missing", ["--prefix", TEMPLATE, "--layers", "2-5"], "--layers 2-5: layer 4 is not in {index}"),
        ("bad range", ["--prefix", TEMPLATE, "--layers", "3-1"], "--layers 3-1: the range 3-1 runs down"),
        ("bad index", ["--prefix", TEMPLATE, "--layers", "one"], "--layers one: 'one' is not a layer index"),
        ("no weights", ["--layers", "all"], "--layers all needs --weights"),
        ("not an index", ["--prefix", TEMPLATE, "--layers", "all"], "is not a safetensors file"),
    ],
)
def test_bad_layer_inputs_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, extra: list[str], message: str
) -> None:
    make_checkpoint(tmp_path / "ck")
    index = str((tmp_path / "ck" / INDEX).resolve())
    config = tmp_path / "ck" / "config.json"
    config.write_text(json.dumps({"hidden_size": DIM}))
    weights = [] if what == "no weights" else ["--weights", str(config) if what == "not an index" else index]
    out = tmp_path / "out"
    assert main([*RUN, "--backend", "torch-eager", "--mode", "fwd", *FAST, "--out", str(out), *weights, *extra]) == 2
    err = capsys.readouterr().err
    assert message.replace("{index}", index) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def _row(backend: str, layer: int, status: str, ratio: float, tensor: str = "y") -> Result:
    w = Weights("/ck/" + INDEX, "0" * 64, TEMPLATE.format(i=layer), layer)
    parity = ParityRecord(passed=status == "ok", tier={"ok": "pass"}.get(status, "fail"), worst_ratio=ratio)
    parity = dataclasses.replace(parity, worst_tensor=tensor)
    return Result.for_case(backend, _case(w), "fwd", status, parity=parity)


def test_the_layer_section_names_where_each_backend_first_leaves_the_pass_line() -> None:
    """A pure function of the results: per backend its first layer that is not a pass (an infinite statistic
    shown as such), one row per layer and backend; none for results of one layer."""
    from compare.report.layers import layers_section

    rows = [_row("a", 0, "ok", 0.3), _row("b", 0, "ok", 0.2)]
    rows += [_row("a", 1, "deviates", 1.7, "dx"), _row("b", 1, "ok", 0.25), _row("a", 2, "parity-fail", math.inf)]
    text = layers_section(Results(results=tuple(rows)))
    assert "- `a`: first not a pass at layer 1 (deviates, worst 1.7 (dx))" in text
    assert "- `b`: every layer passes; the worst statistic is 0.25 (y) of its pass line, at layer 1" in text
    assert "| 2 | a | float32 | fwd | parity-fail | inf (y) | - |" in text
    assert [line.split(" | ")[:2] for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:] == [
        ["| 0", "a"], ["| 0", "b"], ["| 1", "a"], ["| 1", "b"], ["| 2", "a"]
    ]  # fmt: skip
    assert layers_section(Results(results=tuple(r for r in rows if r.weights and r.weights.layer == 0))) == ""
