"""A kernel's source hash: what decides whether a cached build of it is still the kernel of this checkout.

The hash (sha256, 16 hex digits) covers the kernel's ``@triton.jit`` function and every ``@triton.jit`` function it
calls, transitively, across modules: a name defined at the top level of the same module, or bound by an import
(``from .glu_kernels import activation``; ``from . import glu_kernels`` then ``glu_kernels.activation``). It is
computed from the files' text with ``ast`` -- nothing is imported, so it is the same under every Triton version
(the committed table is checked under two) and changes exactly when the code compiled for the kernel does
(comments inside those functions included, comments elsewhere not). Triton's own modules are never followed:
``tl.*`` is the compiler's language, versioned with the Triton version that every cache key holds.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["kernel_source_hash", "module_file"]

#: Top-level packages whose functions are not kernel source (see the module docstring).
_NOT_FOLLOWED = ("triton",)


def module_file(module: str) -> Path:
    """The source file of ``module``, found without importing it (only its parent packages are imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ModuleNotFoundError(f"no Python source for module {module}")
    return Path(spec.origin)


@dataclass(frozen=True)
class _Source:
    """One module's top-level ``@triton.jit`` functions and what its import statements bind."""

    jit: dict[str, tuple[str, ast.FunctionDef]]  # name -> (source text with decorators, its ast)
    imported: dict[str, str]  # local name -> the dotted name it is bound to (``pkg.mod`` or ``mod.function``)


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (
        isinstance(target, ast.Attribute)
        and target.attr == "jit"
        and isinstance(target.value, ast.Name)
        and target.value.id == "triton"
    )


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement of ``module`` reads from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


@functools.cache
def _source(module: str) -> _Source | None:
    """``module``'s parsed source; None for a module that is not followed or has no Python source."""
    if module.split(".")[0] in _NOT_FOLLOWED:
        return None
    try:
        path = module_file(module)
    except ModuleNotFoundError:  # a C extension, a builtin, or no such module: no kernel source there
        return None
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    out = _Source({}, {})
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(module, path.name == "__init__.py", node)
            out.imported.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            out.imported.update({a.asname: a.name for a in node.names if a.asname})
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            out.jit[node.name] = ("\n".join(lines[start : node.end_lineno or node.lineno]), node)
    return out


def _resolve(module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
    """Where the ``@triton.jit`` function that ``name`` means in ``module`` is defined; None if it is not one."""
    src = _source(module)
    if src is None or depth > 20:  # a chain of re-exports this long is a cycle
        return None
    if name in src.jit:
        return module, name
    bound = src.imported.get(name)
    if bound is None or "." not in bound:
        return None
    where, attr = bound.rsplit(".", 1)
    return _resolve(where, attr, depth + 1)


def _callees(module: str, fn: ast.FunctionDef) -> set[tuple[str, str]]:
    """The ``@triton.jit`` functions that ``fn`` (of ``module``) names, as (defining module, name)."""
    src = _source(module)
    assert src is not None
    out: set[tuple[str, str]] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            found = _resolve(module, n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in src.imported:
            found = _resolve(src.imported[n.value.id], n.attr)  # `mod.fn` with `mod` an imported module
        else:
            continue
        if found is not None:
            out.add(found)
    return out


def kernel_source_hash(module: str, function: str) -> str:
    """sha256 (hex, 16 digits) of ``module.function``'s source and of every ``@triton.jit`` function it calls.

    Raises:
        KeyError: ``function`` is not a top-level ``@triton.jit`` function of ``module``.
    """
    src = _source(module)
    if src is None or function not in src.jit:
        raise KeyError(f"no top-level @triton.jit function {function} in {module}")
    seen: set[tuple[str, str]] = set()
    todo = [(module, function)]
    while todo:
        where = todo.pop()
        if where not in seen:
            seen.add(where)
            todo += _callees(where[0], _jit(where)[1])
    # name and text, not the module: moving a helper between files does not change the compiled code
    h = hashlib.sha256()
    for name, text in sorted((w[1], _jit(w)[0]) for w in seen):
        h.update(f"{name}\0{text}\0".encode())
    return h.hexdigest()[:16]


def _jit(where: tuple[str, str]) -> tuple[str, ast.FunctionDef]:
    src = _source(where[0])
    assert src is not None  # where came from _resolve, which found it there
    return src.jit[where[1]]
