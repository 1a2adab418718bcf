"""Markdown building blocks shared by every report section: tables, number formats (seconds, SI prefixes), a
case label."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

Row = list[str]


def table(header: Row, rows: Iterable[Row]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def fmt_s(s: float | None) -> str:
    """Seconds with a unit that keeps 3 significant digits readable."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def si(x: float | None, unit: str) -> str:
    """``x`` with a decimal SI prefix and 3 significant digits, e.g. ``38.7 GFLOP``, ``50.3 MB``; None is ``-``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def fmt_e(x: float | None) -> str:
    """A number in scientific notation, 3 significant digits; None is ``-``."""
    return "-" if x is None else f"{x:.2e}"


class _Shape(Protocol):
    def label(self) -> str: ...


class Labelled(Protocol):
    """What :func:`case_label` needs of a result: its model and a shape that labels itself
    (``compare.problem.cases.Shape``)."""

    @property
    def model(self) -> str: ...

    @property
    def shape(self) -> _Shape: ...


def case_label(r: Labelled) -> str:
    """``geglu 3x37x96->328`` for a result (its model and shape)."""
    return f"{r.model} {r.shape.label()}"
