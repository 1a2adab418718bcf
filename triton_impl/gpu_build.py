"""Compile every hand-written Triton kernel for NVIDIA GPUs on a machine without one, and measure what was built.

For each kernel (:data:`KERNELS`), each config (the autotune list of a GEMM, the fixed launch of an elementwise
kernel), each dtype (float32, bfloat16, float16) and each requested architecture (sm_90: H100/H200, sm_80: A100),
Triton's own compiler builds the kernel for ``GPUTarget("cuda", cc, 32)`` down to a cubin with the ``ptxas`` it
bundles, and one row of ``gpu_build.json`` records registers and spills (``ptxas -v``), stack/local memory and static
shared memory (``cuobjdump -res-usage``), dynamic shared memory (the kernel's metadata), the tensor-core instructions
in the PTX (``wgmma`` on sm_90, ``mma`` on sm_80) and the theoretical occupancy
(:func:`compare.gpu_build.table.occupancy`). A config that does not compile is a row with the compiler's message.

The kernels must be real ``@triton.jit`` functions, not the interpreter's: run this module with
``FUSION_COMPARE_TRITON=compile`` and without ``TRITON_INTERPRET`` in the environment (``python -m compare
gpu-build`` and :func:`compare.gpu_build.command.run` do). Without the switch, importing a kernel module on a machine
without
CUDA chooses the interpreter (:func:`triton_impl.env.choose`); ``TRITON_INTERPRET=0`` works too.

Framework-free: the kernel modules (``triton_impl/glu_kernels.py``, ``triton_impl/glu_matmul_kernels.py``) and
this module import triton and no framework, so the build runs where only triton is installed (``make
test-triton36``) and compiles the very modules the backends launch.

Launch modelled (:data:`SPECIALIZATION`): Triton specialises a kernel on its arguments when it is launched --
an integer equal to 1 becomes a compile-time constant, an integer or pointer divisible by 16 gets
``tt.divisibility=16`` (which decides vector widths and whether loads can be pipelined with ``cp.async``/TMA). The
build reproduces the specialisation of the product's launches: contiguous row-major activations and torch
``(out, in)`` weights (unit stride along K and N), M, N, K multiples of 16, 16-byte-aligned pointers.

Compiles are cached on disk (``~/.cache/fusion-compare/gpu-build``, ``$XDG_CACHE_HOME`` honoured, or
``--cache-dir``): one JSON row per key (kernel source hash, config, dtype, arch, specialisation, Triton version), so
a rerun only compiles what changed. Work is spread over ``--jobs`` worker subprocesses, each bounded by a timeout.

Usage: ``FUSION_COMPARE_TRITON=compile python -m triton_impl.gpu_build --arch sm_90 sm_80 --out DIR`` writes
``DIR/gpu_build.json`` and ``DIR/GPU_BUILD.md``; ``--describe`` prints the kernels, source hashes and configs
without compiling.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare.gpu_build.table import (
    ARCHS,
    SCHEMA_VERSION,
    findings,
    occupancy,
    parse_ptxas_log,
    parse_res_usage,
    render_markdown,
)

__all__ = [
    "DTYPES",
    "KERNELS",
    "SPECIALIZATION",
    "KernelSpec",
    "build",
    "compile_row",
    "default_cache_dir",
    "describe",
    "kernel_source_hash",
    "main",
]

#: Bumped whenever a row's content changes for the same compile: part of every cache key.
BUILDER_VERSION = 1

#: dtype name -> Triton pointer element type.
DTYPES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

_KERNEL_DIR = Path(__file__).resolve().parent
_PROJECT_ROOT = _KERNEL_DIR.parent

# The canonical launch. Only the specialisation matters (== 1, % 16), so any M, N, K that are multiples of 16 give
# the same code: these are the GeGLU block of the d_model 768 / d_ff 3072 model at 4096 tokens.
_M, _N, _K = 4096, 3072, 768

SPECIALIZATION = (
    f"the product's launches: contiguous activations, torch (out, in) weights and contiguous outputs; the plain GEMM "
    f"also as the two backward launches of LinearFunction on transposed views (dx = dy @ W: b = W.T; "
    f"dW = dy^T @ x: a = dy.T, b = x.T). M, N, K are multiples of 16 (built with M={_M}, N={_N}, K={_K}). As "
    f"Triton's launcher does, unit strides become compile-time constants and 16-divisible integers and 16-byte-"
    f"aligned pointers get tt.divisibility=16. num_stages=3 (Triton's default) for the loop-free elementwise kernels."
)


@dataclass(frozen=True)
class KernelSpec:
    """One Triton kernel of the product and how the product launches it.

    ``file`` is relative to ``triton_impl``; ``autotune_list`` names the module-level ``list[triton.Config]`` of
    a GEMM (None: an elementwise kernel launched with the module's ``BLOCK_SIZE``/``NUM_WARPS``). ``launches``
    maps a launch's name to the runtime integer arguments it passes (pointers are every other non-constexpr
    argument): each launch with a different specialisation is a different compiled kernel, so each is built.
    """

    id: str
    file: str
    function: str
    autotune_list: str | None
    launches: Mapping[str, Mapping[str, int]]


def _gemm_ints(prefix: tuple[str, str, str], a_k_contiguous: bool, b_k_contiguous: bool) -> dict[str, int]:
    """Integer arguments of a GEMM launch on a [M, K], b [N, K] (either K-contiguous or a transposed view), c [M, N].

    ``prefix`` names the kernel's operands, e.g. ``("x", "wg", "h")`` -> ``stride_xm``, ``stride_xk``, ...
    """
    a, b, c = prefix
    return {
        "M": _M, "N": _N, "K": _K,
        f"stride_{a}m": _K if a_k_contiguous else 1, f"stride_{a}k": 1 if a_k_contiguous else _M,
        f"stride_{b}n": _K if b_k_contiguous else 1, f"stride_{b}k": 1 if b_k_contiguous else _N,
        f"stride_{c}m": _N, f"stride_{c}n": 1,
    }  # fmt: skip


_ELEMENTWISE = {"h = gelu(g) * u (flat, contiguous)": {"n_elements": _M * _N}}
KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec("geglu_fwd", "glu_kernels.py", "_geglu_fwd_kernel", None, _ELEMENTWISE),
    KernelSpec("geglu_bwd", "glu_kernels.py", "_geglu_bwd_kernel", None,
               {"dg, du (flat, contiguous)": {"n_elements": _M * _N}}),
    KernelSpec(
        "geglu_matmul", "glu_matmul_kernels.py", "_geglu_matmul_kernel", "GEGLU_MATMUL_CONFIGS",
        # x [M, K], w_gate/w_up [N, K] contiguous (the only launch: the backward recomputes with torch)
        {"x @ W^T": {**_gemm_ints(("x", "wg", "h"), True, True), "stride_wun": _K, "stride_wuk": 1}},
    ),
    KernelSpec(
        "matmul", "glu_matmul_kernels.py", "_matmul_kernel", "MATMUL_CONFIGS",
        {
            # LinearFunction.forward: matmul(x, w), both K-contiguous
            "x @ W^T": _gemm_ints(("a", "b", "c"), True, True),
            # LinearFunction.backward dx = matmul(dy, w.T): b = w.T is a transposed view (unit stride along N)
            "dx = dy @ W": _gemm_ints(("a", "b", "c"), True, False),
            # LinearFunction.backward dW = matmul(dy.T, x.T): both operands transposed views
            "dW = dy^T @ x": _gemm_ints(("a", "b", "c"), False, False),
        },
    ),
)  # fmt: skip
_BY_ID = {k.id: k for k in KERNELS}
_KERNEL_FILES = ("glu_kernels.py", "glu_matmul_kernels.py")
# Seconds a worker gets to start (import triton and the kernels) before its compile budget starts counting.
_WORKER_STARTUP_S = 60.0
# Triton's default for CUDA; the elementwise launches do not set it (and have no loop to pipeline).
_DEFAULT_NUM_STAGES = 3

# Tensor-core instructions in the PTX: Hopper warpgroup MMA, Ampere-style warp MMA.
_WGMMA = re.compile(r"^\s*(?:@%p\d+\s+)?wgmma\.mma_async", re.MULTILINE)
_MMA = re.compile(r"^\s*(?:@%p\d+\s+)?mma\.sync", re.MULTILINE)

_COMPILED_MODE_HELP = (
    "the Triton kernels were decorated for the CPU interpreter; run with FUSION_COMPARE_TRITON=compile and "
    "TRITON_INTERPRET unset (python -m compare gpu-build does)"
)


# --------------------------------------------------------------------------------------------------------------
# Kernel sources: hashes (pure ast, no triton needed)


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (
        isinstance(target, ast.Attribute)
        and target.attr == "jit"
        and isinstance(target.value, ast.Name)
        and target.value.id == "triton"
    )


def _node_lines(node: ast.stmt) -> tuple[int, int]:
    """0-based [start, end) line range of a top-level statement, decorators included."""
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno, *(d.lineno for d in decorators)])
    return start - 1, node.end_lineno or node.lineno


def _jit_sources(files: Iterable[str] = _KERNEL_FILES) -> dict[str, tuple[str, ast.FunctionDef]]:
    """name -> (source text with decorators, ast) of every top-level ``@triton.jit`` function of ``files``."""
    pool: dict[str, tuple[str, ast.FunctionDef]] = {}
    for name in files:
        text = (_KERNEL_DIR / name).read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.parse(text, filename=name).body:
            if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
                if node.name in pool:
                    raise ValueError(f"@triton.jit function {node.name} is defined twice in {', '.join(files)}")
                start, end = _node_lines(node)
                pool[node.name] = ("\n".join(lines[start:end]), node)
    return pool


def kernel_source_hash(function: str) -> str:
    """sha256 (hex, 16 digits) of a kernel's source and of every ``@triton.jit`` function it calls, transitively.

    Computed from the files' text with ``ast`` (no import), so it is the same under every Triton version and
    changes exactly when the code compiled for the kernel changes (comments inside those functions included).
    """
    pool = _jit_sources()
    if function not in pool:
        raise KeyError(f"no @triton.jit function {function} in {', '.join(_KERNEL_FILES)}")
    seen: set[str] = set()
    todo = [function]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n.id for n in ast.walk(pool[name][1]) if isinstance(n, ast.Name) and n.id in pool]
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(f"{name}\0{pool[name][0]}\0".encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------------------
# Loading the kernels in compiled mode


def _check_compiled_mode() -> None:
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on"):
        raise RuntimeError(_COMPILED_MODE_HELP)


def _config_dict(cfg: Any) -> dict[str, Any]:
    """A ``triton.Config`` as a plain dict: its constexprs plus num_warps/num_stages (and num_ctas/maxnreg if set)."""
    out = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if getattr(cfg, "num_ctas", 1) != 1:
        out["num_ctas"] = cfg.num_ctas
    if getattr(cfg, "maxnreg", None):
        out["maxnreg"] = cfg.maxnreg
    return out


def _load() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """({kernel id: JITFunction}, {kernel id: description}) in compiled mode; see :func:`describe`."""
    _check_compiled_mode()
    from triton.runtime.jit import JITFunction

    modules = {f: importlib.import_module(f"triton_impl.{Path(f).stem}") for f in _KERNEL_FILES}
    kernels_mod = modules["glu_kernels.py"]
    if kernels_mod.INTERPRETED:
        raise RuntimeError(_COMPILED_MODE_HELP)
    fns: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for spec in KERNELS:
        mod = modules[spec.file]
        fn = getattr(mod, spec.function)
        if not isinstance(fn, JITFunction):
            raise RuntimeError(f"{spec.function} is a {type(fn).__name__}, not a JITFunction: {_COMPILED_MODE_HELP}")
        if spec.autotune_list is None:
            configs = [
                {"BLOCK": kernels_mod.BLOCK_SIZE, "num_warps": kernels_mod.NUM_WARPS, "num_stages": _DEFAULT_NUM_STAGES}
            ]
        else:
            configs = [_config_dict(c) for c in getattr(mod, spec.autotune_list)]
        fns[spec.id] = fn
        info[spec.id] = {
            "function": spec.function,
            "file": f"triton_impl/{spec.file}",
            "source_hash": kernel_source_hash(spec.function),
            "autotune_list": spec.autotune_list,
            "launches": list(spec.launches),
            "configs": configs,
            # constexprs every launch of the product passes besides the config (GPU values); the activation is
            # built as GeGLU's (ACT="gelu_tanh"), SwiGLU's "silu" specialisation is not in the table
            "fixed": {"EXACT_BF16": bool(kernels_mod.EXACT_BF16_CAST), "UPCAST": False, "ACT": "gelu_tanh"},
            "enable_fp_fusion": bool(kernels_mod.FP_FUSION),
        }
    return fns, info


def describe() -> dict[str, Any]:
    """The kernels as this checkout defines them, without compiling anything.

    Returns ``{"triton_version": ..., "kernels": {id: {"function", "file", "source_hash", "autotune_list",
    "configs", "fixed", "enable_fp_fusion"}}}``; ``configs`` are the autotune list's entries as
    dicts (an elementwise kernel: its one GPU launch).
    """
    import triton

    _, info = _load()
    return {"triton_version": triton.__version__, "kernels": info}


# --------------------------------------------------------------------------------------------------------------
# One compile -> one row


def _specialize(
    fn: Any, ints: Mapping[str, int], dtype: str, config: Mapping[str, Any], fixed: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """(signature, constexprs, attrs) for ``triton.compiler.ASTSource``, as Triton's launcher would build them.

    ``ints`` are the launch's runtime integer arguments; constexprs come from ``config``, then ``fixed``.
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
        elif p.name.endswith("_ptr"):
            signature[p.name] = "*" + DTYPES[dtype]
            attrs[(i,)] = divisible  # torch allocations are (at least) 16-byte aligned
        else:
            raise KeyError(f"{fn.__name__}: no value for argument {p.name} in the launch; add it to KERNELS")
    return signature, constexprs, attrs


