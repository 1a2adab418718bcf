"""PyTorch backends: eager modules, ``torch.compile`` and hand-written Triton kernels.

Importing this package (the registry does so lazily, only when a torch backend is asked for) makes the process's
one choice of how Triton kernels run (``triton_impl.env.choose``), before anything here can import triton (the
kernels of ``triton_impl``, or ``torch.compile``'s Inductor): compiled where CUDA exists; on a machine without CUDA
``TRITON_INTERPRET=1`` is set before triton is imported, so the kernels run in Triton's interpreter on CPU tensors
(exact, slow: parity only, never timed). ``torch_impl.ops`` holds the torch launchers of ``triton_impl``'s kernels.
"""

from __future__ import annotations

from triton_impl import env as _triton_env

_triton_env.choose()
