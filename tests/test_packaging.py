"""What the wheel holds, checked on the source: every module in a package the build finds, the golden files as
package data at the one path ``compare.problem.golden`` reads, and every third-party import declared.

The wheel itself is built, installed into a fresh environment and run outside the checkout by
``scripts/wheel_check.sh`` (``make wheel-check``, part of ``make ci``).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

from compare.problem import golden as G

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compare", "torch_impl", "jax_impl", "triton_impl")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _dist(name: str) -> str:
    """A distribution name in its normal form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_build_finds_every_package_and_the_golden_folder() -> None:
    """Setuptools' discovery with the project's ``include`` finds exactly the folders that hold modules, and the
    golden data folder (``compare.golden``, a namespace package of data): no module left out, nothing else shipped."""
    from setuptools import find_namespace_packages

    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_namespace_packages(str(ROOT), include=include))
    folders = {p.parent.relative_to(ROOT) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    assert found == {".".join(f.parts) for f in folders} | {"compare.golden"}


def test_the_golden_files_ship_where_the_lookup_reads_them() -> None:
    """``compare/golden`` is the one path the lookup reads (unless ``FUSION_COMPARE_GOLDEN_DIR`` says otherwise): in
    the checkout a link to the repository's ``golden/``, and every file there matches a package-data pattern of
    ``compare.golden``, so the wheel holds the same files at the same place."""
    link = ROOT / "compare" / "golden"
    assert link.is_symlink() and link.resolve() == (ROOT / "golden").resolve()
    assert Path(G.__file__).resolve().parents[1] / "golden" == link
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["compare.golden"]
    files = sorted(p.name for p in (ROOT / "golden").iterdir())
    assert G.MANIFEST in files and len(files) > 1
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files of the four packages that import it (anywhere in a file, lazy imports too)."""
    found: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in PACKAGES and top not in sys.stdlib_module_names:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared() -> None:
    """Each third-party module the packages import is provided by a distribution ``pyproject.toml`` declares, as a
    dependency or in an extra (the installed distribution that provides it, or its own name where none here does)."""
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"].values()
    requirements = [*project["dependencies"], *(r for extra in extras for r in extra)]
    declared = {_dist(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}
    provided = importlib.metadata.packages_distributions()
    imports = _third_party_imports()
    assert "rich" in imports  # the scan sees a lazy import (compare.run.progress)
    missing = {
        module: sorted(files)
        for module, files in imports.items()
        if not {_dist(d) for d in provided.get(module, [module])} & declared
    }
    assert missing == {}
