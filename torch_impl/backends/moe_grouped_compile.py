"""``torch-moe-grouped-compile``: ``torch-moe-grouped``'s block (``torch_impl.moe_ops.moe_grouped``: assignments
sorted by expert, each expert GEMM one ``grouped_mm``) under ``torch.compile`` (Inductor, ``dynamic=False``,
``fullgraph=True``: its shapes are fixed by ``T * k`` and ``E``, whatever the routing)."""

from __future__ import annotations

import functools

from torch_impl import moe_ops
from torch_impl.backends.compiled import CompileBackend

BACKEND = CompileBackend(
    "torch-moe-grouped-compile", build=functools.partial(moe_ops.build, impl=moe_ops.moe_grouped), lazy_backward=True
)
