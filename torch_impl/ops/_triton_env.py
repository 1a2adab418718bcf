"""How this process runs Triton kernels: compiled for the GPU, or in Triton's CPU interpreter. Chosen once.

Triton decides once, when a kernel is decorated with ``@triton.jit``, whether it becomes a compiled GPU kernel or
an ``InterpretedFunction`` that runs on the CPU through numpy. That decision reads the ``TRITON_INTERPRET``
environment variable, so it has to be made before ``triton`` (or any kernel module) is imported, and it holds for
the whole process. :func:`choose` makes it, explicitly and in one place: ``torch_impl`` calls it on import, and the
test suite calls it first thing in ``tests/conftest.py``; no test module sets ``TRITON_INTERPRET`` itself.

The rule: an explicit ``TRITON_INTERPRET`` in the environment wins; else ``FUSION_COMPARE_TRITON`` may force
``compile`` or ``interpret``; else (``auto``) kernels are compiled where CUDA exists and interpreted elsewhere. The
variable is set only when the choice is "interpret", so a process (and its subprocesses, which inherit it) that
compiles never sees it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["FP_FUSION", "MODES", "MODE_ENV", "choose", "interpreted"]

#: Forces the choice: ``auto`` (default), ``compile`` or ``interpret``.
MODE_ENV = "FUSION_COMPARE_TRITON"
MODES: tuple[str, ...] = ("auto", "compile", "interpret")


def interpreted() -> bool:
    """Return True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``).

    Under the interpreter every program instance of a grid is a Python-level step, so the
    kernels use few, large blocks and skip autotuning; on a GPU they use normal tile sizes.
    """
    return os.environ.get("TRITON_INTERPRET") == "1"


def choose() -> bool:
    """Make this process's choice (see the module docstring) and return True when it interprets.

    Idempotent. Raises ``RuntimeError`` when triton was already imported under a different choice than the rule
    gives now (its kernels would silently be of the other kind), and ``ValueError`` for an unknown mode.
    """
    if "TRITON_INTERPRET" in os.environ:
        return interpreted()
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}; allowed: {', '.join(MODES)}")
    if mode == "auto":
        import torch  # the choice needs to know whether CUDA exists; the kernel modules themselves are torch-free

        mode = "compile" if torch.cuda.is_available() else "interpret"
    if mode == "interpret":
        if "triton" in sys.modules:
            raise RuntimeError(
                "triton was imported before the interpreter was chosen: its kernels would be "
                "compiled ones; choose (import torch_impl) before importing triton"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return mode == "interpret"


# FMA contraction (a * b + c -> fma) in compiled kernels, passed explicitly at every launch
# (``enable_fp_fusion=FP_FUSION``). Triton 3.9 emits a UserWarning on the first compile when
# neither the launch option nor TRITON_DEFAULT_FP_FUSION is set, and its default flips to off in
# 3.10; pinning it keeps GPU numerics independent of the Triton version. The interpreter
# ignores it.
FP_FUSION: bool = True
