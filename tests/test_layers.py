"""Layers a test enforces: no import cycle anywhere in the four packages, counting imports inside functions too;
``compare``'s packages importing only the packages their ``MAY_IMPORT`` names (``report``'s: none above
``results``), and every module of it in a package; every project name imported from the module that defines it (no
module passes names on, but ``compare``'s public surface); and ``triton_impl`` framework-neutral.

A module-level graph of ``compare``, ``torch_impl``, ``jax_impl`` and ``triton_impl``: an edge for every ``import``
or ``from ... import`` of another project module, wherever it stands (a lazy import inside a function is still a
dependency, only a later one). Package ``__init__`` files importing their own submodules are not edges. The core's
other rule (``compare/`` imports no framework package, and works with torch and jax blocked) is in
``tests/test_registry.py``.

``triton_impl`` holds the Triton kernels both frameworks launch, the one interpreter choice and the triton side of
the GPU build: it imports the standard library, triton, numpy and itself; never torch, jax, flax, jax_triton,
``torch_impl``, ``jax_impl`` or ``compare`` (the GPU build's compare side talks to it through processes). Checked on
the source (every import statement, anywhere in a file) and by importing every module of it with the frameworks
blocked.

Torch-free itself (the standard library, and numpy through the registry it reads for the kernel modules), so
``make test-triton36`` runs it in the bare Triton venv too.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compare", "torch_impl", "jax_impl", "triton_impl")
#: Top-level packages ``triton_impl`` may import besides the standard library and itself.
TRITON_IMPL_THIRD_PARTY = ("triton", "numpy")
#: What importing ``triton_impl`` must never bring in.
FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "jax_triton", "torch_impl", "jax_impl")


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
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


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file)."""
    mods = _modules(root)
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


@pytest.mark.standard
def test_no_import_cycles_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """Negative control: a hand-made graph with a three-module loop is reported, and nothing else."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_lazy_imports(tmp_path: Path) -> None:
    """An import inside a function body is an edge (a planted one in a tree of two modules, and its control: the
    same module without it has none)."""
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "compare" / "b.py").write_text("X = 1\n", encoding="utf-8")
    lazy = "def f():\n    from compare import b\n    return b.X\n"
    (tmp_path / "compare" / "a.py").write_text(lazy, encoding="utf-8")
    assert import_graph(tmp_path)["compare.a"] == {"compare.b"}
    (tmp_path / "compare" / "a.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    assert import_graph(tmp_path)["compare.a"] == set()


# --- the layers of compare/ ---------------------------------------------------------------------------------------

#: Modules of ``compare`` that sit on top of every package: the public surface, the entry point and the command line
#: (the package ``compare.cli``: none may import it; its modules keep to its ``MAY_IMPORT`` as any package's do).
TOP = ("compare", "compare.cli", "compare.__main__")


def on_top(mod: str) -> bool:
    """Whether ``mod`` is one of :data:`TOP` or a module of the command line's package."""
    return mod in TOP or mod.startswith("compare.cli.")


