"""Inputs refused at the door: each one through the real command line (``compare.cli.main.main``), exit status 2, a
message naming the option, the bad value and what is allowed, and nothing measured or written; with the controls
that the smallest allowed value of each passes the same checks."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from compare.cli.args import cases_from_args, check_cases, check_grid_args, check_inputs, check_out
from compare.cli.main import main, parser
from compare.gate.parity import MIN_TERMS, check_judgeable, judged_shapes
from compare.problem.cases import Case, InputError, Shape
from compare.run import tp_hosts

pytestmark = pytest.mark.quick

RUN = ["run", "--preset", "tiny", "--backend", "torch-eager", "--budget", "0.02", "--no-plots", "--no-ceilings"]
TP_JOB = ["tp-job", "--preset", "tiny", "--backend", "torch-tp-manual"]
SWEEP = ["sweep", "--backend", "torch-eager", "--budget", "0.02", "--no-plots", "--no-ceilings"]
#: A case of one element per tensor: the report of it said "7.35e+290 standard errors".
ONE_ELEMENT = ["--batch", "1", "--seq", "1", "--dim", "1", "--hidden", "1"]


def _refused(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    return err


def _empty(folder: Path) -> None:
    assert not folder.exists() or not any(folder.iterdir()), sorted(p.name for p in folder.iterdir())


def _tp_job(world_size: str = "2", addr: str = "10.0.0.1") -> list[str]:
    return [*TP_JOB, "--world-size", world_size, f"--addr={addr}"]


def _door(args: list[str]) -> argparse.Namespace:
    """The arguments of ``run`` (or ``tp-job``) through every check at its door, and no further."""
    a = parser().parse_args(args)
    check_grid_args(a)
    cases = cases_from_args(a)
    check_inputs(a, cases)
    check_cases(a, cases)
    return a


# 1. world sizes below 1


@pytest.mark.parametrize("size", ["-2", "0"])
def test_run_refuses_a_world_size_below_1(size: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    _refused(
        [*RUN, "--world-size", size, "--out", str(out)],
        f"--world-size must be a positive integer (1 or more; 1 is one device), got {size}",
        capsys,
    )
    _empty(tmp_path)


def test_run_refuses_a_world_size_below_1_beside_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused([*RUN, "--world-size", "1", "-1", "--out", str(tmp_path / "out")], "got -1", capsys)
    _empty(tmp_path)


@pytest.mark.parametrize("size", ["0", "-1"])
def test_tp_job_refuses_a_world_size_below_1(size: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*_tp_job(world_size=size), "--out", str(tmp_path / "job")]
    _refused(args, f"--world-size must be a positive integer (1 or more; 1 is one device), got {size}", capsys)
    _empty(tmp_path)


def test_world_size_1_is_accepted(tmp_path: Path) -> None:
    a = _door([*RUN, "--world-size", "1", "--out", str(tmp_path / "out")])
    assert a.world_size == [1]
    _empty(tmp_path)


# 2. cases too small for the parity gate


def test_run_refuses_a_case_too_small_for_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    err = _refused(
        [*RUN, *ONE_ELEMENT, "--out", str(out)],
        "case geglu-1x1x1-1-float32-normal-s0 is too small for the parity gate: its tensor 'y' has shape [1, 1, 1], "
        f"1 element; every tensor the gate judges needs at least {MIN_TERMS} elements",
        capsys,
    )
    assert "standard errors" in err
    _empty(tmp_path)


def test_the_tensors_of_every_mode_are_held_to_the_minimum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A linear layer of width 1 has a 1-element bias: its forward (2 tokens, y of 2 elements) can be judged, its
    backward (dbias) cannot."""
    small = ["--model", "linear", "--batch", "2", "--seq", "1", "--dim", "2", "--hidden", "1"]
    _door([*RUN, *small, "--mode", "fwd", "--out", str(tmp_path / "a")])
    _refused(
        [*RUN, *small, "--mode", "fwd", "bwd", "--out", str(tmp_path / "b")],
        "case linear-2x1x2-1-float32-normal-s0 is too small for the parity gate: its tensor 'dbias' has shape [1]",
        capsys,
    )
    _empty(tmp_path)


def test_tp_job_refuses_a_case_too_small_for_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*_tp_job(world_size="1"), *ONE_ELEMENT, "--out", str(tmp_path / "job")]
    _refused(args, "case geglu-1x1x1-1-float32-normal-s0 is too small for the parity gate", capsys)
    _empty(tmp_path)


def test_sweep_refuses_a_case_too_small_for_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SWEEP, "--model", "geglu", "--dim", "1", "--hidden", "1", "--tokens", "1", "4"]
    _refused([*args, "--out", str(tmp_path / "sweep")], "case geglu-1x1x1-1-float32-normal-s0 is too small", capsys)
    _empty(tmp_path)


