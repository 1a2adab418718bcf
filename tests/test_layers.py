"""Layers a test enforces: no import cycle anywhere in the three packages, counting imports inside functions too.

A module-level graph of ``compare``, ``torch_impl`` and ``jax_impl``: an edge for every ``import`` or ``from ...
import`` of another project module, wherever it stands (a lazy import inside a function is still a dependency,
only a later one). Package ``__init__`` files importing their own submodules are not edges. The core's other
rule (``compare/`` imports no framework package, and works with torch and jax blocked) is in
``tests/test_registry.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compare", "torch_impl", "jax_impl")


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
