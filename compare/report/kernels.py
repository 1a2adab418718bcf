"""``## Kernels per step``: the kernel summaries of a results document as a markdown table (pure; the summary
types and their helpers are in ``compare.kernels.summary``)."""

from __future__ import annotations

from compare.formats.markdown import table
from compare.kernels.names import op_name
from compare.kernels.summary import KINDS, Kernels
from compare.report.cells import LEAD, lead
from compare.results.document import Results

#: The most absorbed ops listed per fused kernel in the report (the JSON keeps them all).
MAX_ABSORBED_SHOWN = 10


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _code(s: str) -> str:
    return f"`{_cell(s)}`"


def _times(n: int) -> str:
    return "" if n == 1 else f" x{n}"


def _kernels_cell(s: Kernels) -> str:
    groups: dict[str, list[str]] = {}
    for k in s.kernels:
        groups.setdefault(k.kind, []).append(_code(k.short) + _times(k.count))
    return "; ".join(f"{kind}: {', '.join(groups[kind])}" for kind in KINDS if kind in groups) or "-"


def _absorbed_cell(s: Kernels) -> str:
    parts = []
    for k in s.kernels:
        ops = k.absorbed
        if not ops or (k.kind != "fused" and len(ops) < 2):
            continue
        shown = " + ".join(_cell(o) for o in ops[:MAX_ABSORBED_SHOWN])
        more = f" + {len(ops) - MAX_ABSORBED_SHOWN} more" if len(ops) > MAX_ABSORBED_SHOWN else ""
        parts.append(f"{_code(k.short)}: {shown}{more}")
    return "<br>".join(parts) or "-"


def _metadata_cell(s: Kernels) -> str:
    ops = [f"{_cell(op_name(m.name))}{_times(m.count)}" for m in s.metadata_ops if m.count]
    return ", ".join(ops) or "-"


def _counted_by(s: Kernels) -> str:
    over = "" if s.steps is None else f" over {s.steps} profiled step{'s' if s.steps != 1 else ''}"
    return f"{s.source}{over} ({s.device})"


def kernel_section(doc: Results) -> str:
    """``## Kernels per step``: one row per (backend, case, dtype, mode) whose result has a kernel summary ("" when
    none has): kernels per step, the kernel names (short) grouped by kind with counts, the ops each fused kernel
    absorbed, and the metadata-only ops (no kernel launched) counted apart."""
    rows, notes = [], []
    for r in doc.results:
        s = r.kernels
        if s is None:
            continue
        rows.append(
            [
                *map(_cell, lead(r)),
                _counted_by(s),
                str(s.kernels_per_step),
                _kernels_cell(s),
                _absorbed_cell(s),
                _metadata_cell(s),
            ]
        )
        if s.notes:
            notes.append(f"- {_cell(' '.join(lead(r)))}: {_cell(s.notes)}")
    if not rows:
        return ""
    header = [
        *LEAD,
        "counted by",
        "kernels/step",
        "kernels (per step)",
        "fused kernel: ops absorbed",
        "metadata ops (no kernel)",
    ]
    intro = (
        "Kernels launched by one step. torch: counted by `torch.profiler` over the steps each row names, "
        "divided by their number (on CUDA the device "
        "kernels, memcpys and memsets; on CPU the leaf ops that do work, e.g. `aten::mm` under `aten::linear`, "
        "and Inductor's C++ kernels). JAX: read from XLA's optimized HLO, one kernel per top-level fusion, "
        "custom call or op. A fused kernel lists the ops it absorbed; view-like ops that launch nothing "
        "(transposes, reshapes, bitcasts) are counted apart."
    )
    return (
        "## Kernels per step\n\n" + intro + "\n\n" + table(header, rows) + ("\n\n" + "\n".join(notes) if notes else "")
    )
