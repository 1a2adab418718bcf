"""The report's section on what a pass means: the gate's resolution rows (``compare.gate.resolution``) as markdown."""

from __future__ import annotations

from collections.abc import Iterable

from compare.formats.markdown import table
from compare.gate.resolution import NOT_MEASURED, ResolutionRow

#: The section's title.
RESOLUTION = "What a pass means: the gate's resolution"


def _pct(s: float | None, note: str) -> str:
    if s is None:
        return note if note == NOT_MEASURED else f"none ({note})"
    text = f"{s:.2g}" if s < 1e-4 else f"{s * 100:.2g}%"
    return f"< {text}" if note == "below" else f">= {text}"


def resolution_section(rows: Iterable[ResolutionRow]) -> str:
    """Markdown: what a pass means, per case, dtype and tensor (a results document's ``resolution``)."""
    rows = list(rows)
    if not rows:
        return ""
    body = []
    for r in rows:
        if r.erf_distinguishable is None:
            erf = "- (no GELU)"
        elif r.erf_distinguishable:
            erf = f"distinguishable (fails: {', '.join(r.erf_failed)})"
        else:
            erf = "**not distinguishable**"
        body.append(
            [
                r.label,
                r.dtype,
                r.tensor,
                f"{r.n:,}",
                _pct(r.scale_resolution, r.note),
                erf,
                "-" if r.erf_rel_rms is None else f"{r.erf_rel_rms:.2g}",
            ]
        )
    head = [
        "case",
        "dtype",
        "tensor",
        "elements",
        "catches a scale error of",
        "erf vs tanh GELU",
        "erf vs tanh, relative rms difference (float64)",
    ]
    intro = (
        "What a pass means. Measured with the gate itself on the golden data (numpy): the smallest relative "
        "scale error that takes a tensor out of the pass tier, made as a backend makes it (the plain "
        "computation's output before its last rounding, made too small by that fraction, then rounded to the "
        "dtype), found by bisection; and whether the plain computation with the exact (erf) GELU, instead of the "
        "tanh form, leaves the pass tier. A smaller scale error, or the other GELU form where it is not "
        "distinguishable, can pass."
    )
    return f"## {RESOLUTION}\n\n" + intro + "\n\n" + table(head, body)
