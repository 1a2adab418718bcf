"""PyTorch backends: eager modules, ``torch.compile`` and hand-written Triton kernels.

Importing this package (the registry does so lazily, only when a torch backend is asked for) configures Triton:
on a machine without CUDA it sets ``TRITON_INTERPRET=1`` before triton is imported, so the Triton kernels run
in Triton's interpreter on CPU tensors (exact, slow: parity only, never timed).
"""

from __future__ import annotations

import os
import sys


def _configure_triton() -> None:
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    import torch  # only while the choice is open: torch_impl.ops.geglu_kernels itself is torch-free

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_configure_triton()
