"""Counting the collectives a JAX TP step issues, and their bytes, off XLA's compiled HLO: what ``TPParts.collectives``
reports and what the comm-only twin (``jax_impl.tp_common.comm_twin``) replays.

:func:`hlo_collectives` lists every collective op of a compiled HLO module in order (its kind, its operands'
``(type, dims)``); :func:`count_collectives` sums them per kind into :class:`~compare.backends.tp.Collective` lines
(ops, payload bytes over every operand, what XLA's combiner merged). Kinds are HLO's names (:data:`COLLECTIVES`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from compare.backends.tp import Collective
from jax_impl import profiling

#: HLO collectives counted per step (``-start`` is the async form of the same op; its ``-done`` is not counted).
COLLECTIVES: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"\b(?P<t>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(m["t"], tuple(int(d) for d in m["dims"].split(",") if d)) for m in _ARRAY.finditer(text)]


def _nbytes(arrays: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    return sum(_ITEMSIZE.get(t, 4) * math.prod(dims) for t, dims in arrays)


def _fmt(arrays: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    names = [f"{t}[{','.join(map(str, d))}]" for t, d in arrays]
    if len(names) > 1 and len(set(names)) == 1:
        return f"{len(names)} x {names[0]}"
    return " + ".join(names)


def hlo_collectives(hlo_text: str) -> list[dict[str, Any]]:
    """Every collective op of a compiled HLO module: ``{"kind", "operands": [(type, dims), ...]}``, in order.

    All-reduce operands are read off the op's result shape (the same as its operands'; a tuple when XLA's combiner
    merged several); other kinds off the operand list."""
    module = profiling.parse_hlo(hlo_text)
    found = []
    for instructions in module.computations.values():
        for ins in instructions:
            kind = ins.opcode.removesuffix("-start")
            if kind not in COLLECTIVES:
                continue
            operands = _arrays(ins.shape) if kind == "all-reduce" else _arrays(ins.rest.split(")", 1)[0])
            found.append({"kind": kind, "operands": operands})
    return found


def count_collectives(hlo_text: str) -> list[Collective]:
    """The collectives of one step, per kind: ops, payload bytes (summed over every operand), what was merged."""
    by_kind: dict[str, list[list[tuple[str, tuple[int, ...]]]]] = {}
    for op in hlo_collectives(hlo_text):
        by_kind.setdefault(op["kind"], []).append(op["operands"])
    out = []
    for kind, ops in by_kind.items():
        parts = []
        for operands in ops:
            what = _fmt(operands)
            parts.append(f"one tuple {kind} of {what}" if len(operands) > 1 else f"one {kind} of {what}")
        out.append(
            Collective(kind, len(ops), sum(_nbytes(o) for o in ops), source="compiled HLO", detail="; ".join(parts))
        )
    return out
