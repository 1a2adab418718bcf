"""Kernel names short enough for a report's table cell (:func:`shorten`): namespaces, C++ argument lists and template
noise dropped, the meaningful part kept. Pure."""

from __future__ import annotations

import re

#: Longest shortened kernel name.
SHORT_WIDTH = 48

#: Namespaces dropped by :func:`shorten` (longest first).
_NAMESPACES = ("at::native::", "at::cuda::", "at::", "c10::", "cutlass::", "aten::", "void ")


def _drop_call_args(s: str) -> str:
    """``f<...>(int, T)`` -> ``f<...>``: remove a trailing balanced ``(...)`` argument list."""
    s = s.rstrip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(s[i], 0)
        if depth == 0:
            return s[:i].rstrip() if i > 0 else s
    return s


def _split_template(s: str) -> tuple[str, list[str]] | None:
    """``base<a, b<c>, d>`` -> ``("base", ["a", "b<c>", "d"])``; None without a template argument list."""
    lt = s.find("<")
    if lt <= 0 or not s.endswith(">"):
        return None
    args: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s[lt + 1 : -1]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    args.append("".join(cur).strip())
    return s[:lt], args


_GENERIC_FUNCTORS = frozenset(
    {
        "BinaryFunctor",
        "AUnaryFunctor",
        "BUnaryFunctor",
        "UnaryFunctor",
        "ReduceOp",
        "OffsetCalculator",
        "LoadWithoutCast",
        "StoreWithoutCast",
    }
)
_FUNCTOR = re.compile(r"([A-Za-z_]\w*(?:Functor|functor|KernelImpl|Kernel|Op))\b")
#: cuBLAS kernel-name suffixes that say nothing about the GEMM itself.
_CUBLAS_NOISE = re.compile(r"(?:_execute)?(?:_segment_k_(?:on|off))?_kernel__\d+x_cublas$")


def shorten(name: str, width: int = SHORT_WIDTH) -> str:
    """A kernel name short enough for a table cell (at most ``width`` characters).

    Namespaces (``aten::``, ``at::native::``, ``void ``) and C++ call argument lists are dropped; a CUTLASS
    ``Kernel<...>`` wrapper becomes its first template argument; a PyTorch elementwise kernel keeps its functor
    (``vectorized_elementwise_kernel<MulFunctor>``); what is still too long keeps its head and its meaningful tail
    (tile shape, layout, alignment) around ``...``. Deterministic; short names come back unchanged.
    """
    s = " ".join(name.split())
    s = _drop_call_args(s)
    for ns in _NAMESPACES:
        if s.startswith(ns):
            s = s[len(ns) :]
    parts = _split_template(s)
    if parts is not None:
        base, args = parts
        base_leaf = base.rsplit("::", 1)[-1]
        if base_leaf in ("Kernel", "Kernel2", "device_kernel", "kernel") and args:
            s = args[0]
        else:
            functors = [f for f in _FUNCTOR.findall(", ".join(args)) if f not in _GENERIC_FUNCTORS]
            s = f"{base_leaf}<{functors[-1]}>" if functors else base_leaf
        s = _drop_call_args(s)
    for ns in _NAMESPACES:
        s = s.replace(ns, "")
    s = _CUBLAS_NOISE.sub("", s)
    if len(s) <= width:
        return s
    head = (width - 3) * 2 // 5
    tail = width - 3 - head
    return s[:head] + "..." + s[-tail:]
