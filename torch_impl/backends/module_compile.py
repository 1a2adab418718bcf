"""``torch-module-compile``: ``torch.compile`` of a user's own MLP file's module (``torch-compile``'s backend,
:class:`~torch_impl.backends.compiled.CompileBackend`, on the module ``torch-module`` runs)."""

from __future__ import annotations

from torch_impl.backends.compiled import CompileBackend
from torch_impl.backends.module_eager import build

BACKEND = CompileBackend("torch-module-compile", build=build)
