"""``--module FILE.py``: a user's own MLP as a case (``compare.problem.cases.ModuleFile``, ``torch_impl.user_module``)
through the same gate, timer and report as the built-in models: the example runs through the CLI and every cell passes
parity (or deviates where JAX is known to), wrong JAX ports of a module fail with the tensor named, a bad file exits
2 naming what is wrong, and the case's identity carries the file (its sha256, checked again where the data is
rebuilt)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compare.backends.registry import module_file, spec
from compare.cli.main import main
from compare.formats.codec import from_json, to_json
from compare.problem import datacache, golden
from compare.problem.cases import MODULE_MODEL, Case, InputError, ModuleFile, Shape, Weights
from compare.results.document import Result, read_json
from compare.run.pipeline import skipped

#: in-process and well under a second each; the CLI runs are standard
pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "squared_relu_mlp.py"
FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet"]
MODULE_BACKENDS = ("torch-module", "jax-module", "jax-module-unfused")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own data cache: a module case's golden is computed here, never read from another test's."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))


#: A module file: ``down(ACT(up(x)))`` with biases in torch, and ``JAX`` its port (filled in per test).
TEMPLATE = """
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down({torch_act})


def torch_module(dim, hidden):
    return MLP(dim, hidden)


def jax_function(params, x):
    up_w, up_b, down_w, down_b = (params[k] for k in ("up.weight", "up.bias", "down.weight", "down.bias"))
{jax_body}
"""
SQUARED_RELU = "torch.relu(self.up(x)) ** 2"
GOOD_JAX = "    return jnp.square(jax.nn.relu(x @ up_w.T + up_b)) @ down_w.T + down_b"


def module_source(torch_act: str = SQUARED_RELU, jax_body: str = GOOD_JAX, extra: str = "") -> str:
    return TEMPLATE.format(torch_act=torch_act, jax_body=jax_body) + textwrap.dedent(extra)


def write(tmp_path: Path, source: str, name: str = "mlp.py") -> Path:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


def case_of(
    path: Path, dtype: str = "float32", dim: int = 96, hidden: int = 328, weights: Weights | None = None
) -> Case:
    shape = Shape(3, 37, dim, hidden)
    record = module_file().describe(str(path), shape.batch, shape.seq, dim, hidden)
    return Case(MODULE_MODEL, shape, dtype, weights=weights, module=record)


def _golden_state() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(golden.GOLDEN_DIR.iterdir()) if p.is_file()}


# --- the example, end to end ----------------------------------------------------------------------------------------


@pytest.mark.standard
def test_the_example_runs_through_the_cli_and_every_cell_passes_parity(tmp_path: Path) -> None:
    """``examples/squared_relu_mlp.py`` through ``run`` on torch-module, jax-module and jax-module-unfused in float32
    and bfloat16, fwd and fwd+bwd: exit 0, no cell fails; a deviation only where JAX is known to have one (its
    bias gradients' token sums in bfloat16, docs/correctness.md's findings); results and report name the file;
    golden/ is untouched."""
    before = _golden_state()
    out = tmp_path / "out"
    args = ["run", "--module", str(EXAMPLE), "--dim", "96", "--hidden", "328", "--backend", *MODULE_BACKENDS]
    args += ["--dtype", "float32", "bfloat16", "--mode", "fwd", "fwd+bwd", *FAST, "--out", str(out)]
    assert main(args) == 0
    doc = read_json(out / "results.json")
    assert len(doc.results) == 12
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    for r in doc.results:
        assert r.model == MODULE_MODEL and r.case.endswith(f"-m{sha[:12]}"), r.case
        assert r.status in ("ok", "deviates"), (r.backend, r.dtype, r.mode, r.reason)
        assert r.parity is not None and not r.parity.failed, (r.backend, r.parity.failed)
        if r.status == "deviates":
            assert r.backend.startswith("jax-") and r.dtype == "bfloat16", (r.backend, r.dtype, r.reason)
            assert {d.split(":")[0] for d in r.parity.deviated} <= {"dup.bias", "ddown.bias"}, r.parity.deviated
        if r.mode == "fwd+bwd":
            assert {t.tensor for t in r.parity.tensors} == {
                "y", "dx", "dup.weight", "dup.bias", "ddown.weight", "ddown.bias",
            }  # fmt: skip
        assert r.module is not None and r.module.sha256 == sha
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    assert f"Module: `squared_relu_mlp.py` (sha256 `{sha}`, parameters `up.weight` [328, 96]" in report
    assert f"(module `squared_relu_mlp.py`, sha256 `{sha[:12]}`)" in report
    assert "[vs torch-module](DETAILS.md#timing)" in report and "| torch-module | pass" in report
    assert "Fusion headroom: not modelled (your own MLP has no cost-model plan)" in report
    assert _golden_state() == before


@pytest.mark.standard
def test_the_compiled_module_passes_parity(tmp_path: Path) -> None:
    """``torch-module-compile`` (torch.compile of the file's module) on the example, float32 fwd+bwd."""
    out = tmp_path / "out"
    args = ["run", "--module", str(EXAMPLE), "--dim", "96", "--hidden", "328", "--backend", "torch-module-compile"]
    args += ["--dtype", "float32", "--mode", "fwd+bwd", *FAST, "--out", str(out)]
    assert main(args) == 0
    (r,) = read_json(out / "results.json").results
    assert r.status == "ok", r.reason


# --- wrong ports fail, naming the tensor ----------------------------------------------------------------------------

WRONG_PORTS = {
    # x @ W where torch computes x @ W.T: square weights (dim == hidden), so the shapes still agree
    "transposed weight": (
        SQUARED_RELU,
        "    return jnp.square(jax.nn.relu(x @ up_w + up_b)) @ down_w.T + down_b",
        {"y", "dx", "dup.weight", "ddown.weight"},
    ),
    "missing bias": (
        SQUARED_RELU,
        "    return jnp.square(jax.nn.relu(x @ up_w.T + up_b)) @ down_w.T",
        {"y", "ddown.bias"},
    ),
    "output x 1.5": (SQUARED_RELU, f"    return 1.5 * ({GOOD_JAX.strip()[len('return ') :]})", {"y"}),
    "erf GELU for tanh": (
        "F.gelu(self.up(x), approximate='tanh')",
        "    return jax.nn.gelu(x @ up_w.T + up_b, approximate=False) @ down_w.T + down_b",
        {"y"},
    ),
    # the other way round: nn.GELU()'s default (erf) ported with JAX's default (tanh); float32 judges it with the
    # erf GELU's envelope twin and signatures, which must not cover the other form
    "tanh GELU for erf": (
        "F.gelu(self.up(x))",
        "    return jax.nn.gelu(x @ up_w.T + up_b) @ down_w.T + down_b",
        {"y"},
    ),
}


@pytest.mark.standard
@pytest.mark.parametrize("port", list(WRONG_PORTS))
def test_a_wrong_jax_port_fails_parity_naming_the_tensor(tmp_path: Path, port: str) -> None:
    """A module file whose ``jax_function`` is not its ``torch_module``: jax-module fails in float32 (exit 1) with
    the tensors the mistake changes named among its failures; torch-module, the same file's module, passes."""
    torch_act, jax_body, named = WRONG_PORTS[port]
    path = write(tmp_path, module_source(torch_act, jax_body))
    out = tmp_path / "out"
    args = ["run", "--module", str(path), "--dim", "96", "--hidden", "96", "--backend", "torch-module", "jax-module"]
    args += ["--dtype", "float32", "--mode", "fwd+bwd", *FAST, "--out", str(out)]
    assert main(args) == 1
    rows = {r.backend: r for r in read_json(out / "results.json").results}
    assert rows["torch-module"].status == "ok", rows["torch-module"].reason
    wrong = rows["jax-module"]
    assert wrong.status == "parity-fail" and wrong.parity is not None
    failed = {f.split(":")[0] for f in wrong.parity.failed}
    assert named <= failed, (port, failed)
    assert all(name in wrong.reason for name in named), wrong.reason


# --- bad files exit 2 -------------------------------------------------------------------------------------------------


def _run_module(tmp_path: Path, path: str, *extra: str) -> list[str]:
    out = tmp_path / "out"
    return ["run", "--module", path, "--dim", "96", "--hidden", "96", "--backend", "jax-module", *extra, *FAST, "--out",
            str(out)]  # fmt: skip


BAD_FILES = {
    "no jax_function": (
        module_source(jax_body="    pass").replace("def jax_function", "def jax_fn"),
        "defines no jax_function; a module file must define torch_module(dim, hidden) -> torch.nn.Module and "
        "jax_function(params, x) -> y",
    ),
    "neither function": ("X = 1\n", "defines no torch_module and no jax_function"),
    "fails to import": (
        "import numpy\nraise RuntimeError('no GPU here')\n",
        "fails to import: RuntimeError: no GPU here",
    ),
    "syntax error": ("def torch_module(dim, hidden)\n", "fails to import: SyntaxError: expected ':'"),
    # the file's own exit is its failure, never the tool's status (it was exit 0 with no output)
    "sys.exit at import": ("import sys\nsys.exit(0)\n", "fails to import: SystemExit: 0"),
    "SystemExit in torch_module": (
        module_source().replace("return MLP(dim, hidden)", "raise SystemExit(1)"),
        "torch_module(96, 96) fails: SystemExit: 1",
    ),
    "forward fails at the shape": (
        module_source(torch_act="self.up(x[..., :-1])"),
        "its forward fails on an input [3, 37, 96]: RuntimeError: ",  # its shapes are checked on the meta device
    ),
    "not a module": (
        module_source().replace("return MLP(dim, hidden)", "return lambda x: x"),
        "torch_module(96, 96) returned a function, not a torch.nn.Module",
    ),
    "a buffer": (
        module_source().replace("super().__init__()", "super().__init__(); self.register_buffer('s', torch.ones(1))"),
        "its state_dict holds buffers (s)",
    ),
    "NaN out": (
        module_source(torch_act="torch.relu(self.up(x)) ** 2 * float('nan')"),
        "its forward returns 10656 NaN or infinite values of 10656 on a standard normal input [3, 37, 96] in float64, "
        "the first at token 0, column 0",
    ),
    "tokens mixed": (
        module_source(torch_act="torch.relu(self.up(x - x.mean(dim=1, keepdim=True))) ** 2"),
        "a token's output depends on other tokens (the output of a reordered input differs",
    ),
    "an op without a rule": (
        module_source(torch_act="torch.exp(self.up(x))"),
        "the plain computation has no rule for aten.exp.default; aten ops with a rule: add, addmm,",
    ),
    "a normalisation": (
        module_source(torch_act="F.layer_norm(torch.relu(self.up(x)), (96,))"),
        "the plain computation has no rule for aten.native_layer_norm.default;",
    ),
    "reference disagrees": (
        module_source(
            extra="""
            def reference(params, x):
                h = x @ params["up.weight"].T + params["up.bias"]
                return np.maximum(h, 0.0) ** 2 @ params["down.weight"].T  # the bias left out
            """
        ),
        "its reference(params, x) and its torch_module differ: max |difference|",
    ),
}


@pytest.mark.parametrize("bad", list(BAD_FILES))
def test_a_bad_module_file_exits_2_naming_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    source, message = BAD_FILES[bad]
    path = write(tmp_path, source, name=f"{bad.replace(' ', '_')}.py")
    assert main(_run_module(tmp_path, str(path))) == 2, bad
    err = capsys.readouterr().err
    assert f"--module {path}" in err and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_module_s_own_keyboard_interrupt_exits_2_while_the_tool_s_signal_handlers_are_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under ``python -m compare`` a signal only sets a flag (``compare.run.stop``), so a ``KeyboardInterrupt``
    out of a module file is the file's own: exit 2 naming it, not 130 ("interrupted"). Without the handlers (the
    Python API) it is a Ctrl-C and stays one: the control."""
    import signal

    from compare.run import stop

    path = write(tmp_path, module_source().replace("return MLP(dim, hidden)", "raise KeyboardInterrupt"))
    previous = signal.signal(signal.SIGINT, stop._handler)
    try:
        assert main(_run_module(tmp_path, str(path))) == 2
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "torch_module(96, 96) fails: KeyboardInterrupt" in capsys.readouterr().err
    assert main(_run_module(tmp_path, str(path))) == 130


@pytest.mark.standard
def test_a_module_s_gelu_is_told_apart_from_its_other_form_or_said_not_to_be(tmp_path: Path) -> None:
    """A module with a tanh GELU and its JAX port with erf: in float32 the gate tells the two forms apart (the port
    fails), in bfloat16 it cannot, and the report says so on the case's line (it read "parity all 2 pass" with no
    word, and DETAILS.md "- (no GELU)"). A module without a GELU has none to tell apart (the control)."""
    erf_port = "    return jax.nn.gelu(x @ up_w.T + up_b, approximate=False) @ down_w.T + down_b"
    path = write(tmp_path, module_source(torch_act="F.gelu(self.up(x), approximate='tanh')", jax_body=erf_port))
    out = tmp_path / "out"
    args = ["run", "--module", str(path), "--dim", "96", "--hidden", "96", "--backend", "jax-module", "--mode", "fwd"]
    assert main([*args, "--dtype", "float32", "bfloat16", *FAST, "--out", str(out)]) == 1
    doc = read_json(out / "results.json")
    assert {r.dtype: r.erf_distinguishable for r in doc.resolution} == {"float32": True, "bfloat16": False}
    assert {r.dtype: r.status for r in doc.results} == {"float32": "parity-fail", "bfloat16": "ok"}
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "erf vs tanh GELU not distinguishable" in report and "erf vs tanh GELU told apart" in report
    assert "no GELU" not in (out / "DETAILS.md").read_text(encoding="utf-8")
    assert golden.has_gelu(case_of(path)) and not golden.has_gelu(case_of(write(tmp_path, module_source(), "r.py")))


@pytest.mark.standard
def test_a_jax_function_that_exits_mid_run_is_an_error_cell_and_the_finished_cells_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sys.exit(0)`` inside ``jax_function``, called only once the run measures: the JAX cell is an ``error``
    naming it, the torch cell finished before it is in ``results.json``, and the status is the finding (1); it
    was exit 0 with no ``results.json``."""
    body = "    import sys\n    sys.exit(0)"
    path = write(tmp_path, module_source(jax_body=body))
    out = tmp_path / "out"
    args = ["run", "--module", str(path), "--dim", "96", "--hidden", "96", *FAST, "--out", str(out)]
    assert main([*args, "--backend", "torch-module", "jax-module"]) == 1
    rows = {r["backend"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert rows["torch-module"]["status"] == "ok", rows["torch-module"]
    assert rows["jax-module"]["status"] == "error"
    assert "its code raised SystemExit(0) itself" in rows["jax-module"]["reason"], rows["jax-module"]["reason"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--module", "{tmp}/none.py", "--dim", "8", "--hidden", "8"], "--module {tmp}/none.py: no such file"),
        (["--module", "{tmp}", "--dim", "8", "--hidden", "8"], "--module {tmp} is not a file"),
        (["--module", str(EXAMPLE), "--model", "geglu"], "--module is the case's model: give no --model with it"),
        (["--module", str(EXAMPLE)], "without --preset, give every dimension; missing: --dim, --hidden"),
        (
            ["--module", str(EXAMPLE), "--dim", "8", "--hidden", "8", "--world-size", "2"],
            "no tensor-parallel backend runs a module case",
        ),
    ],
)
def test_bad_module_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    backend = [] if "--world-size" in extra else ["--backend", "jax-module"]
    args = ["run", *[x.format(tmp=tmp_path) for x in extra], *backend, *FAST]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err, err
    assert len(err.strip().splitlines()) == 1


#: A module whose backward has an op without a rule (slicing's ``slice_backward``); its forward has none.
SLICED = "torch.cat([torch.relu(self.up(x))[..., :40], torch.relu(self.up(x))[..., 40:]], -1)"


def test_an_op_only_the_backward_lacks_is_refused_only_where_a_mode_needs_gradients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain computation's check runs the forward always and the backward where a ``--mode`` needs it: the
    forward alone passes it, ``fwd+bwd`` exits 2 naming the op, before anything is measured."""
    from compare.run import preflight

    path = write(tmp_path, module_source(torch_act=SLICED))
    case = case_of(path, dim=96, hidden=96)
    preflight.check_cases([case], backward=False)
    with pytest.raises(InputError, match=r"no rule for aten\.slice_backward\.default"):
        preflight.check_cases([case], backward=True)
    assert main(_run_module(tmp_path, str(path), "--mode", "fwd", "fwd+bwd")) == 2
    err = capsys.readouterr().err
    assert f"--module {path}: the plain computation has no rule for aten.slice_backward.default" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


#: A module whose ops change with its width: ``exp`` (no rule) only past the widths the preflight's check builds at.
WIDE_ONLY = "(torch.exp(self.up(x)) if self.up.out_features > 328 else torch.relu(self.up(x)))"


def test_the_check_builds_a_narrow_module_and_an_op_only_the_wide_one_has_still_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight's plain-rule check builds the module at no more than ``CHECK_WIDTHS`` (the widths it was
    called with are recorded); a module whose ops change past them passes that check, and its op without a rule is
    then refused by the golden's computation, still exit 2 naming it and before anything is measured. Control: at
    the narrow widths the same file's op set is the checked one (relu), which passes."""
    from compare.run import preflight
    from torch_impl import user_module

    widths: list[tuple[int, int]] = []
    build = user_module._instantiate

    def recorded(user: Any, path: str, dim: int, hidden: int) -> Any:
        widths.append((dim, hidden))
        return build(user, path, dim, hidden)

    monkeypatch.setattr(user_module, "_instantiate", recorded)
    path = write(tmp_path, module_source(torch_act=WIDE_ONLY))
    preflight.check_cases([case_of(path, dim=160, hidden=400)], backward=True)
    assert (96, 328) in widths, widths  # the case's own module is built too (its names and shapes), not checked
    argv = _run_module(tmp_path, str(path), "--mode", "fwd")
    argv[argv.index("--hidden") + 1] = "400"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--module {path}: the plain computation has no rule for aten.exp.default" in err, err
    assert not (tmp_path / "out" / "results.json").exists()


def test_an_activation_without_its_twins_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind the float32 twins lack (every kind has them now: here one is taken away) is bad input naming the kind
    and the file, never an internal error; in bfloat16, which has no twins, the same file passes the check."""
    from torch_impl import plain_acts, user_module

    def no_envelope(seed: int) -> plain_acts.ActsFor:
        def acts_for(kind: str) -> plain_acts.Activations:
            raise plain_acts.NoActivation(f"{kind} has no envelope twin")

        return acts_for

    monkeypatch.setattr(user_module, "acts_envelope", no_envelope)
    path = write(tmp_path, module_source(torch_act="F.gelu(self.up(x))"))
    assert main(_run_module(tmp_path, str(path), "--dtype", "float32")) == 2
    err = capsys.readouterr().err
    assert f"--module {path}: gelu_erf has no envelope twin" in err and len(err.strip().splitlines()) == 1, err
    module_file().check_plain(case_of(path, "bfloat16", dim=96, hidden=96))


def test_the_api_refuses_an_op_without_a_rule(tmp_path: Path) -> None:
    """``compare.module_case`` checks the forward's ops as the command line does (InputError naming the op)."""
    import compare

    path = write(tmp_path, module_source(torch_act="torch.exp(self.up(x))"))
    with pytest.raises(InputError, match=r"no rule for aten\.exp\.default"):
        compare.module_case(path, 96, 96)


def test_a_good_reference_is_accepted_and_the_example_has_one(tmp_path: Path) -> None:
    """The example's numpy ``reference`` agrees with its module in every dtype (the check runs in ``run``'s
    argument checks); a file without one is not checked."""
    for dtype in ("float32", "bfloat16", "float16"):
        module_file().check_reference(case_of(EXAMPLE, dtype))
    module_file().check_reference(case_of(write(tmp_path, module_source()), dim=96, hidden=96))


# --- the case and its data ----------------------------------------------------------------------------------------


def test_the_case_carries_the_file_and_its_params(tmp_path: Path) -> None:
    """The record: the absolute path, the sha256, the state_dict's names and shapes in order and the output width;
    the name's suffix; the JSON round trip (a worker's job); ``model="module"`` only with a record."""
    case = case_of(EXAMPLE)
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert case.module == ModuleFile(
        str(EXAMPLE), sha, (("up.weight", (328, 96)), ("up.bias", (328,)), ("down.weight", (96, 328)),
                            ("down.bias", (96,))), 96,
    )  # fmt: skip
    assert case.name == f"module-3x37x96-328-float32-normal-s0-m{sha[:12]}"
    assert case.output_shape() == (3, 37, 96)
    assert from_json(Case, json.loads(json.dumps(to_json(case))), strict=True) == case
    assert "module" not in to_json(dataclasses.replace(case, model="geglu", module=None))
    with pytest.raises(InputError, match="goes with a module file"):
        Case(MODULE_MODEL, case.shape, "float32")
    with pytest.raises(InputError, match="goes with a module file"):
        Case("geglu", case.shape, "float32", module=case.module)
    # another output width: a module whose down projection is not back to dim
    wide = write(tmp_path, module_source().replace("nn.Linear(hidden, dim)", "nn.Linear(hidden, 2 * dim)"))
    assert case_of(wide).output_shape() == (3, 37, 192)


def test_parameters_are_drawn_by_the_fan_in_rule() -> None:
    """Every parameter ``N(0, 1) / sqrt(fan_in)`` rounded to the dtype: a weight's fan-in its last dimension, a bias
    its layer's (the weight's); x and dy drawn as for a built-in case."""
    case = case_of(EXAMPLE)
    assert {k: golden.fan_in(case, k) for k in case.weight_shapes()} == {
        "up.weight": 96, "up.bias": 96, "down.weight": 328, "down.bias": 328,
    }  # fmt: skip
    p = golden.make_problem(case)
    for k, shape in case.weight_shapes().items():
        assert p.params[k].shape == shape and p.params[k].dtype == np.float32
        assert abs(float(np.std(p.params[k])) * np.sqrt(golden.fan_in(case, k)) - 1.0) < 0.15, k
    assert p.x.shape == case.input_shape() and p.dy.shape == case.output_shape()
    bf16 = golden.make_problem(dataclasses.replace(case, dtype="bfloat16"))
    assert all(np.array_equal(v, golden.round_to_dtype(v, "bfloat16")) for v in bf16.params.values())


def test_the_golden_is_the_modules_exact_float64_computation() -> None:
    """The reference of a module case is its module's forward and backward in float64 (against torch's own float64
    autograd: within float64 rounding), with every gradient named by the state_dict."""
    case = case_of(EXAMPLE)
    g = golden.golden_for(case)
    module = module_file().build(case, g.params, torch.device("cpu"), torch.float64)
    x = torch.from_numpy(g.x.astype(np.float64)).requires_grad_(True)
    y = module(x)
    grads = torch.autograd.grad(y, [x, *module.parameters()], torch.from_numpy(g.dy.astype(np.float64)))
    want = {"y": y, "dx": grads[0], **{f"d{k}": v for k, v in zip(case.weight_shapes(), grads[1:], strict=True)}}
    assert set(g.ref) == set(want)
    for k, v in want.items():
        w = v.detach().numpy()
        assert np.max(np.abs(g.ref[k] - w)) <= 1e-12 * np.max(np.abs(w)), k


def test_built_in_backends_skip_a_module_case_and_module_backends_skip_built_in_cases() -> None:
    case = case_of(EXAMPLE)
    r = skipped(spec("torch-eager"), case, "fwd")
    assert r is not None and r.status == "skipped" and "not module" in r.reason
    builtin = Case("geglu", case.shape, "float32")
    for name in ("torch-module", "torch-module-compile", "torch-module-compile-max-autotune", "jax-module"):
        r = skipped(spec(name), builtin, "fwd")
        assert r is not None and r.status == "skipped" and "implements module only, not geglu" in r.reason
        assert skipped(spec(name), case, "fwd") is None


def test_weights_from_a_checkpoint_by_state_dict_name(tmp_path: Path) -> None:
    """``--weights`` on a module case: each parameter looked up as prefix + its state_dict name."""
    from compare.problem import checkpoint

    torch.manual_seed(0)
    tensors = {f"layer.{k}": torch.randn(s).to(torch.bfloat16) for k, s in case_of(EXAMPLE).weight_shapes().items()}
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    case = case_of(EXAMPLE, "bfloat16", weights=checkpoint.weights(str(path), "layer."))
    p = golden.make_problem(case)
    for k, v in p.params.items():
        assert np.array_equal(v, tensors[f"layer.{k}"].float().numpy()), k
    with pytest.raises(InputError, match=r"layer\.1\.up\.weight is not in"):
        checkpoint.load_params(dataclasses.replace(case, weights=checkpoint.weights(str(path), "layer.1.")))


def test_a_worker_refuses_a_module_file_changed_since_the_case_was_made(tmp_path: Path) -> None:
    """A sweep worker rebuilds the golden from the job's case: from a file edited since, the cell is an ``error``
    naming the file."""
    from compare.run import cell_worker
    from compare.run.grid import Cell
    from compare.timing.timer import TimingConfig

    path = write(tmp_path, module_source())
    case = case_of(path, dim=96, hidden=96)
    sent = cell_worker.payload(spec("jax-module"), Cell("jax-module", case, "fwd"), TimingConfig(budget_s=0.01))
    path.write_text(module_source() + "\n# edited\n", encoding="utf-8")
    golden.golden_for.cache_clear()  # a worker process starts without the driver's golden data
    r = from_json(Result, cell_worker.run_payload(json.loads(json.dumps(sent)))["result"])
    assert r.status == "error" and f"module file {path} changed since the run started" in r.reason, r.reason


@pytest.mark.standard
def test_a_sweep_runs_the_module_over_token_counts(tmp_path: Path) -> None:
    """``sweep --module``: the grid records the file, every row carries it and passes."""
    out = tmp_path / "sweep"
    args = ["sweep", "--module", str(EXAMPLE), "--dim", "32", "--hidden", "48", "--tokens", "8", "32"]
    args += ["--backend", "torch-module", "jax-module", "--mode", "fwd+bwd", *FAST, "--out", str(out)]
    assert main(args) == 0
    doc = read_json(out / "results.json")
    assert [(r.backend, r.shape.tokens) for r in doc.results] == [
        ("torch-module", 8), ("jax-module", 8), ("torch-module", 32), ("jax-module", 32),
    ]  # fmt: skip
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert all(r.status == "ok" and r.module is not None and r.module.sha256 == sha for r in doc.results)
    assert doc.config.grid["module"]["sha256"] == sha


# --- plausibility: a module case is held to the ceilings on its counted GEMM FLOPs -----------------------------------

#: A forward that reads a value back (``meta`` tensors hold none): its FLOPs are counted on one CPU step instead.
READS_BACK = "torch.relu(self.up(x)) ** 2 * (1.0 + 0.0 * float(x.abs().max()))"
#: A module that answers from memory: each output kept under its input tensor (held, so that no other tensor takes
#: its identity) and the tensor's version, and served again while both are the same (the harness writes a slot's
#: new inputs in place, through ``.data``).
CACHING = """
class Caching(MLP):
    def __init__(self, dim, hidden):
        super().__init__(dim, hidden)
        self.kept = {}

    def forward(self, x):
        held = self.kept.get(id(x))
        if held is None or held[0] is not x or held[1] != x._version:
            held = self.kept[id(x)] = (x, x._version, super().forward(x))
        return held[2]


def torch_module(dim, hidden):
    return Caching(dim, hidden)
"""


@pytest.mark.parametrize("torch_act", [SQUARED_RELU, READS_BACK], ids=["on-shapes", "reads-back"])
def test_a_module_case_s_gemm_flops_are_counted_per_mode(tmp_path: Path, torch_act: str) -> None:
    """The template's 2 forward GEMMs and 4 backward ones (dx and dW of each linear), ``2 * tokens * dim * hidden``
    FLOPs each, as ``torch.utils.flop_counter`` counts them: on shapes alone, or, for a forward that reads a value
    back, on one CPU step; the bias adds, ReLU and square are not GEMMs."""
    from compare.run.cell import min_flops

    case = case_of(write(tmp_path, module_source(torch_act=torch_act)))
    gemm = 2 * case.shape.tokens * 96 * 328
    counted = {m: min_flops(case, m) for m in ("fwd", "bwd", "fwd+bwd")}
    assert counted == {"fwd": 2 * gemm, "bwd": 4 * gemm, "fwd+bwd": 6 * gemm}


@pytest.mark.standard
def test_a_module_case_is_held_to_the_measured_ceilings_on_its_counted_flops(tmp_path: Path) -> None:
    """With the ceilings measured: the honest module is ``ok`` and not flagged; one that answers from memory comes
    back far faster than its counted GEMMs allow and is flagged implausible, whatever else fails it (here the
    harness's fresh inputs: a slot's inputs change in place and it serves the old answer)."""
    from compare.run.harness import run
    from compare.run.options import RunOptions
    from compare.timing.timer import TimingConfig

    honest = case_of(write(tmp_path, module_source(), "honest.py"))
    caching = case_of(write(tmp_path, module_source(extra=CACHING), "caching.py"))
    cfg = TimingConfig(warmup=1, budget_s=0.05)
    doc = run([honest, caching], [spec("torch-module")], ["fwd"], RunOptions(cfg, ceilings=True))
    by = {r.case: r for r in doc.results}
    fair, cheat = by[honest.name], by[caching.name]
    assert fair.status == "ok" and fair.implausible == "", (fair.status, fair.reason)
    assert cheat.implausible.startswith("implausible: its median call"), (cheat.status, cheat.reason)


@pytest.mark.standard
def test_every_backend_of_a_module_case_beating_the_ceiling_is_implausible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ceiling set far too low (1 kFLOP/s, as a cheat's time stands against a true one): the module's torch and JAX
    backends are both ``implausible``, each held to the FLOPs counted once on the torch module, and a finding."""
    from compare.cost.records import Ceilings
    from compare.run import conductor, exitcodes
    from compare.run.harness import run
    from compare.run.options import RunOptions
    from compare.timing.timer import TimingConfig

    real = conductor.measure_ceilings

    def low(dtypes, budget_s=0.5):  # type: ignore[no-untyped-def]
        c = real(dtypes, budget_s=0.05)
        assert c is not None
        return Ceilings(c.device, {k: dataclasses.replace(v, flops_per_s=1e3) for k, v in c.by_dtype.items()})

    monkeypatch.setattr(conductor, "measure_ceilings", low)
    case = case_of(write(tmp_path, module_source()))
    cfg = TimingConfig(warmup=1, budget_s=0.05)
    doc = run([case], [spec("torch-module"), spec("jax-module")], ["fwd"], RunOptions(cfg, ceilings=True))
    assert [(r.backend, r.status) for r in doc.results] == [
        ("torch-module", "implausible"),
        ("jax-module", "implausible"),
    ]
    assert all(r.reason.startswith("implausible: its median call") for r in doc.results)
    assert exitcodes.of_statuses([r.status for r in doc.results]) == exitcodes.FINDING


def test_default_backends_are_those_of_the_run_s_kind_of_case() -> None:
    """Without --backend a built-in run gets no module backend (no skipped rows) and a --module run only them."""
    from compare.cli.args import default_backends

    module_backends = ["torch-module", "torch-module-compile", "torch-module-compile-max-autotune", "jax-module"]
    module_backends += ["jax-module-unfused"]
    assert default_backends([1], MODULE_MODEL) == module_backends
    assert not set(default_backends([1])) & set(module_backends) and "torch-eager" in default_backends([1])
    assert default_backends([2], MODULE_MODEL) == []


#: A module that answers rows it has seen from memory, keyed on each row's first four values (honest in float64 and
#: under autograd on rows it has not seen); it counts the distinct inputs it answered whole from memory (by their
#: first row) in an environment variable (the run is in this process).
ROW_CACHE = """
import os


class RowCache(MLP):
    def __init__(self, dim, hidden):
        super().__init__(dim, hidden)
        self.rows = {}
        self.hit = set()

    def forward(self, x):
        flat = x.detach().reshape(-1, x.shape[-1])
        keys = [tuple(r[:4].tolist()) for r in flat]
        if not x.requires_grad and all(k in self.rows for k in keys):
            self.hit.add(keys[0])
            os.environ["ROW_CACHE_HITS"] = str(len(self.hit))
            return torch.stack([self.rows[k] for k in keys]).reshape(*x.shape[:-1], -1)
        y = super().forward(x)
        for k, r in zip(keys, y.detach().reshape(len(keys), -1)):
            self.rows[k] = r
        return y


def torch_module(dim, hidden):
    return RowCache(dim, hidden)
"""


@pytest.mark.standard
@pytest.mark.parametrize("ceilings", [True, False], ids=["ceilings", "no-ceilings"])
def test_a_module_caching_rows_by_value_never_answers_a_timed_call_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ceilings: bool
) -> None:
    """A ``--module`` file whose torch module caches its output per row value: every call on the harness's inputs
    brings rows no call saw, so its cache answers none of them (the golden inputs, called again outside the timing,
    are the one input it answers from memory: the control that the cache works) and every timed call computes; it
    passes as the honest module it then is, and its timing is that of the computation."""
    from compare.run.harness import run
    from compare.run.options import RunOptions
    from compare.timing.timer import TimingConfig

    monkeypatch.setenv("ROW_CACHE_HITS", "0")
    case = case_of(write(tmp_path, module_source(extra=ROW_CACHE), "rowcache.py"))
    doc = run(
        [case], [spec("torch-module")], ["fwd"], RunOptions(TimingConfig(warmup=1, budget_s=0.05), ceilings=ceilings)
    )
    (r,) = doc.results
    assert r.parity is not None and r.parity.fresh is not None and r.parity.fresh.made is not None
    assert r.parity.fresh.made >= 6 and r.parity.fresh.spot_calls == r.parity.fresh.made, r.parity.fresh
    import os

    assert os.environ["ROW_CACHE_HITS"] == "1", os.environ["ROW_CACHE_HITS"]
    assert r.status == "ok" and not r.implausible, (r.status, r.reason)
