"""The GPU build table: per-architecture limits, occupancy arithmetic, a row from a build record, and the rows that
break the autotune rule: the layout of ``gpu_build.json``, which ``compare.report.gpu_build`` renders.

``triton_impl.gpu_build`` compiles every Triton kernel the registered backends launch for NVIDIA targets with
Triton's own compiler and its bundled ``ptxas``/``cuobjdump`` -- no GPU needed -- and returns one build record per
(kernel, launch, config, dtype, arch): what the compiler allocated. This module is the torch-free, triton-free half:
it knows the hardware limits, turns a record into a row of ``gpu_build.json`` (:func:`make_row`: shared memory
against the per-block limit, registers and shared memory into resident warps per SM) and finds the rows that break
the autotune rule. Everything here is a pure function of its arguments.

A row (``data["rows"][i]``) has: ``kernel`` (the Triton function's name, as in profiler traces), ``kernel_id``,
``launch`` (which of the product's launches; its argument layout decides Triton's specialisation), ``config``
(``BLOCK_*``/``GROUP_M`` constants plus ``num_warps``/``num_stages``), ``config_label``, ``origin`` (``autotune``:
an entry of the kernel's autotune list; ``fixed``: the one launch config of an elementwise kernel; ``override``:
asked for on the command line), ``dtype``, ``arch``, ``ok``, ``error`` (the compiler's message when ``ok`` is
false, or why the build produced no record) and, when ok: ``registers`` (per thread),
``spill_stores``/``spill_loads``/``stack_frame`` (bytes per thread, from ``ptxas -v``), ``local_bytes``/
``static_shared`` (from ``cuobjdump -res-usage``), ``dynamic_shared`` (Triton's metadata), ``shared_bytes`` (static
+ dynamic, per block), ``shared_limit``, ``tensor_cores`` (``wgmma``/``mma``/``none``) with
``tensor_core_instructions`` (count in the PTX), ``occupancy`` (see :func:`occupancy`); and ``compile_s`` when a
compile ran.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ARCHS",
    "SCHEMA_VERSION",
    "SIXTEEN_BIT",
    "ArchLimits",
    "config_label",
    "findings",
    "first_line",
    "make_row",
    "occupancy",
    "row_problems",
]

#: Version of the ``gpu_build.json`` layout; bumped when a field changes meaning.
SCHEMA_VERSION = 1

#: The dtypes whose GEMMs are the headline: any autotune config that spills or overflows shared memory in one of
#: these on sm_90 must leave the autotune list (or carry a comment with its numbers).
SIXTEEN_BIT: tuple[str, ...] = ("bfloat16", "float16")


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM and per-block limits of one compute capability, in the units the occupancy arithmetic uses.

    Sources (CUDA C++ Programming Guide, "Compute Capabilities" -> "Features and Technical Specifications", the
    table "Technical Specifications per Compute Capability"; NVIDIA Ampere and Hopper Tuning Guides, "Occupancy"
    / "Shared Memory"; CUDA Occupancy Calculator for the allocation units):

    * 64 Ki 32-bit registers per SM (8.0 and 9.0), at most 255 per thread; registers are allocated per warp in
      units of 256 (a thread using ``r`` registers costs its warp ``ceil(32 r / 256) * 256``).
    * at most 64 resident warps and 32 resident blocks per SM (8.0 and 9.0).
    * shared memory per SM: 164 KB on 8.0 (A100: 167936 B), 228 KB on 9.0 (H100/H200: 233472 B); per block at
      most 163 KB = 166912 B on 8.0 and 227 KB = 232448 B on 9.0 (opt-in above 48 KB through
      ``cudaFuncAttributeMaxDynamicSharedMemorySize``, which Triton's launcher does); the driver reserves 1 KB
      (1024 B) of shared memory per resident block on both.
    """

    name: str
    capability: int
    gpus: str
    regs_per_sm: int = 65536
    reg_alloc_unit: int = 256  # registers, allocated per warp
    max_regs_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 0  # bytes
    smem_per_block: int = 0  # bytes, opt-in maximum for one block (static + dynamic)
    smem_reserved_per_block: int = 1024  # bytes, taken by the driver for every resident block
    tensor_core_instruction: str = ""  # the PTX instruction a bf16/fp16 tl.dot should become


