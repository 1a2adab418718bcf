"""``## Kernels per step``: the kernel summaries of a results document as a markdown table (pure; the summary
schema and its helpers are in ``compare.kernels``)."""

from __future__ import annotations

from typing import Any

from compare.kernels import KINDS, op_name

#: The most absorbed ops listed per fused kernel in the report (the JSON keeps them all).
MAX_ABSORBED_SHOWN = 10


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _code(s: str) -> str:
    return f"`{_cell(s)}`"


def _times(n: int) -> str:
    return "" if n == 1 else f" x{n}"


def _case(r: dict[str, Any]) -> str:
    s = r.get("shape")
    if isinstance(s, dict) and {"batch", "seq", "dim", "hidden"} <= set(s):
        return f"{r.get('model', '')} {s['batch']}x{s['seq']}x{s['dim']}->{s['hidden']}".strip()
    return str(r.get("case", ""))


def _kernels_cell(s: dict[str, Any]) -> str:
    groups: dict[str, list[str]] = {}
    for k in s["kernels"]:
        groups.setdefault(k["kind"], []).append(_code(k["short"]) + _times(k["count"]))
    return "; ".join(f"{kind}: {', '.join(groups[kind])}" for kind in KINDS if kind in groups) or "-"


def _absorbed_cell(s: dict[str, Any]) -> str:
    parts = []
    for k in s["kernels"]:
        ops = k.get("absorbed") or []
        if not ops or (k["kind"] != "fused" and len(ops) < 2):
            continue
        shown = " + ".join(_cell(o) for o in ops[:MAX_ABSORBED_SHOWN])
        more = f" + {len(ops) - MAX_ABSORBED_SHOWN} more" if len(ops) > MAX_ABSORBED_SHOWN else ""
        parts.append(f"{_code(k['short'])}: {shown}{more}")
    return "<br>".join(parts) or "-"


def _metadata_cell(s: dict[str, Any]) -> str:
    ops = [f"{_cell(op_name(m['name']))}{_times(m['count'])}" for m in s["metadata_ops"] if m["count"]]
    return ", ".join(ops) or "-"


def _counted_by(s: dict[str, Any]) -> str:
    steps = s.get("steps")
    over = "" if steps is None else f" over {steps} profiled step{'s' if steps != 1 else ''}"
    return f"{s.get('source', '')}{over} ({s.get('device', '')})"


def kernel_section(doc: dict[str, Any]) -> str:
    """``## Kernels per step``: one row per (backend, case, dtype, mode) whose result has a kernel summary.

    Built only from ``doc["results"]`` (each result's ``"kernels"`` summary, or None); "" when no result has one.
    Shows kernels per step, the kernel names (short) grouped by kind with counts, the ops each fused kernel
    absorbed, and the metadata-only ops (no kernel launched) counted apart. Pure and deterministic.
    """
    rows, notes = [], []
    for r in doc.get("results", []):
        s = r.get("kernels")
        if not s:
            continue
        label = f"{r.get('backend', '')} {_case(r)} {r.get('dtype', '')} {r.get('mode', '')}"
        rows.append(
            [
                _cell(str(r.get("backend", ""))),
                _cell(_case(r)),
                _cell(str(r.get("dtype", ""))),
                _cell(str(r.get("mode", ""))),
                _counted_by(s),
                str(s.get("kernels_per_step", sum(k["count"] for k in s.get("kernels", [])))),
                _kernels_cell(s),
                _absorbed_cell(s),
                _metadata_cell(s),
            ]
        )
        if s.get("notes"):
            notes.append(f"- {_cell(label)}: {_cell(s['notes'])}")
    if not rows:
        return ""
    header = [
        "backend",
        "case",
        "dtype",
        "mode",
        "counted by",
        "kernels/step",
        "kernels (per step)",
        "fused kernel: ops absorbed",
        "metadata ops (no kernel)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    intro = (
        "Kernels launched by one step. torch: counted by `torch.profiler` over the steps each row names, "
        "divided by their number (on CUDA the device "
        "kernels, memcpys and memsets; on CPU the leaf ops that do work, e.g. `aten::mm` under `aten::linear`, "
        "and Inductor's C++ kernels). JAX: read from XLA's optimized HLO, one kernel per top-level fusion, "
        "custom call or op. A fused kernel lists the ops it absorbed; view-like ops that launch nothing "
        "(transposes, reshapes, bitcasts) are counted apart."
    )
    return "## Kernels per step\n\n" + intro + "\n\n" + "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")
