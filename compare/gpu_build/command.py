"""``python -m compare gpu-build``: compile every Triton kernel for sm_90/sm_80 without a GPU, in a subprocess.

The compile needs real ``@triton.jit`` kernels, but a process that has imported a Triton backend on a machine
without CUDA has switched Triton to its CPU interpreter (``TRITON_INTERPRET=1``, decided once, at import). So the
build always runs in a fresh ``python -m triton_impl.gpu_build`` whose environment has no ``TRITON_INTERPRET`` and
``FUSION_COMPARE_TRITON=compile`` (the project's switch, ``triton_impl.env``: compile without looking for a CUDA
device), bounded by a timeout. Its output is ``gpu_build.json`` and ``GPU_BUILD.md`` (rendered by
:mod:`compare.gpu_build.table`).

This module imports neither torch nor triton.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compare.gpu_build.table import ARCHS
from compare.problem.cases import InputError
from compare.run import exitcodes

__all__ = ["DEFAULT_TIMEOUT_S", "TRITON_MODE_ENV", "add_parser", "cmd_gpu_build", "compiled_mode_env", "run"]

#: Wall-clock bound of one whole build subprocess (the full sweep takes a few minutes on 2 cores).
DEFAULT_TIMEOUT_S = 3600.0
#: After a timeout the build gets SIGTERM (it then kills its compile workers) and this long to exit before SIGKILL.
_TERM_GRACE_S = 30.0

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: triton_impl.env.MODE_ENV (not imported: the core reaches no backend package by an import statement).
TRITON_MODE_ENV = "FUSION_COMPARE_TRITON"


def compiled_mode_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) in which Triton compiles instead of interpreting.

    ``TRITON_INTERPRET`` removed (this process may have chosen the interpreter), ``FUSION_COMPARE_TRITON=compile``,
    and the project root first on ``PYTHONPATH`` so that ``triton_impl`` is importable from a checkout that is not
    installed (e.g. a bare Triton venv).
    """
    env = dict(os.environ if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    env[TRITON_MODE_ENV] = "compile"
    root = str(_PROJECT_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(
    args: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S, capture: bool = False, python: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m triton_impl.gpu_build ARGS`` in compiled mode; return the finished process.

    Args:
        args: arguments of ``triton_impl.gpu_build`` (``--arch``, ``--out``, ``--describe``, ...).
        timeout: wall-clock bound in seconds; past it the build gets SIGTERM, then SIGKILL after 30 s.
        capture: capture stdout/stderr as text (default: they go to this process's).
        python: interpreter (default: this one).

    Raises:
        subprocess.TimeoutExpired: the build ran past ``timeout`` (it has been stopped).
    """
    cmd = [python or sys.executable, "-m", "triton_impl.gpu_build", *args]
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, env=compiled_mode_env(), cwd=_PROJECT_ROOT, stdout=pipe, stderr=pipe, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the build's SIGTERM handler kills its compile workers
            try:
                proc.communicate(timeout=_TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``gpu-build`` subcommand on an ``argparse`` subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gpu-build",
        help="compile the Triton kernels for sm_90/sm_80 without a GPU; registers, spills, occupancy",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--arch", nargs="+", default=["sm_90", "sm_80"], help=f"targets ({', '.join(ARCHS)})")
    p.add_argument("--out", default="out/gpu-build", help="folder for gpu_build.json and GPU_BUILD.md")
    p.add_argument("--dtype", nargs="+", help="float32 bfloat16 float16 (default: all)")
    p.add_argument("--kernel", nargs="+", help="geglu_fwd geglu_bwd geglu_matmul matmul (default: all)")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="parallel compile workers")
    p.add_argument("--cache-dir", help="compile cache (default ~/.cache/fusion-compare/gpu-build)")
    p.add_argument("--no-cache", action="store_true", help="compile everything again")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the whole build may take")
    p.set_defaults(fn=cmd_gpu_build)
    return p


def _forwarded(a: argparse.Namespace) -> list[str]:
    unknown = [x for x in a.arch if x not in ARCHS]
    if unknown:
        raise InputError(f"unknown arch {', '.join(unknown)}; known: {', '.join(ARCHS)}")
    if a.jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {a.jobs}")
    args = ["--arch", *a.arch, "--out", str(Path(a.out).resolve()), "--jobs", str(a.jobs), "--check"]
    if a.dtype:
        args += ["--dtype", *a.dtype]
    if a.kernel:
        args += ["--kernel", *a.kernel]
    if a.cache_dir:
        args += ["--cache-dir", str(Path(a.cache_dir).resolve())]
    if a.no_cache:
        args.append("--no-cache")
    return args


def cmd_gpu_build(a: argparse.Namespace) -> int:
    """Build, write ``gpu_build.json``/``GPU_BUILD.md``; exit 1 when a config fails or breaks the autotune rule."""
    try:
        proc = run(_forwarded(a), timeout=a.timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"gpu-build ran past {a.timeout:.0f} s and was stopped") from exc
    if proc.returncode == 2:
        raise InputError("gpu-build refused its arguments (see above)")
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"gpu-build subprocess exited with {proc.returncode} (see its output above)")
    data = json.loads((Path(a.out) / "gpu_build.json").read_text(encoding="utf-8"))
    n_err = sum(not r["ok"] for r in data["rows"])
    print(
        f"{Path(a.out) / 'GPU_BUILD.md'}: {len(data['rows'])} builds, {n_err} failed, triton {data['triton_version']}"
    )
    return exitcodes.FINDING if proc.returncode == 1 else exitcodes.OK
