"""A checkpoint's layers side by side (``--weights ... --layers``): where a port starts to drift. A pure function of
the document.

Each layer is its own case (``Weights.layer``), judged against its own golden. With results of two layers or more,
REPORT.md gets ``## Layers``: per backend where it first leaves the pass line (the first layer whose verdict is not
a pass), then one row per layer and backend (and dtype, mode, token count) with its status, its worst gate statistic
(the parity record's ``worst_ratio``: the check that came closest to, or went furthest past, its pass line, as a
multiple of that line; above 1 deviates or fails) and its median time per call; and a link to the plot of the worst
statistic against the layer index (``compare.report.plots``, ``layers-<model>-d<dim>-h<hidden>.png``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from compare.formats.markdown import fmt_s, table
from compare.results.document import Result, Results

#: The stem of the layer plot's file name (``compare.report.plots``): its kind.
PLOT_KIND = "layers"


def layer_of(r: Result) -> int | None:
    """The layer index of a result's case (its weights'), None for a case of no ``--layers`` run."""
    return r.weights.layer if r.weights is not None else None


def layer_rows(results: Sequence[Result]) -> list[Result]:
    """The results of ``--layers`` cases, when they hold two layers or more (else none): what the section and the
    plot show."""
    rows = [r for r in results if layer_of(r) is not None]
    return rows if len({layer_of(r) for r in rows}) >= 2 else []


def worst_ratio(r: Result) -> float | None:
    """A result's worst gate statistic as a multiple of its pass line; None where it was not judged."""
    p = r.parity
    return None if p is None or math.isnan(p.worst_ratio) else p.worst_ratio


def ratio_cell(r: Result) -> str:
    """``0.31 (dx)``: the worst statistic and its tensor; ``-`` where not judged."""
    x = worst_ratio(r)
    if x is None:
        return "-"
    tensor = f" ({r.parity.worst_tensor})" if r.parity is not None and r.parity.worst_tensor else ""
    return ("inf" if math.isinf(x) else f"{x:.3g}") + tensor


def _drift(rows: list[Result]) -> str:
    """Per backend (in order of first appearance): the first layer whose verdict is not a pass, or that every layer
    passes with its largest statistic."""
    out = []
    for b in dict.fromkeys(r.label for r in rows):
        mine = sorted((r for r in rows if r.label == b), key=lambda r: layer_of(r) or 0)
        bad = [r for r in mine if r.status != "ok"]
        judged = [r for r in mine if worst_ratio(r) is not None]
        if bad:
            r = bad[0]
            out.append(f"- `{b}`: first not a pass at layer {layer_of(r)} ({r.status}, worst {ratio_cell(r)})")
        elif judged:
            top = max(judged, key=lambda r: worst_ratio(r) or 0.0)
            out.append(
                f"- `{b}`: every layer passes; the worst statistic is {ratio_cell(top)} of its pass line, at layer "
                f"{layer_of(top)}"
            )
        else:
            out.append(f"- `{b}`: no layer judged")
    return "\n".join(out)


def layers_section(doc: Results) -> str:
    """``## Layers`` (see the module docstring); "" unless the results hold two layers or more."""
    rows = layer_rows(doc.results)
    if not rows:
        return ""
    several_tokens = len({r.shape.tokens for r in rows}) > 1
    order = {b: i for i, b in enumerate(dict.fromkeys(r.label for r in rows))}
    ordered = sorted(rows, key=lambda r: (layer_of(r) or 0, order[r.label], r.dtype, r.mode, r.shape.tokens))
    head = ["layer", "backend", "dtype", "mode", *(["tokens"] if several_tokens else []), "status"]
    head += ["worst statistic (x pass line)", "median time"]
    body = [
        [
            str(layer_of(r)),
            r.label,
            r.dtype,
            r.mode,
            *([str(r.shape.tokens)] if several_tokens else []),
            r.status,
            ratio_cell(r),
            fmt_s(r.timing.median_s) if r.timing is not None else "-",
        ]
        for r in ordered
    ]
    layers = sorted({layer_of(r) or 0 for r in rows})
    plots = [p for p in doc.plots if p.rsplit("/", 1)[-1].startswith(PLOT_KIND + "-")]
    plot = (
        " Plot: " + ", ".join(f"[{p.rsplit('/', 1)[-1]}]({p})" for p in plots) + " (each backend's worst statistic "
        "against the layer index)."
        if plots
        else ""
    )
    intro = (
        f"{len(layers)} layers of the checkpoint, each its own case with its own golden (the inputs drawn from the "
        "seed, the same for every layer). Where each backend first leaves the pass line, then one row per layer "
        "and backend: the verdict, the worst gate statistic as a multiple of its pass line (above 1 deviates or "
        f"fails; the tensor in brackets) and the median time per call.{plot}"
    )
    return "## Layers\n\n" + intro + "\n\n" + _drift(rows) + "\n\n" + table(head, body)