@pytest.mark.parametrize(
    "shape",
    [
        ["--model", "geglu", "--batch", "1", "--seq", "1", "--dim", "2", "--hidden", "1"],
        ["--model", "swiglu", "--batch", "1", "--seq", "1", "--dim", "2", "--hidden", "1"],
        ["--model", "gelu-mlp", "--batch", "1", "--seq", "1", "--dim", "2", "--hidden", "2"],
        ["--model", "linear", "--batch", "1", "--seq", "1", "--dim", "2", "--hidden", "2"],
    ],
)
def test_the_smallest_allowed_case_is_accepted(shape: list[str], tmp_path: Path) -> None:
    """Every tensor of these (output and gradients) has exactly the minimum, in every mode."""
    a = _door([*RUN, *shape, "--mode", "fwd", "bwd", "fwd+bwd", "--dtype", "float32", "bfloat16", "float16"])
    for case in cases_from_args(a):
        assert min(math.prod(s) for s in judged_shapes(case).values()) == MIN_TERMS
    _empty(tmp_path)


def test_the_gate_minimum_is_the_variance_rule() -> None:
    """One element below the minimum in any tensor is refused, naming that tensor; the rule is the gate's own."""
    case = Case("gelu-mlp", Shape(4, 1, 1, 8), "float32")  # b2 and db2 are [1]
    assert judged_shapes(case)["db2"] == (1,)
    with pytest.raises(InputError, match=r"its tensor 'db2' has shape \[1\], 1 element;"):
        check_judgeable(case)
    assert check_judgeable(case, ["y", "dfc1", "dfc2", "db1"]) is case


# 3. an empty --out


@pytest.mark.parametrize(
    "args",
    [RUN, ["profile", *RUN[1:]], _tp_job(), [*SWEEP, "--preset", "tiny", "--tokens", "1"]],
    ids=["run", "profile", "tp-job", "sweep"],
)
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_out_is_refused(
    args: list[str], value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # where an empty --out used to write
    _refused([*args, "--out", value], f"--out must be a non-empty path, got {value!r}", capsys)
    _empty(tmp_path)


@pytest.mark.parametrize("command", ["report", "tp-collect"])
def test_an_empty_out_is_refused_by_the_rebuilding_commands(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report`` and ``tp-collect`` refuse it as they parse their arguments (argparse: exit status 2)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "results.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([command, str(source / "results.json") if command == "report" else str(source), "--out", ""])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --out: --out must be a non-empty path, got ''" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert sorted(p.name for p in source.iterdir()) == ["results.json"]


def test_a_named_out_is_accepted() -> None:
    assert check_out(".") == "."
    assert check_out("out/run", "--out") == "out/run"


# 4. tp-job's rendezvous: port and address


@pytest.mark.parametrize("port", ["70000", "65536", "0", "-1"])
def test_tp_job_refuses_a_port_outside_1_to_65535(
    port: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*_tp_job(), "--port", port, "--out", str(tmp_path / "job")]
    _refused(args, f"--port must be a TCP port, an integer from 1 to 65535, got {port}", capsys)
    assert capsys.readouterr().out == ""  # no command printed
    _empty(tmp_path)


@pytest.mark.parametrize(
    "addr",
    ["not a host!", "", "-lead.example", "trail-.example", "a..b", "999.1.1.1", "1.2.3", "x" * 64, "[10.0.0.1]", "[h]"],
)
def test_tp_job_refuses_an_address_that_is_no_host(
    addr: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*_tp_job(addr=addr), "--out", str(tmp_path / "job")]
    _refused(
        args,
        "--addr must be an IPv4 address (e.g. 10.0.0.1), an IPv6 address (e.g. fd00::1 or [fd00::1]) or a host name "
        f"(RFC 1123: dot-separated labels of 1 to 63 letters, digits and hyphens, no hyphen first or last, at most "
        f"253 characters), got {addr!r}",
        capsys,
    )
    _empty(tmp_path)


@pytest.mark.parametrize(
    ("addr", "written"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("localhost", "localhost"),
        ("node-1.cluster.example", "node-1.cluster.example"),
        ("3com.example", "3com.example"),
        ("::1", "[::1]"),
        ("[fd00:0::1]", "[fd00::1]"),
        ("a" * 63 + ".example", "a" * 63 + ".example"),
    ],
)
def test_a_valid_rendezvous_is_written(
    addr: str, written: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The controls: the ports 1 and 65535 and every allowed address form; an IPv6 literal in brackets, as
    ``HOST:PORT`` needs it."""
    assert tp_hosts.check_port(1) == 1
    folder = tmp_path / "job"
    assert main([*_tp_job(addr=addr), "--port", "65535", "--out", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(f"--rdzv-endpoint={written}:65535 " in line for line in lines), lines
    assert json.loads((folder / "job.json").read_text(encoding="utf-8"))["addr"] == written
