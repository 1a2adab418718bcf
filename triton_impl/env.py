"""How this process runs Triton kernels: compiled for the GPU, or in Triton's CPU interpreter. Chosen once.

Triton decides once, when a kernel is decorated with ``@triton.jit``, whether it becomes a compiled GPU kernel or
an ``InterpretedFunction`` that runs on the CPU through numpy. That decision reads the ``TRITON_INTERPRET``
environment variable, so it has to be made before ``triton`` (or any kernel module) is imported, and it holds for
the whole process. :func:`choose` makes it, explicitly and in one place: every kernel module of ``triton_impl``
calls it before it imports triton, ``torch_impl`` calls it on import, and the test suite calls it first thing in
``tests/conftest.py``; no test module sets ``TRITON_INTERPRET`` itself.

The rule: an explicit ``TRITON_INTERPRET`` in the environment wins; else ``FUSION_COMPARE_TRITON`` may force
``compile`` or ``interpret``; else (``auto``) kernels are compiled where a CUDA device exists and interpreted
elsewhere. Whether one exists is asked of the NVIDIA driver itself (:func:`cuda_device_count`), not of a framework,
so the answer is the same whichever framework launches the kernels, and no framework is imported to get it. The
variable is set only when the choice is "interpret", so a process (and its subprocesses, which inherit it) that
compiles never sees it.

This module imports neither triton nor any framework.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["FP_FUSION", "MODES", "MODE_ENV", "choose", "cuda_device_count", "interpreted"]

#: Forces the choice: ``auto`` (default), ``compile`` or ``interpret``.
MODE_ENV = "FUSION_COMPARE_TRITON"
MODES: tuple[str, ...] = ("auto", "compile", "interpret")

#: The CUDA driver library's names (Linux, then Windows).
_CUDA_DRIVER_LIBS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")

#: The process's choice once made (True: interpret); None before the first :func:`choose`.
_chosen: bool | None = None


def interpreted() -> bool:
    """Return True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``).

    Under the interpreter every program instance of a grid is a Python-level step, so the
    kernels use few, large blocks and skip autotuning; on a GPU they use normal tile sizes.
    """
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices this process can use, as the driver reports them (``cuInit``, ``cuDeviceGetCount``); 0 where no
    driver library loads or it reports an error (no device, ``CUDA_VISIBLE_DEVICES`` empty). Asked once a process."""
    for name in _CUDA_DRIVER_LIBS:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def _rule() -> bool:
    """The rule of the module docstring, applied to the environment as it is now: True for "interpret"."""
    if "TRITON_INTERPRET" in os.environ:
        return interpreted()
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}; allowed: {', '.join(MODES)}")
    if mode == "auto":
        mode = "compile" if cuda_device_count() > 0 else "interpret"
    return mode == "interpret"


def choose() -> bool:
    """Make this process's choice (see the module docstring) and return True when it interprets.

    The first call decides; later calls return the same answer. Raises ``RuntimeError`` when triton was already
    imported under a different choice than the rule gives now (its kernels would silently be of the other kind), or
    when the environment has changed since the choice was made so that the rule now says otherwise (kernels
    decorated from then on would be of the other kind); ``ValueError`` for an unknown mode.
    """
    global _chosen
    interpret = _rule()
    if _chosen is not None:
        if interpret != _chosen:
            raise RuntimeError(
                f"Triton was chosen to {'interpret' if _chosen else 'compile'} in this process, but the environment "
                f"now says {'interpret' if interpret else 'compile'} (TRITON_INTERPRET or {MODE_ENV} changed after "
                "the choice): kernels decorated from now on would be of the other kind"
            )
        return _chosen
    if interpret and "TRITON_INTERPRET" not in os.environ:
        if "triton" in sys.modules:
            raise RuntimeError(
                "triton was imported before the interpreter was chosen: its kernels would be "
                "compiled ones; choose (triton_impl.env.choose, or import torch_impl) before importing triton"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    _chosen = interpret
    return interpret


# FMA contraction (a * b + c -> fma) in compiled kernels, passed explicitly at every launch
# (``enable_fp_fusion=FP_FUSION``). Triton 3.9 emits a UserWarning on the first compile when
# neither the launch option nor TRITON_DEFAULT_FP_FUSION is set, and its default flips to off in
# 3.10; pinning it keeps GPU numerics independent of the Triton version. The interpreter
# ignores it.
FP_FUSION: bool = True
