"""PyTorch backends: eager modules, ``torch.compile`` and hand-written Triton kernels.

Importing this package (the registry does so lazily, only when a torch backend is asked for) makes the process's
one choice of how Triton kernels run (``torch_impl.ops._triton_env.choose``): compiled where CUDA exists; on a
machine without CUDA ``TRITON_INTERPRET=1`` is set before triton is imported, so the kernels run in Triton's
interpreter on CPU tensors (exact, slow: parity only, never timed).
"""

from __future__ import annotations

from torch_impl.ops import _triton_env

_triton_env.choose()
