"""Shared switches for the hand-written Triton kernels in ``torch_impl.ops``.

Triton decides once, when a kernel is decorated with ``@triton.jit``, whether it becomes a
compiled GPU kernel or an ``InterpretedFunction`` that runs on the CPU through numpy. That
decision reads the ``TRITON_INTERPRET`` environment variable, so it has to be set before
``triton`` (or any kernel module) is imported. The kernel modules call :func:`interpreted`
at import time to pick launch parameters that match the mode their kernels were built in.
"""

from __future__ import annotations

import os

__all__ = ["FP_FUSION", "interpreted"]


def interpreted() -> bool:
    """Return True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``).

    Under the interpreter every program instance of a grid is a Python-level step, so the
    kernels use few, large blocks and skip autotuning; on a GPU they use normal tile sizes.
    """
    return os.environ.get("TRITON_INTERPRET") == "1"


# FMA contraction (a * b + c -> fma) in compiled kernels, passed explicitly at every launch
# (``enable_fp_fusion=FP_FUSION``). Triton 3.9 emits a UserWarning on the first compile when
# neither the launch option nor TRITON_DEFAULT_FP_FUSION is set, and its default flips to off in
# 3.10; pinning it keeps GPU numerics independent of the Triton version. The interpreter
# ignores it.
FP_FUSION: bool = True
