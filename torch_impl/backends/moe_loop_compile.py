"""``torch-moe-loop-compile``: ``torch-moe-loop``'s block (``torch_impl.moe_ops.moe_loop``: a Python loop over the
experts that have tokens) under ``torch.compile`` (Inductor). The loop's trip count and each
expert's rows depend on the routing (``torch.unique(experts).tolist()``, ``torch.where``), so Dynamo breaks the graph
there (``fullgraph=False``): the router is one compiled graph, each expert's step (gather, two linears, activation,
``index_add_``) another, and the loop itself runs in Python. Each expert's row count differs, so the step is
compiled with dynamic sizes (``dynamic=None``: static at its first shape, dynamic from the second on; with
``dynamic=False`` Dynamo hit its recompile limit of 8 on mixtral-cpu and ran the rest eager)."""

from __future__ import annotations

import functools

from torch_impl import moe_ops
from torch_impl.backends.compiled import CompileBackend

BACKEND = CompileBackend(
    "torch-moe-loop-compile",
    build=functools.partial(moe_ops.build, impl=moe_ops.moe_loop),
    fullgraph=False,
    dynamic=None,
    lazy_backward=True,
)
