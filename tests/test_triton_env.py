"""The Triton mode is chosen once per process, before triton is imported, and it does not leak.

A leak is a test module (or anything else) flipping ``TRITON_INTERPRET`` after the choice: the kernels already
decorated keep the old mode, later ones get the new one, and every subprocess inherits the flipped value (on a GPU
machine, subprocess tests would then interpret instead of compile).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TRITON_INTERPRET_AT_START, TRITON_INTERPRETED
from triton_impl import env as _triton_env

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
TEST_MODULES = sorted(p for p in (ROOT / "tests").glob("test_*.py"))


def _python(code: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", _triton_env.MODE_ENV)}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_choice_is_cuda_or_not_and_still_holds() -> None:
    """Chosen by the rule (compile with CUDA, interpret without), and unchanged by every test that ran before. The
    rule asks the CUDA driver, not torch: here torch must agree with it."""
    assert TRITON_INTERPRETED is (not torch.cuda.is_available())
    assert (_triton_env.cuda_device_count() > 0) is torch.cuda.is_available()
    assert _triton_env.cuda_device_count() == torch.cuda.device_count()
    assert os.environ.get("TRITON_INTERPRET") == TRITON_INTERPRET_AT_START
    assert _triton_env.interpreted() is TRITON_INTERPRETED
    assert _triton_env.choose() is TRITON_INTERPRETED  # asked again: the same answer


def test_no_test_module_assigns_the_interpreter_variable() -> None:
    """Read every test module's syntax tree: no assignment to ``os.environ["TRITON_INTERPRET"]``, no
    ``setdefault``/``putenv`` of it (monkeypatch inside one test, undone afterwards, is allowed)."""
    offenders = []
    for path in TEST_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and "TRITON_INTERPRET" in ast.unparse(t.slice):
                    offenders.append(f"{path.name}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith(("environ.setdefault", "putenv"))
                and any("TRITON_INTERPRET" in ast.unparse(a) for a in node.args)
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.standard
@pytest.mark.parametrize("forced", ["compile", "interpret"])
def test_importing_every_test_module_leaves_the_choice_alone(forced: str) -> None:
    """In a fresh process whose choice is forced (``compile`` stands in for a CUDA machine), importing every test
    module, and so every kernel module, leaves ``TRITON_INTERPRET`` exactly as the choice set it."""
    names = [f"tests.{p.stem}" for p in TEST_MODULES if p.stem != "test_triton_env"]
    code = (
        "import importlib, os, sys\n"
        "from triton_impl import env\n"
        "interp = env.choose()\n"
        "before = os.environ.get('TRITON_INTERPRET')\n"
        f"for n in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except BaseException as exc:  # a module may skip itself (pytest.skip raises): not a leak\n"
        "        if type(exc).__name__ != 'Skipped':\n"
        "            raise\n"
        "print(interp, before, os.environ.get('TRITON_INTERPRET'))"
    )
    interp, before, after = _python(code, {_triton_env.MODE_ENV: forced}).splitlines()[-1].split()
    assert interp == str(forced == "interpret")
    assert before == after == ("1" if forced == "interpret" else "None")


def test_a_subprocess_makes_the_same_choice_as_this_process() -> None:
    """What a subprocess inherits is this process's choice, and it is the one the subprocess would make alone."""
    alone = _python("from triton_impl import env; print(env.choose())", {})
    assert alone == str(TRITON_INTERPRETED)
    inherited = _python(
        "import os; print(os.environ.get('TRITON_INTERPRET'))",
        {"TRITON_INTERPRET": TRITON_INTERPRET_AT_START} if TRITON_INTERPRET_AT_START else {},
    )
    assert inherited == str(TRITON_INTERPRET_AT_START)


@pytest.mark.parametrize("chooser", ["torch_impl", "triton_impl.glu_kernels", "triton_impl.glu_matmul_kernels"])
def test_a_late_interpreter_choice_is_refused(chooser: str) -> None:
    """Choosing the interpreter after triton was imported would leave compiled kernels behind: refused, by the
    framework package that chooses on import and by each kernel module (which chooses before it imports triton)."""
    out = _python(
        f"import triton\ntry:\n    import {chooser}\nexcept RuntimeError as exc:\n    print('refused:', exc)",
        {_triton_env.MODE_ENV: "interpret"},
    )
    assert out.startswith("refused: triton was imported before the interpreter was chosen")


@pytest.mark.parametrize("made", ["compile", "interpret"])
def test_a_choice_once_made_does_not_change(made: str) -> None:
    """After the choice, an environment that says otherwise is refused at the next choose() (the next kernel module
    import), not silently followed: its kernels would be of the other kind."""
    other = "1" if made == "compile" else "0"
    code = (
        "import os\nfrom triton_impl import env\nfirst = env.choose()\n"
        f"os.environ['TRITON_INTERPRET'] = {other!r}\n"
        "try:\n    import triton_impl.glu_kernels\nexcept RuntimeError as exc:\n    print(first, 'refused:', exc)"
    )
    out = _python(code, {_triton_env.MODE_ENV: made})
    assert out.startswith(f"{made == 'interpret'} refused: Triton was chosen to {made} in this process")


@pytest.mark.parametrize("chooser", ["torch_impl", "triton_impl.glu_kernels"])
def test_an_unknown_mode_is_refused(chooser: str) -> None:
    out = _python(
        f"try:\n    import {chooser}\nexcept ValueError as exc:\n    print(exc)", {_triton_env.MODE_ENV: "sometimes"}
    )
    assert out == "FUSION_COMPARE_TRITON='sometimes'; allowed: auto, compile, interpret"
