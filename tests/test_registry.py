"""One backend, one place: a backend registered from a test module, with one registry line and no other edit,
shows up in ``list``, ``run``, the report, the cost model, ``sweep`` and the compile-cost sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compare.backends import registry
from compare.cli.main import main
from compare.formats.codec import from_json, to_json
from tests import fake_backend

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake() -> Iterator[str]:
    registry.register(fake_backend.SPEC)
    try:
        yield fake_backend.NAME
    finally:
        registry.unregister(fake_backend.NAME)


@pytest.mark.standard
@pytest.mark.compile
def test_a_registered_backend_appears_everywhere(fake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert any(
        line.strip().startswith(fake + " ") and "available" in line for line in capsys.readouterr().out.splitlines()
    )

    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--preset",
            "tiny",
            "--backend",
            "torch-eager",
            fake,
            "--budget",
            "0.05",
            "--no-ceilings",
            "--no-plots",
            "--shape-sweep",
            "1",
            "4",
            "--gpu-build",
            "",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    row = next(r for r in doc["results"] if r["backend"] == fake)
    assert row["status"] == "ok" and row["timing"] and row["cost"]["plan"] == "eager"  # run, timer, cost model
    assert {r["backend"] for r in doc["shape_sweep"]} >= {fake}  # the compile-cost sweep
    md = (out / "DETAILS.md").read_text(encoding="utf-8")
    for section in (
        "## Parity",
        "## Timing",
        "## What fusion buys",
        "## Cost model and roofline",
        "## Compile cost and shape generality",
    ):
        part = md.split(section, 1)[1].split("\n## ", 1)[0]
        if section == "## What fusion buys":  # plan "eager" fuses nothing: named under the table, never a row
            assert f"fuses nothing on that case and mode (a time they save is not fusion's): {fake} (" in part
            assert f"| {fake} |" not in part
            continue
        assert f"| {fake} |" in part, section

    sweep_out = tmp_path / "sweep"
    assert (
        main(
            [
                "sweep",
                "--preset",
                "tiny",
                "--tokens",
                "1",
                "2",
                "--backend",
                fake,
                "--budget",
                "0.05",
                "--no-plots",
                "--out",
                str(sweep_out),
            ]
        )
        == 0
    )
    swept = json.loads((sweep_out / "results.json").read_text(encoding="utf-8"))
    assert [r["backend"] for r in swept["results"]] == [fake, fake]


def test_the_core_names_no_backend_but_the_baseline() -> None:
    """``grep`` for every registered backend name in ``compare/``: only the registry (and the baseline default)."""
    names = [n for n in registry.BACKENDS if n != registry.DEFAULT_BASELINE]
    hits = []
    for path in sorted((ROOT / "compare").rglob("*.py")):
        if path.name == "registry.py":
            continue
        text = path.read_text(encoding="utf-8")
        hits += [f"{path.name}: {n}" for n in names if n in text]
    assert not hits, hits


def test_the_core_imports_no_framework_package_except_through_the_registry() -> None:
    """``compare/`` reaches ``torch_impl``/``jax_impl``/``triton_impl`` only through the registry's loaders (strings
    it imports by name) and the GPU build's subprocess, never with an import statement."""
    import ast

    offenders = []
    for path in sorted((ROOT / "compare").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.name}:{node.lineno} {m}"
                for m in mods
                if m.split(".")[0] in ("torch_impl", "jax_impl", "triton_impl", "torch", "jax", "flax", "triton")
            ]
    assert not offenders, offenders


def test_compare_works_with_torch_and_jax_blocked(tmp_path: Path) -> None:
    """With torch, jax, flax and triton made unimportable: cases, golden, parity, a report from a results file and
    diff all work (the CLI's `report` and `diff` measure nothing)."""
    results = ROOT / "reports" / "cpu" / "results.json"
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'jax', 'jaxlib', 'flax', 'triton', 'torch_impl', 'jax_impl', 'triton_impl'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from compare.problem.cases import PRESETS
from compare.problem.golden import golden_for
from compare.run.cell import plain_reference
from compare.gate.parity import check_all
case = PRESETS['tiny'].case('bfloat16')
g = golden_for(case)
p = plain_reference(case)
assert check_all({{'y': p['y']}}, g.ref, p, 'bfloat16').passed
from compare.cli.main import main
assert main(['report', {str(results)!r}, '--out', {str(tmp_path / "R.md")!r}]) == 0
assert main(['diff', {str(results)!r}, {str(results)!r}]) == 0
assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'flax', 'triton')]
print('ok')
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(registry.BACKENDS))
def test_each_entry_names_its_modules_object(name: str) -> None:
    """A registry line and the object its target holds agree on the name (a copied backend file that kept its
    source's name would otherwise report under the wrong row). Imports the target module only: no framework runs."""
    s = registry.spec(name)
    try:
        backend = s.load()
    except ImportError as exc:  # a framework this environment lacks
        pytest.skip(f"cannot import {s.target}: {exc}")
    assert backend.name == name, f"{s.target}.BACKEND.name is {backend.name!r}, its registry line says {name!r}"


def test_an_entry_crosses_a_process_boundary_whole() -> None:
    """Every field survives to_json -> JSON -> from_json, for every entry (the TP worker and the sweep worker
    re-register what they are sent); an unknown field is refused, naming it."""
    for s in registry.BACKENDS.values():
        assert from_json(registry.BackendSpec, json.loads(json.dumps(to_json(s))), strict=True) == s
    d = {**to_json(registry.spec("torch-eager")), "colour": "red"}
    with pytest.raises(ValueError, match="colour"):
        from_json(registry.BackendSpec, d, strict=True)


def test_a_remat_variant_names_a_registered_twin_it_recomputes() -> None:
    """``remat_of`` names a registered backend of the same framework that implements every model the variant does,
    and the variant's plan is a recomputation plan over its twin's (``compare.cost.model.REMAT_PLANS``)."""
    from compare.cost.model import REMAT_PLANS

    remats = {s.name: s.remat_of for s in registry.BACKENDS.values() if s.remat_of}
    assert remats == {"torch-eager-remat": "torch-eager", "jax-xla-remat": "jax-xla"}
    for name, twin_name in remats.items():
        s, twin = registry.spec(name), registry.spec(twin_name)
        assert s.framework == twin.framework and set(s.models) <= set(twin.models), name
        assert s.plan is not None and REMAT_PLANS[s.plan] == twin.plan, name
        assert "linear" not in s.models  # nothing to recompute


def test_the_framework_follows_from_the_target() -> None:
    assert registry.spec("torch-compile").framework == "torch" and registry.spec("jax-xla").framework == "jax"
    with pytest.raises(ValueError, match="is a torch module, not jax"):
        registry.BackendSpec(name="x", target="torch_impl.backends.eager", about="", framework="jax")
    with pytest.raises(ValueError, match="name its framework"):
        registry.BackendSpec(name="x", target="elsewhere.backend", about="")
    with pytest.raises(TypeError):  # keywords only: four positional strings are not an entry
        registry.BackendSpec("x", "torch", "torch_impl.backends.eager", "")  # type: ignore[misc]
