"""Markdown building blocks shared by every report section: tables, number formats and a case label."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from compare.cases import Shape

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


def fmt_e(x: float | None) -> str:
    """A number in scientific notation, 3 significant digits; None is ``-``."""
    return "-" if x is None else f"{x:.2e}"


class Labelled(Protocol):
    """What :func:`case_label` needs of a result: its model and shape."""

    @property
    def model(self) -> str: ...

    @property
    def shape(self) -> Shape: ...


def case_label(r: Labelled) -> str:
    """``geglu 3x37x96->328`` for a result (its model and shape)."""
    return f"{r.model} {r.shape.label()}"
