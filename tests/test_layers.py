"""Layers a test enforces: no import cycle anywhere in the four packages, counting imports inside functions too; and
``triton_impl`` framework-neutral.

A module-level graph of ``compare``, ``torch_impl``, ``jax_impl`` and ``triton_impl``: an edge for every ``import``
or ``from ... import`` of another project module, wherever it stands (a lazy import inside a function is still a
dependency, only a later one). Package ``__init__`` files importing their own submodules are not edges. The core's
other rule (``compare/`` imports no framework package, and works with torch and jax blocked) is in
``tests/test_registry.py``.

``triton_impl`` holds the Triton kernels both frameworks launch and the one interpreter choice: it imports the
standard library, triton, numpy and itself, and from the core only the triton-free GPU build table renderer; never
torch, jax, flax, jax_triton, ``torch_impl``, ``jax_impl`` or the rest of ``compare``. Checked on the source (every
import statement, anywhere in a file) and by importing every module of it with the frameworks blocked.

Torch-free itself (the standard library only), so ``make test-triton36`` runs it in the bare Triton venv too.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compare", "torch_impl", "jax_impl", "triton_impl")
#: Top-level packages ``triton_impl`` may import besides the standard library and itself.
TRITON_IMPL_THIRD_PARTY = ("triton", "numpy")
#: Core modules ``triton_impl`` may import (the build tool renders its table with it; no framework, no triton).
TRITON_IMPL_FROM_COMPARE = ("compare.gpu_build_report",)
#: What importing ``triton_impl`` must never bring in.
FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "jax_triton", "torch_impl", "jax_impl")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _targets(mods: dict[str, Path], name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        cands = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if mods[name].name == "__init__.py" else name.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        cands = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for c in cands:
        while c and c not in mods and "." in c:
            c = c.rsplit(".", 1)[0]
        if c in mods and c != name and not name.startswith(c + "."):  # not the package's own __init__
            out.append(c)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                deps.update(_targets(mods, name, node))
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """Negative control: a hand-made graph with a three-module loop is reported, and nothing else."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_lazy_imports() -> None:
    """An import inside a function body is an edge: ``compare.costmodel`` imports the registry only inside its
    functions."""
    top = {
        n.module
        for n in ast.parse((ROOT / "compare" / "costmodel.py").read_text(encoding="utf-8")).body
        if isinstance(n, ast.ImportFrom)
    }
    assert "compare.registry" not in top
    assert "compare.registry" in import_graph()["compare.costmodel"]


def foreign_imports(source: str) -> list[str]:
    """The imports of a ``triton_impl`` module's ``source`` that break its rule (see the module docstring)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:  # a relative import stays inside triton_impl
            mods = [node.module or ""]
        else:
            continue
        for m in mods:
            top = m.split(".")[0]
            ok = (
                top in sys.stdlib_module_names
                or top in (*TRITON_IMPL_THIRD_PARTY, "triton_impl")
                or any(m == c or m.startswith(c + ".") for c in TRITON_IMPL_FROM_COMPARE)
            )
            if not ok:
                bad.append(f"{node.lineno}: {m}")
    return bad


def test_triton_impl_imports_no_framework() -> None:
    """Every module of ``triton_impl``: the standard library, triton, numpy, itself, the table renderer; nothing
    else, anywhere in the file."""
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted((ROOT / "triton_impl").rglob("*.py"))
        if (bad := foreign_imports(path.read_text(encoding="utf-8")))
    }
    assert not offenders, offenders
    assert {"triton_impl.env", "triton_impl.geglu_kernels", "triton_impl.geglu_matmul_kernels"} <= set(_modules())


def test_the_triton_impl_rule_finds_a_framework_import() -> None:
    """Negative control: framework, backend-package and core imports are reported, wherever they stand; the
    standard library, triton, relative imports and the table renderer are not."""
    source = (
        "import os\nimport triton.language as tl\nfrom . import env\nfrom compare.gpu_build_report import ARCHS\n"
        "import torch\nfrom jax_impl import device\nfrom compare.registry import spec\n"
        "def f():\n    import jax.numpy\n"
    )
    assert foreign_imports(source) == ["5: torch", "6: jax_impl", "7: compare.registry", "9: jax.numpy"]


@pytest.mark.parametrize("mode", ["auto", "compile"])
def test_triton_impl_imports_with_torch_and_jax_blocked(mode: str) -> None:
    """With torch, jax, flax, jax_triton, ``torch_impl`` and ``jax_impl`` made unimportable, every module of
    ``triton_impl`` imports, the interpreter choice is made (``auto``: by asking the CUDA driver; ``compile``:
    forced, as the GPU build runs), the kernels are of the kind chosen, and the GPU build reads them (compiled)."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {FRAMEWORKS!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import triton_impl
assert 'triton' not in sys.modules  # the package itself imports nothing, and decides nothing
from triton_impl import env
interpret = env.choose()
from triton_impl import geglu_kernels, geglu_matmul_kernels, gpu_build
assert geglu_kernels.INTERPRETED is geglu_matmul_kernels.INTERPRETED is interpret
kinds = {{type(k).__name__ for k in (geglu_kernels.geglu_fwd_kernel, geglu_kernels.geglu_bwd_kernel,
                                     geglu_matmul_kernels.geglu_matmul_kernel, geglu_matmul_kernels.matmul_kernel)}}
assert kinds == {{'InterpretedFunction' if interpret else 'JITFunction'}}, kinds
if not interpret:
    assert sorted(gpu_build.describe()['kernels']) == ['geglu_bwd', 'geglu_fwd', 'geglu_matmul', 'matmul']
print(interpret, sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r})))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FUSION_COMPARE_TRITON")}
    if mode == "compile":
        env["FUSION_COMPARE_TRITON"] = "compile"
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0, p.stderr
    interpret, loaded = p.stdout.strip().rsplit("\n", 1)[-1].split(" ", 1)
    assert loaded == "[]"
    if mode == "compile":
        assert interpret == "False"