def config_label(config: Mapping[str, Any]) -> str:
    """``128x128x64 w8 s3`` for a GEMM config, ``BLOCK=1024 w4 s3`` for an elementwise one."""
    if "BLOCK_M" in config:
        tile = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}"
        if config.get("GROUP_M", 8) != 8:
            tile += f" g{config['GROUP_M']}"
    else:
        tile = " ".join(f"{k}={v}" for k, v in config.items() if k not in ("num_warps", "num_stages"))
    return f"{tile} w{config['num_warps']} s{config['num_stages']}"


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


def _sm_flag(capability: int) -> str:
    """``sm_90a`` / ``sm_80``: the ``--gpu-name`` Triton passes (the ``a`` variant enables wgmma on 9.0)."""
    return f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"


def _ptxas_path(capability: int) -> str:
    """The ptxas Triton itself uses for ``capability`` (3.9 bundles two; the older one rejects its newer PTX)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(capability).path


def _ptxas_stats(ptx: str, capability: int, fp_fusion: bool, timeout: float) -> dict[str, int]:
    """Run the bundled ``ptxas -v`` on ``ptx`` (used when Triton's own ptxas log was not captured)."""
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx, encoding="utf-8")
        fmad = [] if fp_fusion else ["--fmad=false"]
        cmd = [
            _ptxas_path(capability),
            "-v",
            *fmad,
            f"--gpu-name={_sm_flag(capability)}",
            str(src),
            "-o",
            str(Path(tmp) / "k.o"),
        ]
        stats = parse_ptxas_log(_run_tool(cmd, timeout))
    if stats is None:
        raise RuntimeError("ptxas -v printed no register/spill line")
    return stats


