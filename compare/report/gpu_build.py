"""The GPU build's section: ``gpu_build.json`` (its layout in ``compare.results.gpu_build``) rendered as a
self-contained markdown section (``GPU_BUILD.md``, and the report's GPU build table). Pure: the same JSON gives the
same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compare.formats.markdown import table
from compare.results.gpu_build import ARCHS, SCHEMA_VERSION, findings, first_line, row_problems


def _cell_spills(row: Mapping[str, Any]) -> str:
    st, ld = row.get("spill_stores"), row.get("spill_loads")
    if st is None and ld is None:
        return "-"
    text = f"{st} / {ld}"
    return f"**{text}**" if st or ld else text


def _cell_shared(row: Mapping[str, Any]) -> str:
    used, limit = row.get("shared_bytes"), row.get("shared_limit")
    if used is None or not limit:
        return "-"
    text = f"{used:,} ({100 * used / limit:.0f} %)"
    return f"**{text} > limit**" if used > limit else text


def _cell_occupancy(row: Mapping[str, Any]) -> str:
    occ = row.get("occupancy")
    if not occ:
        return "-"
    return f"{occ['warps']} ({occ['blocks']} x {row['config']['num_warps']}), {occ['limited_by']}"


def _row_cells(row: Mapping[str, Any]) -> list[str]:
    head = [row["kernel"], row.get("launch", "-"), row["config_label"], row["dtype"]]
    if not row.get("ok"):
        return [*head, "-", "-", "-", "-", "-", "-", f"**error**: {first_line(row.get('error'))}"]
    tc = row.get("tensor_cores", "none")
    n_tc = row.get("tensor_core_instructions", 0)
    return [
        *head,
        str(row["registers"]),
        _cell_spills(row),
        "-" if (stack := row.get("stack_frame")) is None else f"{stack:,}",
        _cell_shared(row),
        tc if tc == "none" else f"{tc} ({n_tc})",
        _cell_occupancy(row),
        "; ".join(row_problems(row)) or "ok",
    ]


_HEADER = [
    "kernel", "launch", "config (BMxBNxBK wW sS)", "dtype", "regs/thread", "spill st / ld (B)", "stack (B)",
    "shared/block (B, % of limit)", "tensor cores (PTX instrs)", "occupancy: warps/SM (blocks x warps), limit",
    "status",
]  # fmt: skip


def render_markdown(data: Mapping[str, Any]) -> str:
    """``GPU_BUILD.md``: the build table of ``gpu_build.json`` as a markdown section, readable on its own.

    One table per architecture, rows in the JSON's order, then the findings for the autotune rule. Pure: the same
    JSON gives the same text.
    """
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"gpu_build.json schema {data.get('schema')!r}; this renderer reads {SCHEMA_VERSION}")
    rows = data.get("rows", [])
    archs = list(dict.fromkeys(r["arch"] for r in rows)) or list(data.get("archs", []))
    lines = [
        "## GPU build (compiled without a GPU)",
        "",
        f"Every hand-written Triton kernel, every autotune config, every dtype, compiled by Triton "
        f"{data.get('triton_version', '?')} for {', '.join(archs) or 'no architecture'} with its bundled `ptxas`; "
        "registers and spills (bytes per thread) from `ptxas -v`; shared memory per block = Triton's dynamic "
        "allocation + the cubin's static section (`cuobjdump -res-usage`: 1,024 B in sm_90 GEMMs), checked against "
        "the per-block opt-in limit. No kernel ran: the numbers are what the compiler allocated, and occupancy is "
        "the theoretical one from registers, shared memory (plus the driver's reserve per block) and the per-SM "
        "warp and block limits.",
        "",
    ]
    if data.get("specialization"):
        lines += [f"Launch modelled: {data['specialization']}", ""]
    for arch in archs:
        limits = ARCHS.get(arch)
        arch_rows = [r for r in rows if r["arch"] == arch]
        n_err = sum(not r.get("ok") for r in arch_rows)
        lines += [f"### {arch}" + (f": {limits.gpus}" if limits else ""), ""]
        if limits:
            lines += [
                f"Limits: {limits.regs_per_sm} registers/SM (allocated per warp in units of "
                f"{limits.reg_alloc_unit}), {limits.max_warps_per_sm} warps and {limits.max_blocks_per_sm} blocks per "
                f"SM, shared memory {limits.smem_per_sm:,} B/SM and {limits.smem_per_block:,} B/block "
                f"(+{limits.smem_reserved_per_block} B reserved per block); bf16/fp16 dots should use "
                f"`{limits.tensor_core_instruction}`.",
                "",
            ]
        lines += [
            f"{len(arch_rows)} builds, {len(arch_rows) - n_err} compiled, {n_err} failed.",
            "",
            table(_HEADER, (_row_cells(r) for r in arch_rows)),
            "",
        ]
    bad = findings(data)
    lines += ["### Autotune rule (bf16/fp16 on sm_90: no spills, shared memory within the limit)", ""]
    if not any(r["arch"] == "sm_90" for r in rows):
        lines.append("Not checked: sm_90 was not built.")
    elif not bad:
        lines.append("Holds: no bf16/fp16 autotune config spills or exceeds shared memory on sm_90.")
    else:
        lines += ["Violated (remove these configs or justify them in the autotune list's comments):", ""]
        lines += [
            f"* {r['kernel']} [{r.get('launch', '-')}] {r['config_label']} {r['dtype']}: {'; '.join(p)}" for r, p in bad
        ]
    lines.append("")
    return "\n".join(lines)
