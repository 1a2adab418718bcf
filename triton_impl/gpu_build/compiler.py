"""One build: a (kernel, launch, config, dtype, arch) job compiled by Triton for ``GPUTarget("cuda", cc, 32)`` down
to a cubin with the ``ptxas`` Triton bundles, and what the compiler allocated, read off its tools.

:func:`build` returns the job's build record: registers and spills (``ptxas -v``: Triton's own log, captured, or a
second ``ptxas -v`` run on the PTX), stack/local memory and static shared memory (``cuobjdump -res-usage``), dynamic
shared memory (the kernel's metadata) and the tensor-core instructions in the PTX (``wgmma`` on sm_90, ``mma`` on
sm_80). A compile that raises is a record with ``ok: False`` and the compiler's message. Hardware arithmetic
(limits, occupancy) is the compare side's (``compare.results.gpu_build``).

The parsers (:func:`parse_ptxas_log`, :func:`parse_res_usage`, :func:`tensor_core_instructions`) are pure; triton
is imported inside the functions that compile, so reading them costs no triton import.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triton_impl.gpu_build.catalogue import Kernel
from triton_impl.gpu_build.entry import DTYPES

__all__ = ["build", "parse_ptxas_log", "parse_res_usage", "specialize", "tensor_core_instructions"]

_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# Tensor-core instructions in the PTX: Hopper warpgroup MMA, Ampere-style warp MMA (either may be predicated).
_WGMMA = re.compile(r"^\s*(?:@%p\d+\s+)?wgmma\.mma_async", re.MULTILINE)
_MMA = re.compile(r"^\s*(?:@%p\d+\s+)?mma\.sync", re.MULTILINE)


def parse_ptxas_log(log: str) -> dict[str, int] | None:
    """``ptxas -v`` output -> ``{"registers", "stack_frame", "spill_stores", "spill_loads"}`` (bytes per thread).

    Example line pair: ``560 bytes stack frame, 556 bytes spill stores, 556 bytes spill loads`` and
    ``ptxas info    : Used 255 registers, used 1 barriers, ...``. None when the log has no such lines.
    """
    frame = _PTXAS_FRAME.search(log)
    regs = _PTXAS_REGS.search(log)
    if frame is None or regs is None:
        return None
    return {
        "registers": int(regs.group(1)),
        "stack_frame": int(frame.group(1)),
        "spill_stores": int(frame.group(2)),
        "spill_loads": int(frame.group(3)),
    }


def parse_res_usage(text: str) -> dict[str, int]:
    """``cuobjdump -res-usage`` output -> ``{"REG", "STACK", "SHARED", "LOCAL"}`` of the (single) kernel."""
    m = _RES_USAGE.search(text)
    if m is None:
        raise ValueError(f"no 'REG:.. STACK:.. SHARED:.. LOCAL:..' line in cuobjdump output: {text[-500:]!r}")
    return dict(zip(("REG", "STACK", "SHARED", "LOCAL"), map(int, m.groups()), strict=True))


def tensor_core_instructions(ptx: str) -> tuple[str, int]:
    """(``"wgmma"``, ``"mma"`` or ``"none"``, how many) tensor-core instructions the PTX holds."""
    n_wgmma, n_mma = len(_WGMMA.findall(ptx)), len(_MMA.findall(ptx))
    return ("wgmma" if n_wgmma else "mma" if n_mma else "none"), n_wgmma or n_mma


def specialize(
    fn: Any, ints: Mapping[str, int], dtype: str, config: Mapping[str, Any], fixed: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """(signature, constexprs, attrs) for ``triton.compiler.ASTSource``, as Triton's launcher would build them.

    ``ints`` are the launch's runtime integer arguments; constexprs come from ``config``, then ``fixed``; every other
    parameter must be a pointer (``*_ptr``), of element type ``dtype`` (``*_idx_ptr``: int32 indices), 16-byte aligned
    (torch's allocations are).

    Raises:
        KeyError: a parameter that neither the launch, the config nor ``fixed`` gives a value.
    """
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    divisible = [["tt.divisibility", 16]]
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            if p.name in config:
                value = config[p.name]
            elif p.name in fixed:
                value = fixed[p.name]
            else:
                raise KeyError(f"{fn.__name__}: no value for constexpr {p.name} in config {dict(config)}")
            signature[p.name] = "constexpr"
            constexprs[p.name] = value
        elif p.name in ints:
            value = ints[p.name]
            if value == 1:  # the launcher turns an int argument equal to 1 into a constant
                signature[p.name] = "constexpr"
                constexprs[p.name] = 1
                continue
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = divisible
        elif p.name.endswith("_idx_ptr"):  # an index table (row and tile indices): int32, whatever the dtype
            signature[p.name] = "*i32"
            attrs[(i,)] = divisible
        elif p.name.endswith("_ptr"):
            signature[p.name] = "*" + DTYPES[dtype]
            attrs[(i,)] = divisible
        else:
            raise KeyError(f"{fn.__name__}: no value for argument {p.name} in the launch; add it to GPU_BUILD")
    return signature, constexprs, attrs


def _bin_tool(name: str) -> str:
    import triton

    bundled = Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin" / name
    if bundled.exists():
        return str(bundled)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is neither bundled with triton ({bundled}) nor on PATH")
    return found


def _run_tool(cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {proc.stderr.strip()[-1000:]}")
    return proc.stdout + proc.stderr


def _ptxas_stats(ptx: str, capability: int, fp_fusion: bool, timeout: float) -> dict[str, int]:
    """Run ``ptxas -v`` on ``ptx`` (when Triton's own ptxas log was not captured): the ptxas Triton itself uses
    for ``capability`` (3.9 bundles two; the older one rejects its newer PTX), with the ``--gpu-name`` it passes
    (``sm_90a``: the ``a`` variant enables wgmma)."""
    from triton.backends.nvidia.compiler import get_ptxas

    gpu_name = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx, encoding="utf-8")
        fmad = [] if fp_fusion else ["--fmad=false"]
        cmd = [get_ptxas(capability).path, "-v", *fmad, f"--gpu-name={gpu_name}", str(src), "-o", f"{tmp}/k.o"]
        stats = parse_ptxas_log(_run_tool(cmd, timeout))
    if stats is None:
        raise RuntimeError("ptxas -v printed no register/spill line")
    return stats


def _res_usage(cubin: bytes, timeout: float) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return parse_res_usage(_run_tool([_bin_tool("cuobjdump"), "-res-usage", str(path)], timeout))


def build(kernel: Kernel, job: Mapping[str, Any], tool_timeout: float = 120.0) -> dict[str, Any]:
    """Compile one job of ``kernel`` and return its build record.

    ``job`` has ``key`` (echoed), ``launch`` (a key of the entry's launches), ``config`` (constexprs plus
    ``num_warps``/``num_stages``, maybe ``num_ctas``/``maxnreg``), ``dtype`` (a key of :data:`DTYPES`) and
    ``capability`` (90, 80). The record: ``key``, ``ok``, ``error`` (the exception's type and message when the
    compile raised: Triton's ``CompilationError`` text includes the offending source line, a ``ptxas`` failure its
    log), ``compile_s`` and, when ok, ``registers``, ``stack_frame``, ``spill_stores``, ``spill_loads`` (bytes per
    thread), ``local_bytes``, ``static_shared``, ``dynamic_shared``, ``shared_bytes`` (static + dynamic, per
    block), ``tensor_cores``, ``tensor_core_instructions``.

    A failure of the tools after a successful compile (cuobjdump missing, ptxas printing nothing) raises: that is
    the build machinery broken, not the config, and the worker dies naming it.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    config = dict(job["config"])
    record: dict[str, Any] = {"key": job["key"], "ok": False, "error": None}
    options = {k: config[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in config}
    options["enable_fp_fusion"] = kernel.entry.enable_fp_fusion
    constexpr_config = {k: v for k, v in config.items() if k not in options}
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        ints = kernel.entry.launches[job["launch"]]
        signature, constexprs, attrs = specialize(kernel.fn, ints, job["dtype"], constexpr_config, kernel.entry.fixed)
        src = triton.compiler.ASTSource(fn=kernel.fn, signature=signature, constexprs=constexprs, attrs=attrs)
        # Triton prints the ptxas -v log to stdout under TRITON_DUMP_PTXAS_LOG=1 (the worker sets it): capture it.
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=GPUTarget("cuda", job["capability"], 32), options=options)
    except Exception as exc:  # a config that does not compile is a record with the compiler's message, not a crash
        record["error"] = f"{type(exc).__name__}: {exc}".strip()
        record["compile_s"] = round(time.perf_counter() - t0, 1)
        return record
    compile_s = time.perf_counter() - t0
    ptx: str = compiled.asm["ptx"]
    stats = parse_ptxas_log(log.getvalue())
    if stats is None:  # e.g. a Triton whose make_cubin does not honour TRITON_DUMP_PTXAS_LOG
        stats = _ptxas_stats(ptx, job["capability"], kernel.entry.enable_fp_fusion, tool_timeout)
    res = _res_usage(compiled.asm["cubin"], tool_timeout)
    dynamic_shared = int(compiled.metadata.shared)
    tensor_cores, n_tc = tensor_core_instructions(ptx)
    record.update(
        ok=True,
        **stats,
        local_bytes=res["LOCAL"],
        static_shared=res["SHARED"],
        dynamic_shared=dynamic_shared,
        shared_bytes=dynamic_shared + res["SHARED"],
        tensor_cores=tensor_cores,
        tensor_core_instructions=n_tc,
        compile_s=round(compile_s, 1),
    )
    return record
