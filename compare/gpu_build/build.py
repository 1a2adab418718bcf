"""The GPU build, start to end: catalogue, plan, cache, workers, rows, and the two output files.

:func:`build` asks the triton side for the catalogue of the registry's kernel modules
(``compare.gpu_build.bridge``), plans every job (``compare.gpu_build.plan``), takes what the cache already holds
(``compare.gpu_build.records``), compiles the rest in the worker pool (``compare.gpu_build.pool``), printing one line
per build on stderr, and returns the ``gpu_build.json`` document: ``schema``, ``triton_version``,
``specialization`` (how launches are modelled), ``modules`` (the kernel modules built), ``archs`` (each target's
limits), ``kernels`` (the catalogue entry of each kernel built) and ``rows`` (``compare.results.gpu_build``, one per
job, in plan order). :func:`write_outputs` writes it with ``GPU_BUILD.md``; :func:`check_failures` is the verdict
of ``python -m compare gpu-build``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compare.formats.atomic import write_text_atomic
from compare.gpu_build import pool
from compare.gpu_build.bridge import describe, kernel_modules
from compare.gpu_build.plan import Job, plan
from compare.gpu_build.records import Records, default_folder
from compare.report.gpu_build import render_markdown
from compare.results.gpu_build import ARCHS, SCHEMA_VERSION, findings, make_row

__all__ = ["build", "check_failures", "write_outputs"]


def _progress_line(job: Job, record: Mapping[str, Any]) -> str:
    if not record["ok"]:
        return f"{job.label()}: ERROR"
    return (
        f"{job.label()}: {record['registers']} regs, spills {record['spill_stores']}/{record['spill_loads']} B, "
        f"smem {record['shared_bytes']} B"
    )


def build(
    archs: Sequence[str] = ("sm_90", "sm_80"),
    *,
    kernel_ids: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    quick: bool = False,
    overrides: Mapping[str, list[dict[str, Any]]] | None = None,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    jobs: int = 2,
    compile_timeout_s: float = 300.0,
    timeout_s: float | None = None,
    modules: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Build every requested (kernel, launch, config, dtype, arch) and return the ``gpu_build.json`` document.

    Args:
        archs: keys of :data:`compare.results.gpu_build.ARCHS`.
        kernel_ids: kernels of the catalogue to build (default: all).
        dtypes: dtypes to build (default: every one the triton side offers).
        quick: one config per kernel (its smallest tile) instead of the whole autotune list.
        overrides: {kernel id: [config dict, ...]} replacing a kernel's configs (rows get ``origin: override``).
        cache_dir: the cache folder (default :func:`compare.gpu_build.records.default_folder`).
        use_cache: False builds everything again (records go to a temporary folder).
        jobs: worker processes compiling in parallel.
        compile_timeout_s: seconds one compile may take (``compare.gpu_build.pool``).
        timeout_s: seconds the whole build may take (None: no bound but the per-compile one).
        modules: the kernel modules (default: the registry's, :func:`compare.gpu_build.bridge.kernel_modules`).

    Raises:
        InputError: an unknown arch, kernel or dtype.
        RuntimeError: the catalogue could not be read (the triton side's exit and stderr tail).
        TimeoutError: the build ran past ``timeout_s`` (its workers are ended; what they built is cached).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    modules = list(kernel_modules() if modules is None else modules)
    catalogue = describe(modules)
    planned = plan(catalogue, archs, kernel_ids, dtypes, quick, overrides)
    version = catalogue["triton_version"]
    with contextlib.ExitStack() as stack:
        folder = (cache_dir or default_folder()) if use_cache else None
        if folder is None:  # nothing kept: this run's records live as long as it does
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-build-records-")))
        records = Records(folder)
        todo = list({j.key: j for j in planned if not records.has(j.key)}.values())
        doing = f"compiling {len(todo)} in {min(jobs, len(todo))} worker(s)" if todo else "nothing to compile"
        print(f"gpu-build: {len(planned)} builds, {len(planned) - len(todo)} cached, {doing} (triton {version})",
              file=sys.stderr, flush=True)  # fmt: skip
        by_key = {j.key: j for j in todo}
        done = 0

        def keep(record: dict[str, Any]) -> None:
            nonlocal done
            records.put(record)
            done += 1
            print(f"[{done}/{len(todo)}] {_progress_line(by_key[record['key']], record)}", file=sys.stderr, flush=True)

        try:
            failed = pool.run(
                todo, modules, keep, n_workers=jobs, compile_timeout_s=compile_timeout_s,
                triton_cache=records.triton, deadline=deadline,
            )  # fmt: skip
        except TimeoutError as exc:
            raise TimeoutError(f"gpu-build ran past {timeout_s:.0f} s and was stopped ({exc})") from exc
        rows = [make_row(vars(j), records.get(j.key), failed.get(j.key, "")) for j in planned]
    return {
        "schema": SCHEMA_VERSION,
        "triton_version": version,
        "specialization": catalogue["specialization"],
        "modules": modules,
        "archs": {a: vars(ARCHS[a]) for a in archs},
        "kernels": {kid: catalogue["kernels"][kid] for kid in kernel_ids or catalogue["kernels"]},
        "rows": rows,
    }


def write_outputs(data: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``gpu_build.json`` and ``GPU_BUILD.md`` into ``out_dir`` (created); return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_build.json", out_dir / "GPU_BUILD.md"
    write_text_atomic(json_path, json.dumps(data, indent=1) + "\n")
    write_text_atomic(md_path, render_markdown(data))
    return json_path, md_path


def check_failures(data: Mapping[str, Any]) -> list[str]:
    """The build's verdict, as lines: every autotune/fixed config that did not build, and :func:`findings` (a
    bf16/fp16 autotune config that spills or exceeds shared memory on sm_90). Empty: the build is clean."""

    def what(r: Mapping[str, Any]) -> str:
        return f"{r['arch']} {r['kernel']} [{r['launch']}] {r['config_label']} {r['dtype']}"

    out = [f"{what(r)}: {r['error']}" for r in data["rows"] if not r["ok"] and r["origin"] in ("autotune", "fixed")]
    out += [f"{what(r)}: {'; '.join(p)}" for r, p in findings(data) if r["ok"]]
    return out
