"""What the wheel holds, checked on the source: every module in a package the build finds, and the golden files as
package data at the one path ``compare.problem.golden`` reads.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from compare.problem import golden as G

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compare", "torch_impl", "jax_impl", "triton_impl")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


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
