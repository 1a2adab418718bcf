"""How the compare side reaches the triton side of the GPU build: only through processes and JSON.

The compile needs real ``@triton.jit`` kernels, but a process that has imported a Triton backend on a machine
without CUDA has switched Triton to its CPU interpreter (``TRITON_INTERPRET=1``, decided once, at import). So the
compare side never imports triton (nor ``triton_impl``): it starts ``python -m triton_impl.gpu_build.worker``
(:data:`WORKER`) in an environment with no ``TRITON_INTERPRET`` and ``FUSION_COMPARE_TRITON=compile``
(:func:`compiled_mode_env`), through the project's one child-process helper (``compare.run.child``), and reads
what it writes.

The kernel modules to build are the registry's: the union of ``BackendSpec.kernels`` over
``compare.backends.registry.BACKENDS`` (:func:`kernel_modules`), so a backend with a new kernel module is in the
build as soon as its registry line names the module.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compare.backends.registry import BACKENDS
from compare.run import child

__all__ = ["PROJECT_ROOT", "TRITON_MODE_ENV", "WORKER", "compiled_mode_env", "describe", "kernel_modules", "worker"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: triton_impl.env.MODE_ENV (not imported: the core reaches no backend package by an import statement).
TRITON_MODE_ENV = "FUSION_COMPARE_TRITON"
#: The triton side's entry point (``python -m``).
WORKER = "triton_impl.gpu_build.worker"
#: Seconds ``--describe`` may take: importing triton and the kernel modules (seconds; minutes on a cold disk).
DESCRIBE_TIMEOUT_S = 300.0


def kernel_modules() -> list[str]:
    """The Triton kernel modules of every registered backend (``BackendSpec.kernels``), sorted, once each."""
    return sorted({m for s in BACKENDS.values() for m in s.kernels})


def compiled_mode_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) in which Triton compiles instead of interpreting.

    ``TRITON_INTERPRET`` removed (this process may have chosen the interpreter), ``FUSION_COMPARE_TRITON=compile``,
    and the project root first on ``PYTHONPATH`` so that ``triton_impl`` is importable from a checkout that is not
    installed (e.g. a bare Triton venv).
    """
    env = dict(os.environ if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    env[TRITON_MODE_ENV] = "compile"
    root = str(PROJECT_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def worker(args: Sequence[str], *, stdout: Path | None = None, stderr: Path | None = None) -> child.Child:
    """Start ``python -m triton_impl.gpu_build.worker ARGS`` in compiled mode, in its own process group."""
    cmd = [sys.executable, "-m", WORKER, *args]
    return child.start(cmd, env=compiled_mode_env(), cwd=PROJECT_ROOT, stdout=stdout, stderr=stderr)


def describe(modules: Sequence[str], timeout_s: float = DESCRIBE_TIMEOUT_S) -> dict[str, Any]:
    """The triton side's catalogue of ``modules`` (``--describe``), compiling nothing: ``{"triton_version",
    "modules", "dtypes", "default_num_stages", "specialization", "kernels": {id: {"function", "module", "file",
    "source_hash", "autotune_list", "launches", "launch_args", "configs", "fixed", "enable_fp_fusion"}}}``.

    Raises:
        RuntimeError: the describe process ran past ``timeout_s`` or failed (with its exit and stderr tail).
    """
    if not modules:
        raise RuntimeError("no registered backend names a Triton kernel module (BackendSpec.kernels)")
    with tempfile.TemporaryDirectory(prefix="gpu-build-describe-") as tmp:
        out = Path(tmp) / "describe.json"
        proc = worker(["--describe", "--modules", *modules], stdout=out)
        try:
            rc = proc.wait(timeout_s)
            if rc is None:
                proc.end()
                raise RuntimeError(f"{WORKER} --describe ran past {timeout_s:.0f} s and was stopped")
            if rc != 0:
                raise RuntimeError(f"{WORKER} --describe {child.describe_exit(rc)}:\n{proc.tail()}")
            data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        finally:
            proc.close()
    return data
