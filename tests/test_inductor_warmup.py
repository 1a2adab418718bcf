"""Inductor's one-time set-up (``torch_impl.inductor_warmup``, run by ``make setup``): it fills the folder the
backends compile into, and a compiler that computes its small graph wrong is an error, not a warm cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.compile
def test_the_warm_up_fills_the_folder_the_backends_compile_into(tmp_path: Path) -> None:
    """In a fresh interpreter whose temporary folder (where Inductor's default cache lives) is the test's own: the
    warm-up exits 0 and the ISA-keyed folder it names now holds the compiled code (the control: empty before)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "FUSION_COMPARE_INDUCTOR_CACHE")}
    env["TMPDIR"] = str(tmp_path)
    assert list(tmp_path.iterdir()) == []
    out = subprocess.run(
        [sys.executable, "-m", "torch_impl.inductor_warmup"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(out.stdout.rsplit("(cache: ", 1)[1].split(")")[0])
    assert folder.is_relative_to(tmp_path) and folder.name.startswith("isa-"), out.stdout
    assert any(p.suffix == ".so" for p in folder.rglob("*")), sorted(p.name for p in folder.rglob("*"))[:20]


@pytest.mark.quick
def test_a_warm_up_graph_computed_wrong_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``torch.compile`` that returns its input unchanged (the wrong values) makes the warm-up raise, naming the
    error; nothing is compiled."""
    import torch

    from torch_impl import inductor_warmup

    for name in ("TORCHINDUCTOR_CACHE_DIR", "FUSION_COMPARE_INDUCTOR_CACHE"):  # restored as they were afterwards
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch, "compile", lambda f, **kw: lambda x: x)
    with pytest.raises(RuntimeError, match="computed wrong values"):
        inductor_warmup.warm_up()
