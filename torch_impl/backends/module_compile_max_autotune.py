"""``torch-module-compile-max-autotune``: ``torch-module-compile`` with ``mode="max-autotune-no-cudagraphs"``
(``torch_impl.backends.compiled_max_autotune`` says what that mode does, on a CPU and on a GPU), on a user's own MLP
file's module."""

from __future__ import annotations

from torch_impl.backends.compiled import CompileBackend
from torch_impl.backends.module_eager import build

BACKEND = CompileBackend("torch-module-compile-max-autotune", mode="max-autotune-no-cudagraphs", build=build)