ARCHS: dict[str, ArchLimits] = {
    "sm_90": ArchLimits(
        name="sm_90", capability=90, gpus="H100/H200 (Hopper)",
        smem_per_sm=228 * 1024,  # 233472 B
        smem_per_block=227 * 1024,  # 232448 B
        tensor_core_instruction="wgmma",
    ),
    "sm_80": ArchLimits(
        name="sm_80", capability=80, gpus="A100 (Ampere)",
        smem_per_sm=164 * 1024,  # 167936 B
        smem_per_block=163 * 1024,  # 166912 B
        tensor_core_instruction="mma",
    ),
}  # fmt: skip


def occupancy(arch: ArchLimits, registers: int, num_warps: int, shared_bytes: int) -> dict[str, Any]:
    """Theoretical occupancy of a kernel on one SM: resident blocks and warps, and what limits them.

    Args:
        arch: the target's limits.
        registers: registers per thread (``ptxas``'s "Used N registers").
        num_warps: warps per block (Triton's ``num_warps``).
        shared_bytes: shared memory per block in bytes (static + dynamic, without the driver's 1 KB reserve).

    Returns:
        ``{"blocks": b, "warps": b * num_warps, "fraction": warps / max_warps, "limited_by": name,
        "blocks_by": {"registers": ..., "shared": ..., "warps": ..., "blocks": ...}}``. ``limited_by`` names every
        limit that attains the minimum, joined by ``+``. A block that cannot be resident at all (more shared memory
        than one block may have, or more registers than the SM has) gives 0 blocks.

    Example (sm_90): 255 registers -> 32 * 255 = 8160, rounded up to 8192 registers per warp, so 65536 / 8192 = 8
    warps fit; with 8-warp blocks that is 1 block (8 warps, 12.5 %), limited by registers.
    """
    if registers < 0 or num_warps < 1 or shared_bytes < 0:
        raise ValueError(
            f"occupancy needs registers >= 0, num_warps >= 1, shared >= 0; got {registers}, {num_warps}, {shared_bytes}"
        )
    regs_per_warp = math.ceil(32 * registers / arch.reg_alloc_unit) * arch.reg_alloc_unit
    warps_by_regs = arch.regs_per_sm // regs_per_warp if regs_per_warp else arch.max_warps_per_sm
    if shared_bytes > arch.smem_per_block:
        blocks_by_smem = 0
    else:
        blocks_by_smem = arch.smem_per_sm // (shared_bytes + arch.smem_reserved_per_block)
    blocks_by = {
        "registers": warps_by_regs // num_warps,
        "shared": blocks_by_smem,
        "warps": arch.max_warps_per_sm // num_warps,
        "blocks": arch.max_blocks_per_sm,
    }
    blocks = min(blocks_by.values())
    warps = blocks * num_warps
    return {
        "blocks": blocks,
        "warps": warps,
        "fraction": warps / arch.max_warps_per_sm,
        "limited_by": "+".join(k for k, v in blocks_by.items() if v == blocks),
        "blocks_by": blocks_by,
    }


#: The fields of a build record (``triton_impl.gpu_build.compiler.build``) that a row carries over, in order.
_MEASURED = (
    "registers", "stack_frame", "spill_stores", "spill_loads", "local_bytes", "static_shared", "dynamic_shared",
    "shared_bytes",
)  # fmt: skip


