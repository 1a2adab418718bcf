"""``--weights FILE [--prefix P]``: a case's parameters read from a safetensors checkpoint by their Hugging Face names
(``compare.problem.checkpoint``), the case's identity carrying the file (path, sha256, prefix), and every refusal
naming both sides (exit 2)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compare.cli.main import main
from compare.formats.codec import from_json, to_json
from compare.problem import checkpoint, datacache, golden
from compare.problem.cases import PRESETS, Case, InputError, Shape, Weights
from compare.problem.reference import Arith, compute, round_to_dtype
from compare.results.document import Result, read_json
from compare.run.grid import cells_from_config, grid_config

#: in-process and well under a second each; the CLI run, the subprocess and the isolated sweep are standard
pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
LLAMA = "model.layers.0.mlp."
GPT2 = "transformer.h.0.mlp."
TINY = PRESETS["tiny"].shape  # 3 x 37 x 96 -> 328


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own data cache (a weights case's reference is computed, never read from another test's)."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))


def _draw(shape: tuple[int, ...], seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32) * scale


def llama(path: Path, dtype: torch.dtype = torch.float32, dim: int = 96, hidden: int = 328) -> dict[str, np.ndarray]:
    """A Llama-named checkpoint (two layers, the prefix's one and another) at ``path``; its layer 0 as float32."""
    t = {
        f"{LLAMA}gate_proj.weight": _draw((hidden, dim), 1, dim**-0.5),
        f"{LLAMA}up_proj.weight": _draw((hidden, dim), 2, dim**-0.5),
        f"{LLAMA}down_proj.weight": _draw((dim, hidden), 3, hidden**-0.5),
        "model.layers.1.mlp.gate_proj.weight": _draw((hidden, dim), 4, 1.0),
        "model.embed_tokens.weight": _draw((10, dim), 5, 1.0),
    }
    t = {k: v.to(dtype) for k, v in t.items()}
    save_file(t, str(path))
    return {k: v.float().numpy() for k, v in t.items() if k.startswith(LLAMA)}


def gpt2(path: Path, dim: int = 96, hidden: int = 328) -> dict[str, np.ndarray]:
    """A GPT-2-named float32 checkpoint: Conv1D weights stored ``(in, out)``."""
    t = {
        f"{GPT2}c_fc.weight": _draw((dim, hidden), 6, dim**-0.5),
        f"{GPT2}c_fc.bias": _draw((hidden,), 7, 0.1),
        f"{GPT2}c_proj.weight": _draw((hidden, dim), 8, hidden**-0.5),
        f"{GPT2}c_proj.bias": _draw((dim,), 9, 0.1),
    }
    save_file(t, str(path))
    return {k: v.numpy() for k, v in t.items()}


def case_of(model: str, dtype: str, path: Path, prefix: str, shape: Shape = TINY) -> Case:
    return Case(model, shape, dtype, weights=checkpoint.weights(str(path), prefix))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_names_load_as_they_are_and_the_reference_is_theirs(tmp_path: Path, dtype: torch.dtype) -> None:
    path = tmp_path / "llama.safetensors"
    file = llama(path, dtype)
    case_dtype = "float32" if dtype == torch.float32 else "bfloat16"
    case = case_of("swiglu", case_dtype, path, LLAMA)
    g = golden.golden_for(case)
    for canonical, name in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        assert np.array_equal(g.params[canonical], file[f"{LLAMA}{name}.weight"]), canonical
    plain = PRESETS["tiny"].case(case_dtype, model="swiglu")  # the same case, weights drawn
    drawn = golden.golden_for(plain)
    assert np.array_equal(g.x, drawn.x) and np.array_equal(g.dy, drawn.dy)  # the inputs: the seed's, as always
    want = compute("swiglu", g.x, {k[len(LLAMA) :].split("_")[0]: v for k, v in file.items()}, None, Arith.exact())
    assert np.array_equal(g.ref["y"], want["y"])
    # the negative control: the drawn weights' reference is another
    assert not np.allclose(g.ref["y"], drawn.ref["y"], rtol=0.1, atol=0.1)


def test_gpt2_conv1d_weights_are_transposed_into_the_canonical_layout(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.safetensors"
    file = gpt2(path)
    case = case_of("gelu-mlp", "float32", path, GPT2)
    params = checkpoint.load_params(case)
    assert params["fc1"].shape == (328, 96) and params["fc2"].shape == (96, 328)
    assert np.array_equal(params["fc1"], file[f"{GPT2}c_fc.weight"].T)
    assert np.array_equal(params["fc2"], file[f"{GPT2}c_proj.weight"].T)
    assert np.array_equal(params["b1"], file[f"{GPT2}c_fc.bias"])
    assert np.array_equal(params["b2"], file[f"{GPT2}c_proj.bias"])
    g = golden.golden_for(case)
    assert np.array_equal(g.ref["y"], compute("gelu-mlp", g.x, params, None, Arith.exact())["y"])
    assert g.params["fc1"].flags.c_contiguous


def test_the_identity_tells_two_files_and_two_prefixes_apart(tmp_path: Path) -> None:
    """A case with weights: its name carries the file's sha256 (and its prefix's), its JSON (cache keys, worker jobs)
    the path, sha256 and prefix; it is never committed. A case without weights keeps its name and JSON."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    llama(a)
    llama(b, torch.bfloat16)
    ca, cb = case_of("swiglu", "float32", a, LLAMA), case_of("swiglu", "float32", b, LLAMA)
    sha = hashlib.sha256(a.read_bytes()).hexdigest()
    assert ca.weights == Weights(str(a.resolve()), sha, LLAMA)
    assert ca.name.startswith("swiglu-3x37x96-328-float32-normal-s0-w" + sha[:12] + "-p") and ca.name != cb.name
    other_layer = dataclasses.replace(ca, weights=dataclasses.replace(ca.weights, prefix="model.layers.1.mlp."))
    assert other_layer.name != ca.name
    assert golden._identity(ca) != golden._identity(cb) != golden._identity(other_layer)
    assert not golden.is_committed(ca)
    assert from_json(Case, json.loads(json.dumps(to_json(ca)))) == ca
    plain = PRESETS["tiny"].case("float32")
    assert plain.name == "geglu-3x37x96-328-float32-normal-s0" and "weights" not in to_json(plain)
    assert golden.is_committed(plain) and not golden.is_committed(dataclasses.replace(plain, weights=ca.weights))
    # a result carries the file; an older result (no weights key) reads as drawn weights
    row = to_json(Result.for_case("torch-eager", ca, "fwd", "skipped"))
    assert row["weights"]["sha256"] == sha and from_json(Result, row).weights == ca.weights
    old = to_json(Result.for_case("torch-eager", plain, "fwd", "skipped"))
    assert "weights" not in old and from_json(Result, old).weights is None
    # a sweep's grid carries it too, only where given
    grid = grid_config("swiglu", 96, 328, [1, 4], weights=ca.weights)
    cells = cells_from_config({"grid": grid, "dtypes": ["float32"], "modes": ["fwd"], "backends": ["torch-eager"]})
    assert {c.case.weights for c in cells} == {ca.weights}
    assert "weights" not in grid_config("swiglu", 96, 328, [1, 4])


def test_a_file_changed_since_the_case_was_made_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "llama.safetensors"
    llama(path)
    case = case_of("swiglu", "float32", path, LLAMA)
    llama(path, torch.bfloat16)  # rewritten in place
    with pytest.raises(checkpoint.WeightsChanged, match=rf"weights file {path.resolve()} changed since the run"):
        golden.make_problem(case)


def test_a_float32_file_serves_a_bf16_case_only_with_bf16_values(tmp_path: Path) -> None:
    exact, inexact = tmp_path / "exact.safetensors", tmp_path / "inexact.safetensors"
    llama(exact, torch.bfloat16)  # bf16 values ...
    t = {k: v.to(torch.bfloat16).float() for k, v in _load_torch(exact).items()}
    save_file(t, str(exact))  # ... stored as float32
    params = checkpoint.load_params(case_of("swiglu", "bfloat16", exact, LLAMA))
    assert np.array_equal(params["gate"], round_to_dtype(params["gate"], "bfloat16"))
    llama(inexact)
    with pytest.raises(InputError, match=r"gate_proj.weight is F32 in .* with values bfloat16 cannot hold exactly"):
        checkpoint.load_params(case_of("swiglu", "bfloat16", inexact, LLAMA))


def _load_torch(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_bad_files_are_refused_naming_both_sides(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.safetensors"
    gpt2(path, hidden=300)
    with pytest.raises(InputError) as e:
        checkpoint.load_params(case_of("gelu-mlp", "float32", path, GPT2))
    assert (
        f"{GPT2}c_fc.weight is [96, 300] in {path.resolve()}; the case (gelu-mlp, dim 96, hidden 328) needs [96, 328]"
        in str(e.value)
    )
    gpt2(path)
    with pytest.raises(InputError, match=r"c_fc.weight is F32 .* the case \(gelu-mlp, bfloat16\) needs BF16"):
        checkpoint.load_params(case_of("gelu-mlp", "bfloat16", path, GPT2))  # float32 values no bf16 holds
    with pytest.raises(InputError) as e:
        checkpoint.load_params(case_of("gelu-mlp", "float32", path, "h.0.mlp."))
    msg = str(e.value)
    assert msg.startswith(f"h.0.mlp.c_fc.weight is not in {path.resolve()}") and "h.0.mlp.c_proj.bias" in msg
    assert f"{GPT2}c_fc.weight" in msg  # a name in the file that ends the same way
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(InputError, match=r"junk.safetensors is not a safetensors file: its header is not JSON"):
        checkpoint.weights(str(tmp_path / "junk.safetensors"))
    with pytest.raises(InputError, match=r"no such file"):
        checkpoint.weights(str(tmp_path / "nope.safetensors"))


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compare", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, datacache.ENV: str(cache)},
        timeout=600,
    )


def _golden_state() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(golden.GOLDEN_DIR.iterdir()) if p.is_file()}


@pytest.mark.standard
def test_a_run_with_weights_names_the_file_in_its_report(tmp_path: Path) -> None:
    """The CLI end to end: a torch-eager run on Llama-named bf16 weights exits 0 (or 1), its results carry the file
    and its REPORT.md names the file and its sha256; golden/ is untouched."""
    path = tmp_path / "llama.safetensors"
    llama(path, torch.bfloat16)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    before = _golden_state()
    args = ["run", "--preset", "tiny", "--model", "swiglu", "--backend", "torch-eager", "--dtype", "bfloat16"]
    args += ["--mode", "fwd", "--weights", str(path), "--prefix", LLAMA, "--budget", "0.05", "--no-ceilings"]
    args += ["--no-plots", "--quiet", "--out", str(tmp_path / "out")]
    assert main(args) in (0, 1)
    doc = read_json(tmp_path / "out" / "results.json")
    (row,) = doc.results
    assert row.weights == Weights(str(path.resolve()), sha, LLAMA) and row.case.endswith(row.weights.tag)
    assert row.status in ("ok", "deviates"), row.reason
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "llama.safetensors" in report and sha in report
    assert _golden_state() == before


@pytest.mark.parametrize(
    ("what", "extra", "message"),
    [
        (
            "shape",
            ["--dtype", "bfloat16", "--hidden", "300", "--weights", "{bf16}", "--prefix", LLAMA],
            f"{LLAMA}gate_proj.weight is [328, 96] in {{bf16}}; the case (swiglu, dim 96, hidden 300) needs [300, 96]",
        ),
        (
            "name",
            ["--dtype", "bfloat16", "--weights", "{bf16}", "--prefix", "layers.0."],
            "layers.0.gate_proj.weight is not in {bf16}; the case (swiglu, --prefix 'layers.0.') needs "
            "layers.0.gate_proj.weight, layers.0.up_proj.weight, layers.0.down_proj.weight; names there like them: "
            f"model.layers.0.mlp.down_proj.weight, {LLAMA}gate_proj.weight",
        ),
        (
            "dtype",  # no widening: float16 holds not every bfloat16 value (a float32 case takes them: widened)
            ["--dtype", "float16", "--weights", "{bf16}", "--prefix", LLAMA],
            f"{LLAMA}gate_proj.weight is BF16 in {{bf16}}; the case (swiglu, float16) needs F16, or F32 holding only "
            "float16 values",
        ),
        (
            "not-bf16-values",
            ["--dtype", "bfloat16", "--weights", "{f32}", "--prefix", LLAMA],
            "the case (swiglu, bfloat16) needs BF16, or F32 holding only bfloat16 values",
        ),
        ("folder", ["--weights", "{tmp}"], "--weights {tmp} is not a file"),
        ("missing", ["--weights", "{tmp}/none.safetensors"], "--weights {tmp}/none.safetensors: no such file"),
        ("prefix alone", ["--prefix", LLAMA], f"--prefix '{LLAMA}' needs --weights"),
    ],
)
def test_bad_weights_exit_2_naming_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, extra: list[str], message: str
) -> None:
    where = {"bf16": str(tmp_path / "bf16.safetensors"), "f32": str(tmp_path / "f32.safetensors"), "tmp": str(tmp_path)}
    llama(tmp_path / "bf16.safetensors", torch.bfloat16)
    llama(tmp_path / "f32.safetensors")
    args = ["run", "--preset", "tiny", "--model", "swiglu", "--backend", "torch-eager", "--mode", "fwd"]
    args += ["--budget", "0.05", "--no-ceilings", "--no-plots", "--out", str(tmp_path / "out")]
    args += [x.format(**where) for x in extra]
    assert main(args) == 2, what
    err = capsys.readouterr().err
    assert message.format(**where) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.standard
def test_not_safetensors_exits_2_from_the_command_line(tmp_path: Path) -> None:
    """The real command: one line, no traceback, for a file that is not safetensors (here: a JSON file)."""
    junk = tmp_path / "config.json"
    junk.write_text(json.dumps({"hidden_size": 96}))
    args = ["run", "--preset", "tiny", "--model", "swiglu", "--backend", "torch-eager", "--weights", str(junk)]
    p = _cli(*args, "--out", str(tmp_path / "out"), cache=tmp_path / "cache")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"error: --weights {junk} is not a safetensors file: its first 8 bytes give")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("driver_hash", [False, True])
def test_a_worker_refuses_a_file_changed_since_the_driver_hashed_it(tmp_path: Path, driver_hash: bool) -> None:
    """A sweep worker rebuilds the case's golden data from the job: from a file changed since the driver made the case
    its cell is an ``error`` naming the file (a Ray worker, sent the driver's data hash, and a local one alike)."""
    from compare.backends.registry import spec
    from compare.run import cell_worker
    from compare.run.grid import Cell
    from compare.timing.timer import TimingConfig

    path = tmp_path / "llama.safetensors"
    llama(path)
    case = case_of("swiglu", "float32", path, LLAMA)
    sent = cell_worker.payload(spec("torch-eager"), Cell("torch-eager", case, "fwd"), TimingConfig(budget_s=0.01))
    if driver_hash:
        sent["golden_sha256"] = "0" * 64
    llama(path, torch.bfloat16)  # rewritten after the driver hashed it
    golden.golden_for.cache_clear()  # a worker process starts without the driver's golden data
    r = from_json(Result, cell_worker.run_payload(json.loads(json.dumps(sent)))["result"])
    assert r.status == "error" and f"weights file {path.resolve()} changed since the run started" in r.reason
    assert r.weights == case.weights


@pytest.mark.standard
def test_an_isolated_sweep_reads_the_weights_in_its_workers(tmp_path: Path) -> None:
    """``sweep --weights --isolate``: every cell runs in a worker process that rebuilds the golden data from the job's
    case (the file, checked by its sha256); every row carries the file, and the grid records it."""
    path = tmp_path / "gpt2.safetensors"
    gpt2(path, dim=24, hidden=40)
    out = tmp_path / "sweep"
    args = ["sweep", "--model", "gelu-mlp", "--dim", "24", "--hidden", "40", "--tokens", "8"]
    args += ["--backend", "torch-eager", "--weights", str(path), "--prefix", GPT2, "--budget", "0.02", "--isolate"]
    args += ["--no-plots", "--no-ceilings", "--quiet", "--out", str(out)]
    assert main(args) == 0
    doc = read_json(out / "results.json")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert [r.status for r in doc.results] == ["ok"], [r.reason for r in doc.results]
    assert {r.weights for r in doc.results} == {Weights(str(path.resolve()), sha, GPT2)}
    assert doc.config.grid is not None and doc.config.grid["weights"]["sha256"] == sha
    assert sha in (out / "REPORT.md").read_text()
