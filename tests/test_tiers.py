"""Every test has a tier (``tests/conftest.py``): ``make check`` selects the quick tier by marker, so a test without
one would leave the quick loop unseen. The control: a test file without a marker is refused at collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.standard

ROOT = Path(__file__).resolve().parent.parent


def _collect(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(source, encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_test_without_a_tier_is_refused_and_one_with_a_tier_is_collected(tmp_path: Path) -> None:
    bare = _collect(tmp_path, "def test_untiered() -> None:\n    pass\n")
    assert bare.returncode != 0 and "tests without a tier marker" in bare.stdout + bare.stderr, bare.stdout
    assert "test_probe.py::test_untiered" in bare.stdout + bare.stderr
    tiered = _collect(tmp_path, "import pytest\n\n\n@pytest.mark.quick\ndef test_tiered() -> None:\n    pass\n")
    assert tiered.returncode == 0, tiered.stdout + tiered.stderr