def layer_rules(root: Path = ROOT) -> dict[str, tuple[str, ...]]:
    """Each package of ``compare/`` -> the packages it may import (its ``MAY_IMPORT``, read from the source)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import module_map
    finally:
        sys.path.pop(0)
    return {name: may for name, (_job, may, _mods) in module_map.packages(root).items()}


def layer_violations(graph: dict[str, set[str]], rules: dict[str, tuple[str, ...]]) -> list[str]:
    """Every import between ``compare``'s packages that its rules do not allow, every import of the top (``TOP``)
    from a package, and every module of ``compare`` that is in no package and not on top (it cannot be placed)."""
    bad = []
    for mod, deps in sorted(graph.items()):
        if not mod.startswith("compare.") or mod == "compare.__main__":
            continue
        pkg = mod.split(".")[1]
        if pkg not in rules:
            bad.append(f"{mod}: in no package of compare/ (only {', '.join(TOP)} may sit outside one)")
            continue
        for dep in sorted(deps):
            if dep != "compare" and not dep.startswith("compare."):
                continue
            if on_top(dep) and not on_top(mod):
                bad.append(f"{mod} imports {dep}, the top")
                continue
            other = dep.split(".")[1]
            if other != pkg and other not in rules[pkg]:
                bad.append(f"{mod} imports {dep}: {pkg}/ may import {', '.join(rules[pkg]) or 'nothing'}")
    return bad


#: Packages that are a pure function of the results they are given: they may import ``results`` and what it may
#: import, nothing above (``run``, ``gpu_build``, ``sweep``: nothing that measures, builds or reads a command line).
PURE = ("report",)


def impure_rules(rules: dict[str, tuple[str, ...]]) -> list[str]:
    """Every package of :data:`PURE` whose ``MAY_IMPORT`` names a package above ``results`` (its imports keep to its
    ``MAY_IMPORT`` by :func:`layer_violations`)."""
    below = {"results", *rules["results"]}
    return [f"{pkg}/ may import {other}, above results" for pkg in PURE for other in rules[pkg] if other not in below]


def test_compare_keeps_to_its_layers() -> None:
    rules = layer_rules()
    assert impure_rules(rules) == []
    assert layer_violations(import_graph(), rules) == []


@pytest.mark.standard
def test_the_layer_check_finds_planted_violations(tmp_path: Path) -> None:
    """Negative control on a copy of the tree: a module in a low package importing a high one, a package importing
    the command line, a module outside any package and a report module importing ``run`` are each reported, and so
    is ``report`` declaring it may import ``run``; the unplanted copy has none."""
    import shutil

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "scripts").mkdir()
    assert layer_violations(import_graph(tmp_path), layer_rules(tmp_path)) == []
    assert impure_rules(layer_rules(tmp_path)) == []
    (tmp_path / "compare" / "formats" / "planted.py").write_text("def f():\n    from compare.run import harness\n")
    (tmp_path / "compare" / "problem" / "planted.py").write_text("import compare.cli\n")
    (tmp_path / "compare" / "report" / "planted.py").write_text("import compare.run\n")
    (tmp_path / "compare" / "loose.py").write_text("")
    found = layer_violations(import_graph(tmp_path), layer_rules(tmp_path))
    assert found == [
        "compare.formats.planted imports compare.run.harness: formats/ may import nothing",
        "compare.loose: in no package of compare/ (only compare, compare.cli, compare.__main__ may sit outside one)",
        "compare.problem.planted imports compare.cli, the top",
        "compare.report.planted imports compare.run: report/ may import formats, problem, backends, timing, gate, "
        "kernels, cost, results",
    ], found
    init = tmp_path / "compare" / "report" / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8").replace('"results",', '"results", "run",'), encoding="utf-8")
    assert impure_rules(layer_rules(tmp_path)) == ["report/ may import run, above results"]


def test_every_package_says_what_it_may_import_and_the_layout_map_is_generated() -> None:
    rules = layer_rules()
    assert set(rules) == {p.parent.name for p in (ROOT / "compare").glob("*/__init__.py")}
    p = subprocess.run(
        [sys.executable, "scripts/module_map.py"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 0, p.stderr
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    inside = layout.split("<!-- module map of compare/: generated by scripts/module_map.py -->", 1)[1]
    assert inside.split("<!-- end of module map -->", 1)[0].strip() == p.stdout.strip(), (
        "run `python scripts/module_map.py --write`"
    )


# --- names imported from where they live ---------------------------------------------------------------------

#: Folders whose modules may import project names (the four packages, and the tests and scripts that use them).
IMPORTERS = (*PACKAGES, "tests", "scripts")


def _top_level_names(tree: ast.Module) -> set[str]:
    """What a module defines itself: its functions, classes and assigned names (inside ``if``/``try`` too)."""
    out: set[str] = set()
    for node in tree.body:
        for n in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(n.name)
            elif isinstance(n, ast.Assign):
                out.update(x.id for t in n.targets for x in ast.walk(t) if isinstance(x, ast.Name))
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out.add(n.target.id)
    return out


def borrowed_imports(root: Path = ROOT) -> list[str]:
    """Every ``from M import name`` of a project module ``M`` that does not define ``name`` (nor has it as a
    submodule): a name taken from a module that only passes it on. The public surface, ``from compare import``,
    is the one allowed re-export."""
    mods: dict[str, Path] = {}
    for pkg in IMPORTERS:
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in mods.items()}
    defined = {name: _top_level_names(tree) for name, tree in trees.items()}
    bad = []
    for name, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module in (None, "compare"):
                continue
            if node.module not in mods or node.module.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                if f"{node.module}.{a.name}" not in mods and a.name not in defined[node.module]:
                    bad.append(f"{mods[name].relative_to(root)}:{node.lineno} {node.module}.{a.name}")
    return bad


@pytest.mark.standard
def test_names_are_imported_from_where_they_live() -> None:
    assert borrowed_imports() == []


def test_the_borrowed_import_check_finds_a_passed_on_name(tmp_path: Path) -> None:
    """Negative control: a module that imports a name from a module that only imports it itself is reported; the
    defining module, a submodule and the public surface are not."""
    pkg = tmp_path / "compare"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from compare.low import thing\n")
    (pkg / "low.py").write_text("def thing():\n    pass\nif True:\n    OTHER = 1\n")
    (pkg / "mid.py").write_text("from compare.low import thing, OTHER\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("X = 1\n")
    (pkg / "top.py").write_text(
        "from compare.mid import thing\nfrom compare import thing as t\nfrom compare.sub import leaf\n"
    )
    assert borrowed_imports(tmp_path) == ["compare/top.py:1 compare.mid.thing"]


def passed_on_exports(root: Path = ROOT) -> list[str]:
    """Every name in a module's ``__all__`` that the module does not define itself (it imports it): a re-export
    list. ``compare/__init__.py``, the public surface, is the one module allowed one."""
    bad = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "compare/__init__.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            exported: list[str] = []
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
                ):
                    exported = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
            own = _top_level_names(tree)
            bad += [f"{rel}: __all__ passes on {n}" for n in exported if n not in own]
    return bad


@pytest.mark.standard
def test_no_module_but_the_public_surface_passes_names_on() -> None:
    assert passed_on_exports() == []


def test_the_re_export_check_finds_a_passed_on_name(tmp_path: Path) -> None:
    """Negative control: an ``__all__`` naming an imported name is reported, one naming the module's own is not,
    and the public surface may pass names on."""
    pkg = tmp_path / "compare" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "compare" / "__init__.py").write_text('from compare.sub.low import thing\n__all__ = ["thing"]\n')
    (pkg / "low.py").write_text('__all__ = ["thing"]\n\n\ndef thing():\n    pass\n')
    (pkg / "mid.py").write_text('from compare.sub.low import thing\n\nX = 1\n__all__ = ["X", "thing"]\n')
    assert passed_on_exports(tmp_path) == ["compare/sub/mid.py: __all__ passes on thing"]


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
            if top not in sys.stdlib_module_names and top not in (*TRITON_IMPL_THIRD_PARTY, "triton_impl"):
                bad.append(f"{node.lineno}: {m}")
    return bad


def test_triton_impl_imports_no_framework() -> None:
    """Every module of ``triton_impl``: the standard library, triton, numpy, itself; nothing else, anywhere in the
    file."""
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted((ROOT / "triton_impl").rglob("*.py"))
        if (bad := foreign_imports(path.read_text(encoding="utf-8")))
    }
    assert not offenders, offenders
    from compare.backends.registry import BACKENDS

    kernel_modules = {m for s in BACKENDS.values() for m in s.kernels}
    assert kernel_modules and {"triton_impl.env", *kernel_modules} <= set(_modules())


def test_the_triton_impl_rule_finds_a_framework_import() -> None:
    """Negative control: framework, backend-package and core imports are reported, wherever they stand; the
    standard library, triton and relative imports are not."""
    source = (
        "import os\nimport triton.language as tl\nfrom . import env\nfrom compare.results.gpu_build import ARCHS\n"
        "import torch\nfrom jax_impl import device\nfrom compare.backends.registry import spec\n"
        "def f():\n    import jax.numpy\n"
    )
    assert foreign_imports(source) == [
        "4: compare.results.gpu_build",
        "5: torch",
        "6: jax_impl",
        "7: compare.backends.registry",
        "9: jax.numpy",
    ]


@pytest.mark.standard
@pytest.mark.parametrize("mode", ["auto", "compile"])
def test_triton_impl_imports_with_torch_and_jax_blocked(mode: str) -> None:
    """With torch, jax, flax, jax_triton, ``torch_impl`` and ``jax_impl`` made unimportable, every module of
    ``triton_impl`` imports, the interpreter choice is made (``auto``: by asking the CUDA driver; ``compile``:
    forced, as the GPU build runs), the kernels are of the kind chosen, and the GPU build's catalogue reads the
    registry's kernel modules (compiled); no module of ``compare`` is imported on the way."""
    from compare.backends.registry import BACKENDS

    modules = sorted({m for s in BACKENDS.values() for m in s.kernels})
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
import triton_impl.gpu_build
from triton_impl import glu_kernels, glu_matmul_kernels
from triton_impl.gpu_build import catalogue, compiler, entry, sources, worker
assert glu_kernels.INTERPRETED is glu_matmul_kernels.INTERPRETED is interpret
kinds = {{type(k).__name__ for k in (glu_kernels._glu_fwd_kernel, glu_kernels._glu_bwd_kernel,
                                     glu_matmul_kernels._glu_matmul_kernel, glu_matmul_kernels._matmul_kernel)}}
assert kinds == {{'InterpretedFunction' if interpret else 'JITFunction'}}, kinds
import importlib
kernel_modules = [importlib.import_module(m) for m in {modules!r}]  # every module the registry names
assert {{m.INTERPRETED for m in kernel_modules}} == {{interpret}}
if not interpret:
    declared = [e.id for m in kernel_modules for e in m.GPU_BUILD]
    assert list(catalogue.describe({modules!r})['kernels']) == declared, declared
assert not [m for m in sys.modules if m.split('.')[0] == 'compare'], 'triton_impl imported compare'
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
