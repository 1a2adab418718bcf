"""The second environment of ``tests/test_ab.py``'s A/B across two torch versions: the torch minor release before
the one ``constraints/cpu.txt`` pins, installed by pip as a user would (its own dependencies, Triton's among them;
``--no-compile``: 26 s against 37 s here; ``--no-cache-dir``: 21 s, and no 3.3 GB copy of its wheels left in pip's
cache), and everything else, this checkout's dependencies, read from the test's
environment through a ``.pth`` file at the end of its path. Built once into ``.venv-torch-prev`` beside ``.venv``
(4.7 GB: the package index has only the CUDA build of an older torch, which runs on the CPU), under a temporary
name renamed when complete.

Standard library only, so that ``make ci`` builds it beside the other installs and the tests (``python
tests/other_torch.py``): built inside the test session instead, it took one test worker 110 s under the other's load.
One build at a time (a lock beside it): the test waits for one in progress, builds it itself where it is missing, and
skips, with pip's words, only where pip cannot install it, or where the disk has not the room for it beside
what ``make ci`` installs and caches next to it (a full disk fails every install at once: the CI's main environment
failed so).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / ".venv-torch-prev"
#: The file that marks a complete build; the ``.pth`` file that layers the test's environment under it.
DONE, LAYER = ".installed", "zz_fusion_compare_deps.pth"
#: Free disk, in GiB, that the build needs: pip's peak, 5.8 GiB (4.6 once installed), measured on 2.12.1, and
#: what runs beside it in ``make ci`` (the wheel check's fresh environment, 3.2 GiB, and the tests' caches).
ROOM_GIB = 6 + 5


def requirement() -> str:
    """The pip requirement of the torch minor release before the pinned one (``torch==2.12.*`` beside 2.13.0)."""
    pinned = re.search(r"^torch==(\d+)\.(\d+)", (ROOT / "constraints" / "cpu.txt").read_text(), re.MULTILINE)
    if pinned is None:
        raise RuntimeError("constraints/cpu.txt pins no torch")
    return f"torch=={pinned[1]}.{int(pinned[2]) - 1}.*"


def python() -> Path:
    return ENV / "bin" / "python"


def _site(py: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def build(layered: list[str]) -> str:
    """Build the environment unless it is there, and layer the site folders ``layered`` under it (rewritten each
    time: a test run by another interpreter than ``.venv``'s reads its own). "" when it is ready, else why not."""
    with open(ENV.with_name(f"{ENV.name}.lock"), "w") as held:  # one build at a time: the test waits for make's
        fcntl.flock(held, fcntl.LOCK_EX)
        why = _build()
    if why:
        return why
    layer = _site(python()) / LAYER
    text = "".join(f"{s}\n" for s in layered)
    if not layer.is_file() or layer.read_text(encoding="utf-8") != text:
        layer.write_text(text, encoding="utf-8")
    return ""


def _build() -> str:
    if not (ENV / DONE).is_file():
        free = shutil.disk_usage(ROOT).free / 2**30
        if free < ROOM_GIB:
            return (
                f"{free:.1f} GiB free on the disk; the second torch environment takes {ROOM_GIB} (tests/other_torch.py)"
            )
        building = ENV.with_name(f"{ENV.name}.{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, timeout=120)
        want = requirement()
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "--no-cache-dir"]
        got = subprocess.run([*pip, "--disable-pip-version-check", want], capture_output=True, text=True, timeout=900)
        if got.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            return f"pip could not install {want} (exit {got.returncode}): {got.stderr.strip()[-600:]}"
        (building / DONE).touch()
        try:
            building.rename(ENV)
        except OSError:  # another process built it first
            shutil.rmtree(building, ignore_errors=True)
    return ""


if __name__ == "__main__":  # make ci: under .venv's site folder, whose path is known before .venv is installed
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    why = build([str(ROOT / ".venv" / "lib" / version / "site-packages")])
    print(why or f"built {ENV} ({requirement()})")
