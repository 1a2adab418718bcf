"""``python -m compare gpu-build``: compile every Triton kernel of the registered backends for sm_90/sm_80 without a
GPU, and tabulate registers, spills, shared memory, tensor cores and occupancy.

The kernels are those of the kernel modules the registry's backends name (``BackendSpec.kernels``); each module
declares its builds (``GPU_BUILD``). The build runs here (``compare.gpu_build.build``), the compiles in worker
processes in compiled mode (``compare.gpu_build.bridge``: this process may have chosen Triton's interpreter), cached
on disk, so a rerun compiles only what changed. Its output is ``gpu_build.json`` and ``GPU_BUILD.md`` (rendered by
:mod:`compare.report.gpu_build`); exit status 1 when a config does not build or a bf16/fp16 autotune config spills
or exceeds shared memory on sm_90.

This module, the subcommand's arguments, imports neither torch nor triton.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from compare.gpu_build.build import build, check_failures, write_outputs
from compare.gpu_build.records import default_folder
from compare.problem.cases import InputError
from compare.results.gpu_build import ARCHS
from compare.run import exitcodes, stop

#: Wall-clock bound of one whole build (the full sweep takes a few minutes on 2 cores).
DEFAULT_TIMEOUT_S = 3600.0
#: Seconds one compile may take (the slowest fp32 GEMM config takes well under a minute on one core).
DEFAULT_COMPILE_TIMEOUT_S = 300.0


def _override(text: str) -> tuple[str, dict[str, Any]]:
    """``KERNEL=JSON`` -> (kernel id, config): a config object with ``num_warps``."""
    kid, sep, cfg = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--config wants KERNEL=JSON, got {text!r}")
    try:
        config = json.loads(cfg)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--config {kid}: not JSON: {exc}") from exc
    if not isinstance(config, dict) or "num_warps" not in config:
        raise argparse.ArgumentTypeError(f"--config {kid}: want a JSON object with num_warps, got {cfg!r}")
    return kid, config


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``gpu-build`` subcommand on an ``argparse`` subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gpu-build",
        help="compile the Triton kernels for sm_90/sm_80 without a GPU; registers, spills, occupancy",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--arch", nargs="+", default=["sm_90", "sm_80"], help=f"targets ({', '.join(ARCHS)})")
    p.add_argument("--out", default="out/gpu-build", help="folder for gpu_build.json and GPU_BUILD.md")
    p.add_argument("--dtype", nargs="+", help="float32 bfloat16 float16 (default: all)")
    p.add_argument("--kernel", nargs="+", help="kernel ids of the registered kernel modules (default: all)")
    p.add_argument("--quick", action="store_true", help="one config per kernel (its smallest tile)")
    p.add_argument(
        "--config", type=_override, action="append", default=[], metavar="KERNEL=JSON",
        help='replace a kernel\'s configs, e.g. glu_fwd=\'{"BLOCK": 1000, "num_warps": 4}\' (repeatable)',
    )  # fmt: skip
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="parallel compile workers")
    p.add_argument("--cache-dir", help=f"compile cache (default {default_folder() or 'none: the cache is off'})")
    p.add_argument("--no-cache", action="store_true", help="compile everything again")
    p.add_argument(
        "--compile-timeout", type=float, default=DEFAULT_COMPILE_TIMEOUT_S, help="seconds one compile may take"
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the whole build may take")
    p.set_defaults(fn=cmd_gpu_build)
    return p


def build_options(a: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`compare.gpu_build.build.build` that the command line ``a`` asks for.

    Raises:
        InputError: ``--jobs`` below 1.
    """
    if a.jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {a.jobs}")
    overrides: dict[str, list[dict[str, Any]]] = {}
    for kid, config in a.config:
        overrides.setdefault(kid, []).append(config)
    return {
        "archs": list(a.arch),
        "kernel_ids": a.kernel,
        "dtypes": a.dtype,
        "quick": a.quick,
        "overrides": overrides,
        "cache_dir": Path(a.cache_dir).resolve() if a.cache_dir else None,
        "use_cache": not a.no_cache,
        "jobs": a.jobs,
        "compile_timeout_s": a.compile_timeout,
        "timeout_s": a.timeout,
    }


def cmd_gpu_build(a: argparse.Namespace) -> int:
    """Build, write ``gpu_build.json``/``GPU_BUILD.md``; exit 1 when a config fails or breaks the autotune rule."""
    options = build_options(a)
    with stop.on_signals():  # SIGINT and SIGTERM stop the pool between looks at its workers, which it then ends
        data = build(**options)
    json_path, md_path = write_outputs(data, Path(a.out))
    n_err = sum(not r["ok"] for r in data["rows"])
    problems = check_failures(data)
    for line in problems:
        print(f"gpu-build check: {line}", file=sys.stderr)
    print(f"{md_path} (and {json_path.name}): {len(data['rows'])} builds, {n_err} failed, "
          f"triton {data['triton_version']}")  # fmt: skip
    return exitcodes.FINDING if problems else exitcodes.OK