def _res_usage(cubin: bytes, timeout: float) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return parse_res_usage(_run_tool([_bin_tool("cuobjdump"), "-res-usage", str(path)], timeout))


def compile_row(fn: Any, kernel: Mapping[str, Any], job: Mapping[str, Any], tool_timeout: float = 120.0) -> dict:
    """Compile one (kernel, launch, config, dtype, arch) job and return its row (see :mod:`compare.gpu_build.table`).

    ``kernel`` is the kernel's :func:`describe` entry; ``job`` has ``kernel_id``, ``launch`` (a key of the
    kernel's :attr:`KernelSpec.launches`), ``config``, ``origin``, ``dtype``, ``arch``. A compile that raises
    becomes ``ok: False`` with ``error`` = the exception's type and message (Triton's ``CompilationError`` text
    includes the offending source line; a ``ptxas`` failure its log).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    spec = _BY_ID[job["kernel_id"]]
    arch = ARCHS[job["arch"]]
    config = dict(job["config"])
    row: dict[str, Any] = {
        "kernel": spec.function,
        "kernel_id": spec.id,
        "launch": job["launch"],
        "config": config,
        "config_label": config_label(config),
        "origin": job["origin"],
        "dtype": job["dtype"],
        "arch": arch.name,
        "ok": False,
        "error": None,
    }
    options = {k: config[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in config}
    options["enable_fp_fusion"] = kernel["enable_fp_fusion"]
    constexpr_config = {k: v for k, v in config.items() if k not in options}
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        ints = spec.launches[job["launch"]]
        signature, constexprs, attrs = _specialize(fn, ints, job["dtype"], constexpr_config, kernel["fixed"])
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        # Triton prints the ptxas -v log to stdout when TRITON_DUMP_PTXAS_LOG=1 (set for workers): capture it.
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=GPUTarget("cuda", arch.capability, 32), options=options)
    except Exception as exc:  # a config that does not compile is a row with the compiler's message, not a crash
        row["error"] = f"{type(exc).__name__}: {exc}".strip()
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        return row
    compile_s = time.perf_counter() - t0
    ptx: str = compiled.asm["ptx"]
    stats = parse_ptxas_log(log.getvalue())
    if stats is None:  # e.g. a Triton whose make_cubin does not honour TRITON_DUMP_PTXAS_LOG
        stats = _ptxas_stats(ptx, arch.capability, kernel["enable_fp_fusion"], tool_timeout)
    res = _res_usage(compiled.asm["cubin"], tool_timeout)
    dynamic_shared = int(compiled.metadata.shared)
    shared = dynamic_shared + res["SHARED"]
    n_wgmma, n_mma = len(_WGMMA.findall(ptx)), len(_MMA.findall(ptx))
    row.update(
        ok=True,
        **stats,
        local_bytes=res["LOCAL"],
        static_shared=res["SHARED"],
        dynamic_shared=dynamic_shared,
        shared_bytes=shared,
        shared_limit=arch.smem_per_block,
        tensor_cores="wgmma" if n_wgmma else "mma" if n_mma else "none",
        tensor_core_instructions=n_wgmma or n_mma,
        occupancy=occupancy(arch, stats["registers"], config["num_warps"], shared),
        compile_s=round(compile_s, 1),
    )
    return row


# --------------------------------------------------------------------------------------------------------------
# Orchestration: plan, cache, workers


def default_cache_dir() -> Path:
    """``$FUSION_COMPARE_CACHE/gpu-build``, else ``$XDG_CACHE_HOME/fusion-compare/gpu-build``, else ``~/.cache/...``."""
    if os.environ.get("FUSION_COMPARE_CACHE"):
        return Path(os.environ["FUSION_COMPARE_CACHE"]) / "gpu-build"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fusion-compare" / "gpu-build"


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path`` (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the mode open(path, "w") would
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _job_key(job: Mapping[str, Any], kernel: Mapping[str, Any], specialization: str, triton_version: str) -> str:
    payload = {
        "builder": BUILDER_VERSION,
        "triton": triton_version,
        "function": kernel["function"],
        "source_hash": kernel["source_hash"],
        "launch": job["launch"],
        "config": job["config"],
        "origin": job["origin"],
        "dtype": job["dtype"],
        "arch": job["arch"],
        "specialization": specialization,
        "fp_fusion": kernel["enable_fp_fusion"],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _plan(
    info: Mapping[str, Mapping[str, Any]],
    fns: Mapping[str, Any],
    archs: Sequence[str],
    kernel_ids: Sequence[str],
    dtypes: Sequence[str],
    quick: bool,
    overrides: Mapping[str, list[dict[str, Any]]],
    triton_version: str,
) -> list[dict[str, Any]]:
    jobs = []
    for arch in archs:
        for kid in kernel_ids:
            kernel = info[kid]
            if kid in overrides:
                configs = [(c, "override") for c in overrides[kid]]
            else:
                origin = "fixed" if kernel["autotune_list"] is None else "autotune"
                configs = [(c, origin) for c in kernel["configs"]]
                if quick:  # the smallest tile: cheapest to compile
                    configs = [min(configs, key=lambda co: math.prod(v for k, v in co[0].items() if "BLOCK" in k))]
            for launch, ints in _BY_ID[kid].launches.items():
                for dtype in dtypes:
                    for config, origin in configs:
                        job = {
                            "kernel_id": kid,
                            "launch": launch,
                            "config": config,
                            "origin": origin,
                            "dtype": dtype,
                            "arch": arch,
                        }
                        try:
                            sig = _specialize(fns[kid], ints, dtype, config, kernel["fixed"])
                            specialization = repr(sig)
                        except KeyError as exc:  # compile_row records it as the row's error
                            specialization = f"unspecializable: {exc}"
                        job["key"] = _job_key(job, kernel, specialization, triton_version)
                        jobs.append(job)
    return jobs


def _cost(job: Mapping[str, Any]) -> float:
    """Rough relative compile cost, for spreading jobs over workers: fp32 GEMMs spill and take longest."""
    block = math.prod(v for k, v in job["config"].items() if k.startswith("BLOCK"))
    return (4.0 if job["dtype"] == "float32" else 1.0) * max(block, 1) ** 0.5


def _worker_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # this process compiles (checked in _load), so a value here is "0"
    env.update(
        FUSION_COMPARE_TRITON="compile",
        TRITON_ALWAYS_COMPILE="1",  # Triton's own cache would skip ptxas and with it the -v log
        TRITON_DUMP_PTXAS_LOG="1",
        TRITON_CACHE_DIR=str(cache_dir / "triton"),
    )
    root = str(_PROJECT_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a worker and what it started (ptxas): it runs in its own session, so its process group is its own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _run_workers(
    jobs: list[dict[str, Any]], rows_dir: Path, cache_dir: Path, n_workers: int, timeout_per_compile: float
) -> dict[str, str]:
    """Compile ``jobs`` in ``n_workers`` subprocesses; return {job key: reason} for jobs that produced no row."""
    failed: dict[str, str] = {}
    if not jobs:
        return failed
    ordered = sorted(jobs, key=_cost, reverse=True)
    chunks = [ordered[i::n_workers] for i in range(min(n_workers, len(jobs)))]
    total, done_before = len(jobs), 0
    with tempfile.TemporaryDirectory(prefix="gpu-build-") as tmp:
        procs = []
        for i, chunk in enumerate(chunks):
            job_file = Path(tmp) / f"jobs{i}.json"
            job_file.write_text(json.dumps({"rows_dir": str(rows_dir), "jobs": chunk}))
            log = open(Path(tmp) / f"worker{i}.log", "w+", encoding="utf-8")  # noqa: SIM115 (closed below)
            proc = subprocess.Popen(
                [sys.executable, "-m", "triton_impl.gpu_build", "--worker", str(job_file)],
                env=_worker_env(cache_dir), cwd=_PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            # Bound: startup plus the per-compile budget for every job of the chunk.
            deadline = time.monotonic() + _WORKER_STARTUP_S + timeout_per_compile * len(chunk)
            procs.append((proc, chunk, log, deadline))
        pending = {job["key"]: job for job in jobs}
        try:
            while any(p.poll() is None for p, *_ in procs):
                time.sleep(0.5)
                done_before = _report_progress(pending, rows_dir, total, done_before)
                for proc, chunk, _, deadline in procs:
                    if proc.poll() is None and time.monotonic() > deadline:
                        _kill_group(proc)
                        for job in chunk:
                            failed.setdefault(job["key"], f"worker timed out ({timeout_per_compile:.0f} s per compile)")
        finally:
            for proc, *_ in procs:
                if proc.poll() is None:
                    _kill_group(proc)
        _report_progress(pending, rows_dir, total, done_before)
        for proc, chunk, log, _ in procs:
            log.seek(0)
            tail = "\n".join(log.read().splitlines()[-20:])
            log.close()
            if proc.returncode != 0:
                for job in chunk:
                    failed.setdefault(job["key"], f"worker exited with {proc.returncode}: {tail}")
    return failed


def _report_progress(pending: dict[str, dict[str, Any]], rows_dir: Path, total: int, done: int) -> int:
    for key in [k for k in pending if (rows_dir / f"{k}.json").exists()]:
        job = pending.pop(key)
        done += 1
        row = json.loads((rows_dir / f"{key}.json").read_text(encoding="utf-8"))
        what = (
            f"{row['registers']} regs, spills {row['spill_stores']}/{row['spill_loads']} B, "
            f"smem {row['shared_bytes']} B"
            if row["ok"]
            else "ERROR"
        )
        print(
            f"[{done}/{total}] {job['arch']} {row['kernel']} [{job['launch']}] {row['config_label']} "
            f"{job['dtype']}: {what}",
            file=sys.stderr,
            flush=True,
        )
    return done


def _worker(job_file: Path) -> int:
    """Worker subprocess: compile each job of ``job_file`` and write its row to ``rows_dir/<key>.json``."""
    spec = json.loads(job_file.read_text(encoding="utf-8"))
    fns, info = _load()
    rows_dir = Path(spec["rows_dir"])
    for job in spec["jobs"]:
        row = compile_row(fns[job["kernel_id"]], info[job["kernel_id"]], job)
        _write_atomic(rows_dir / f"{job['key']}.json", json.dumps(row))
    return 0


def build(
    archs: Sequence[str] = ("sm_90", "sm_80"),
    *,
    kernel_ids: Sequence[str] | None = None,
    dtypes: Sequence[str] = tuple(DTYPES),
    quick: bool = False,
    overrides: Mapping[str, list[dict[str, Any]]] | None = None,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    jobs: int = 2,
    timeout_per_compile: float = 300.0,
) -> dict[str, Any]:
    """Build every requested (kernel, config, dtype, arch) and return the ``gpu_build.json`` document.

    Args:
        archs: keys of :data:`compare.gpu_build.table.ARCHS`.
        kernel_ids: subset of :data:`KERNELS` ids (default: all).
        dtypes: subset of :data:`DTYPES`.
        quick: one config per kernel (its smallest tile) instead of the whole autotune list.
        overrides: {kernel id: [config dict, ...]} replacing a kernel's configs (rows get ``origin: override``).
        cache_dir: row and Triton caches (default :func:`default_cache_dir`).
        use_cache: False compiles everything again (rows go to a temporary folder).
        jobs: worker subprocesses compiling in parallel.
        timeout_per_compile: seconds one compile may take; a worker gets this times its job count plus 60 s.
    """
    import triton

    cache_dir = Path(cache_dir or default_cache_dir())
    for arch in archs:
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    kernel_ids = list(kernel_ids or _BY_ID)
    for kid in [*kernel_ids, *(overrides or {})]:
        if kid not in _BY_ID:
            raise ValueError(f"unknown kernel {kid!r}; known: {', '.join(_BY_ID)}")
    fns, info = _load()
    plan = _plan(info, fns, archs, kernel_ids, dtypes, quick, overrides or {}, triton.__version__)
    with contextlib.ExitStack() as stack:
        if use_cache:
            rows_dir = cache_dir / "rows"
        else:
            rows_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-build-rows-")))
        todo = [job for job in plan if not (rows_dir / f"{job['key']}.json").exists()]
        doing = f"compiling {len(todo)} in {min(jobs, len(todo))} worker(s)" if todo else "nothing to compile"
        print(f"gpu-build: {len(plan)} builds, {len(plan) - len(todo)} cached, {doing} (triton {triton.__version__})",
              file=sys.stderr, flush=True)  # fmt: skip
        failed = _run_workers(todo, rows_dir, cache_dir, max(1, jobs), timeout_per_compile)
        rows = []
        for job in plan:
            path = rows_dir / f"{job['key']}.json"
            if path.exists():
                rows.append(json.loads(path.read_text(encoding="utf-8")))
            else:
                spec = _BY_ID[job["kernel_id"]]
                rows.append({
                    "kernel": spec.function, "kernel_id": spec.id, "launch": job["launch"], "config": job["config"],
                    "config_label": config_label(job["config"]), "origin": job["origin"], "dtype": job["dtype"],
                    "arch": job["arch"], "ok": False,
                    "error": f"not built: {failed.get(job['key'], 'worker finished without writing this row')}",
                })  # fmt: skip
    return {
        "schema": SCHEMA_VERSION,
        "triton_version": triton.__version__,
        "specialization": SPECIALIZATION,
        "archs": {a: vars(ARCHS[a]) for a in archs},
        "kernels": {kid: info[kid] for kid in kernel_ids},
        "rows": rows,
    }


def write_outputs(data: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``gpu_build.json`` and ``GPU_BUILD.md`` into ``out_dir`` (created); return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_build.json", out_dir / "GPU_BUILD.md"
    _write_atomic(json_path, json.dumps(data, indent=1) + "\n")
    _write_atomic(md_path, render_markdown(data))
    return json_path, md_path


def _parse_override(text: str) -> tuple[str, dict[str, Any]]:
    kid, sep, cfg = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--config wants KERNEL=JSON, got {text!r}")
    try:
        config = json.loads(cfg)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--config {kid}: not JSON: {exc}") from exc
    if not isinstance(config, dict) or "num_warps" not in config:
        raise argparse.ArgumentTypeError(f"--config {kid}: want a JSON object with num_warps, got {cfg!r}")
    config.setdefault("num_stages", _DEFAULT_NUM_STAGES)
    return kid, config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m triton_impl.gpu_build", description=__doc__.split("\n\n")[0],
        epilog="exit status: 0 built (and, with --check, the autotune rule holds); 1 --check found a problem; "
        "2 bad arguments; 3 the build itself failed",
    )  # fmt: skip
    p.add_argument("--arch", nargs="+", default=["sm_90", "sm_80"], choices=list(ARCHS))
    p.add_argument("--out", type=Path, help="write gpu_build.json and GPU_BUILD.md here")
    p.add_argument("--kernel", nargs="+", choices=list(_BY_ID), help="only these kernels")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    p.add_argument("--quick", action="store_true", help="one config per kernel (its smallest tile)")
    p.add_argument(
        "--config",
        type=_parse_override,
        action="append",
        default=[],
        metavar="KERNEL=JSON",
        help='replace a kernel\'s configs, e.g. geglu_fwd=\'{"BLOCK": 1000, "num_warps": 4}\' (repeatable)',
    )
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="parallel compile workers")
    p.add_argument("--cache-dir", type=Path, help=f"default: {default_cache_dir()}")
    p.add_argument("--no-cache", action="store_true", help="compile everything again")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one compile may take")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when an autotune/launch config fails to build, or a bf16/fp16 autotune config "
        "spills or exceeds shared memory on sm_90",
    )
    p.add_argument("--describe", action="store_true", help="print the kernels, source hashes and configs as JSON")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def check_failures(data: Mapping[str, Any]) -> list[str]:
    """The ``--check`` verdict: build errors of autotune/launch configs and :func:`findings` on sm_90, as lines."""

    def what(r: Mapping[str, Any]) -> str:
        return f"{r['arch']} {r['kernel']} [{r['launch']}] {r['config_label']} {r['dtype']}"

    out = [f"{what(r)}: {r['error']}" for r in data["rows"] if not r["ok"] and r["origin"] in ("autotune", "fixed")]
    out += [f"{what(r)}: {'; '.join(p)}" for r, p in findings(data) if r["ok"]]
    return out


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.worker is not None:
        return _worker(a.worker)
    if a.describe:
        print(json.dumps(describe(), indent=1))
        return 0
    if a.out is None:
        parser().error("--out DIR is required (or --describe)")
    # SIGTERM (e.g. compare.gpu_build.command.run's timeout) unwinds like Ctrl-C: _run_workers' finally kills the
    # workers.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    overrides: dict[str, list[dict[str, Any]]] = {}
    for kid, config in a.config:
        overrides.setdefault(kid, []).append(config)
    data = build(
        a.arch, kernel_ids=a.kernel, dtypes=a.dtype, quick=a.quick, overrides=overrides, cache_dir=a.cache_dir,
        use_cache=not a.no_cache, jobs=a.jobs, timeout_per_compile=a.timeout,
    )  # fmt: skip
    json_path, md_path = write_outputs(data, a.out)
    n_err = sum(not r["ok"] for r in data["rows"])
    print(f"gpu-build: wrote {json_path} and {md_path}: {len(data['rows'])} builds, {n_err} failed", file=sys.stderr)
    if a.check:
        problems = check_failures(data)
        for line in problems:
            print(f"gpu-build check: {line}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # exit 3 ("the build itself failed") with the traceback, never 1 (a finding)
        traceback.print_exc()
        status = 3
    except KeyboardInterrupt as exc:
        print(f"gpu-build: interrupted ({exc}); workers stopped", file=sys.stderr)
        status = 130
    raise SystemExit(status)
