"""ADDING_A_BACKEND.md's recipe, run as written: a new backend with its own Triton kernel is its own two files and
one registry line, and then it is in ``list``, ``run`` (parity against the golden), the report, the cost model and
the GPU build's catalogue with no other edit.

The three code blocks marked ``<!-- recipe: ... -->`` are read from the document, written into a scratch package
(the module paths ``triton_impl.silu_mul_kernels`` and ``torch_impl.backends.silu_mul`` renamed into it, so the
test never writes into the project's tree) and the registry line is registered. A recipe whose code does not run,
or a step of it that needs an edit elsewhere, fails here.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compare.backends import registry
from compare.backends.registry import BackendSpec
from compare.cli.main import main
from compare.gpu_build import bridge

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ADDING_A_BACKEND.md"
#: The recipe's module paths in the project, and the scratch package's names for them.
KERNELS_MODULE = "triton_impl.silu_mul_kernels"
BACKEND_MODULE = "torch_impl.backends.silu_mul"
PACKAGE = "recipe_scratch"


def recipe_blocks(text: str) -> dict[str, str]:
    """``<!-- recipe: NAME -->`` followed by a fenced python block -> NAME: the block's code."""
    found = re.findall(r"<!-- recipe: ([^>]+?) -->\s*```python\n(.*?)```", text, flags=re.DOTALL)
    return {name.strip(): code for name, code in found}


def _moved(code: str) -> str:
    """``code`` with the recipe's modules in the scratch package (``a.b.c`` and ``from a.b import c`` alike)."""
    for module, new in ((KERNELS_MODULE, "silu_mul_kernels"), (BACKEND_MODULE, "silu_mul")):
        parent, leaf = module.rsplit(".", 1)
        code = code.replace(module, f"{PACKAGE}.{new}").replace(
            f"from {parent} import {leaf}", f"from {PACKAGE} import {new}"
        )
    return code


@pytest.fixture
def recipe(tmp_path: Path) -> Iterator[BackendSpec]:
    """The recipe's backend, written into ``tmp_path/recipe_scratch`` and registered; removed after the test."""
    blocks = recipe_blocks(DOC.read_text(encoding="utf-8"))
    assert set(blocks) == {"triton_impl/silu_mul_kernels.py", "torch_impl/backends/silu_mul.py", "registry line"}
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "silu_mul_kernels.py").write_text(_moved(blocks["triton_impl/silu_mul_kernels.py"]), encoding="utf-8")
    (pkg / "silu_mul.py").write_text(_moved(blocks["torch_impl/backends/silu_mul.py"]), encoding="utf-8")
    # outside torch_impl the framework no longer follows from the package: the one word the move adds
    line = _moved(blocks["registry line"]).replace("BackendSpec(", 'BackendSpec(framework="torch",', 1)
    spec = eval(line, {"BackendSpec": BackendSpec})  # the document's own registry line
    sys.path.insert(0, str(tmp_path))
    registry.register(spec)
    try:
        yield spec
    finally:
        registry.unregister(spec.name)
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_the_recipe_blocks_are_found() -> None:
    """The parser sees the document's three blocks, and a block without its marker is not one of them."""
    blocks = recipe_blocks(DOC.read_text(encoding="utf-8"))
    assert "GPU_BUILD" in blocks["triton_impl/silu_mul_kernels.py"]
    assert recipe_blocks("```python\nx = 1\n```") == {}


def test_the_recipe_backend_is_everywhere(
    recipe: BackendSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = recipe.name
    assert main(["list"]) == 0
    assert any(line.strip().startswith(name + " ") for line in capsys.readouterr().out.splitlines())

    out = tmp_path / "run"
    argv = ["run", "--preset", "tiny", "--model", "swiglu", "--dtype", "float32", "--mode", "fwd"]
    argv += ["--backend", "torch-eager", name, "--budget", "0.05", "--no-ceilings", "--no-plots", "--gpu-build", ""]
    assert main([*argv, "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    row = next(r for r in doc["results"] if r["backend"] == name)
    assert row["status"] == "ok", row.get("reason")  # parity against the float64 golden (interpreted here)
    assert row["parity"]["tier"] == "pass"
    assert row["cost"]["plan"] == "fused-ew"  # the cost model
    md = (out / "DETAILS.md").read_text(encoding="utf-8")
    parity = md.split("## Parity", 1)[1].split("\n## ", 1)[0]
    assert f"| {name} |" in parity


def test_the_recipe_kernel_is_in_the_gpu_build(
    recipe: BackendSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU build compiles the kernels of the registered backends' modules: the recipe's module is among them
    and its GPU_BUILD entry is in the catalogue (read in a compiled-mode process, as the build reads it)."""
    modules = bridge.kernel_modules()
    assert f"{PACKAGE}.silu_mul_kernels" in modules
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH")))))
    catalogue = bridge.describe(modules)
    entry = catalogue["kernels"]["silu_mul"]
    assert entry["function"] == "silu_mul_kernel" and entry["module"] == f"{PACKAGE}.silu_mul_kernels"
    registry.unregister(recipe.name)  # the control: without its registry line the kernel is not built
    assert f"{PACKAGE}.silu_mul_kernels" not in bridge.kernel_modules()