def config_label(config: Mapping[str, Any]) -> str:
    """``128x128x64 w8 s3`` for a GEMM config (`` g4`` after the tile when ``GROUP_M`` is not 8), ``BLOCK=1024 w4
    s3`` for an elementwise one."""
    if "BLOCK_M" in config:
        tile = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}"
        if config.get("GROUP_M", 8) != 8:
            tile += f" g{config['GROUP_M']}"
    else:
        tile = " ".join(f"{k}={v}" for k, v in config.items() if k not in ("num_warps", "num_stages"))
    return f"{tile} w{config['num_warps']} s{config['num_stages']}"


def make_row(job: Mapping[str, Any], record: Mapping[str, Any] | None, reason: str = "") -> dict[str, Any]:
    """The ``gpu_build.json`` row of one job from its build record (see the module docstring for the fields).

    Args:
        job: ``function``, ``kernel_id``, ``launch``, ``config``, ``origin``, ``dtype``, ``arch`` (a key of
            :data:`ARCHS`).
        record: the worker's record (``ok``, ``error``, ``compile_s`` and the measured fields when ok); None when
            the job produced none.
        reason: with ``record`` None, why not (a worker that died, a timeout): the row's error is ``not built: ...``.
    """
    out: dict[str, Any] = {
        "kernel": job["function"], "kernel_id": job["kernel_id"], "launch": job["launch"], "config": job["config"],
        "config_label": config_label(job["config"]), "origin": job["origin"], "dtype": job["dtype"],
        "arch": job["arch"], "ok": False,
    }  # fmt: skip
    if record is None:
        out["error"] = f"not built: {reason or 'no build record'}"
        return out
    out["error"] = record["error"]
    if record["ok"]:
        arch = ARCHS[job["arch"]]
        out.update({k: record[k] for k in _MEASURED}, ok=True, shared_limit=arch.smem_per_block)
        out.update(
            tensor_cores=record["tensor_cores"],
            tensor_core_instructions=record["tensor_core_instructions"],
            occupancy=occupancy(arch, record["registers"], job["config"]["num_warps"], record["shared_bytes"]),
        )
    out["compile_s"] = record["compile_s"]
    return out


def row_problems(row: Mapping[str, Any]) -> list[str]:
    """What is wrong with one build row: a compile error, spills, shared memory over the per-block limit.

    Returns short phrases with the numbers (empty when the row is clean), e.g.
    ``["spills 992 B stores / 992 B loads per thread"]``.
    """
    if not row.get("ok"):
        return [f"does not compile: {first_line(row.get('error'))}"]
    out = []
    if row.get("spill_stores") or row.get("spill_loads"):
        out.append(f"spills {row['spill_stores']} B stores / {row['spill_loads']} B loads per thread")
    if row.get("shared_bytes", 0) > row.get("shared_limit", math.inf):
        out.append(f"needs {row['shared_bytes']} B shared memory > {row['shared_limit']} B per block")
    return out


def findings(
    data: Mapping[str, Any],
    arch: str = "sm_90",
    dtypes: Sequence[str] = SIXTEEN_BIT,
    origins: Iterable[str] = ("autotune",),
) -> list[tuple[Mapping[str, Any], list[str]]]:
    """Rows of ``data`` for ``arch`` and ``dtypes`` whose origin is in ``origins`` and that have a problem.

    The autotune rule of the project: ``findings(data)`` (16-bit autotune configs on sm_90) must be empty, or each
    remaining config carries a comment with its numbers beside its autotune list (its kernel module).
    """
    origins = set(origins)
    out = []
    for row in data.get("rows", []):
        if row["arch"] == arch and row["dtype"] in dtypes and row.get("origin") in origins:
            problems = row_problems(row)
            if problems:
                out.append((row, problems))
    return out


def first_line(text: str | None, limit: int = 160) -> str:
    """The most telling line of a compiler message (the last non-empty one), cut to ``limit`` characters."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = lines[-1] if lines else "(no message)"
    return line if len(line) <= limit else line[: limit - 3] + "..."
