"""The GPU build's worker process: the only way the compare side reaches triton (``compare.gpu_build``).

``python -m triton_impl.gpu_build.worker --describe --modules M [M ...]`` prints the catalogue of those kernel
modules as JSON on stdout (:func:`triton_impl.gpu_build.catalogue.describe`), compiling nothing.

``python -m triton_impl.gpu_build.worker --jobs JOBS.json --rows ROWS.jsonl [--triton-cache DIR]`` loads the
modules ``JOBS.json`` names (``{"modules": [...], "jobs": [job, ...]}``, a job as
:func:`triton_impl.gpu_build.compiler.build` reads it, plus ``kernel_id``), compiles the jobs in order and appends
each one's build record to ``ROWS.jsonl`` as one JSON line, flushed, as soon as it is built: the compare side reads
the lines while the worker runs (progress, and what a worker that dies or is stopped had finished). A compile
error is a record; anything else (an import failure, a tool that is missing) ends the worker with its traceback on
stderr and exit status 1.

Run in compiled mode: ``FUSION_COMPARE_TRITON=compile`` and no ``TRITON_INTERPRET`` in the environment (the compare
side starts it so). It sets Triton's own switches itself, before triton is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from triton_impl.gpu_build import catalogue

__all__ = ["main"]


def _compile_jobs(job_file: Path, rows: Path, triton_cache: Path | None) -> None:
    # Triton's cache would skip ptxas and with it the -v log; the log goes to stdout, where build() captures it.
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    if triton_cache is not None:
        os.environ["TRITON_CACHE_DIR"] = str(triton_cache)
    from triton_impl.gpu_build import compiler

    spec = json.loads(job_file.read_text(encoding="utf-8"))
    kernels = catalogue.load(spec["modules"])
    with rows.open("a", encoding="utf-8") as out:
        for job in spec["jobs"]:
            record = compiler.build(kernels[job["kernel_id"]], job)
            out.write(json.dumps(record) + "\n")  # one line per record: a reader takes only whole lines
            out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m triton_impl.gpu_build.worker", description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", action="store_true", help="print the catalogue of --modules as JSON")
    what.add_argument("--jobs", type=Path, help="JSON file of the modules and jobs to compile")
    p.add_argument("--modules", nargs="+", default=[], help="kernel modules to describe")
    p.add_argument("--rows", type=Path, help="with --jobs: append one JSON line per build here")
    p.add_argument("--triton-cache", type=Path, help="with --jobs: Triton's cache folder (TRITON_CACHE_DIR)")
    a = p.parse_args(argv)
    if a.describe:
        if not a.modules:
            p.error("--describe needs --modules")
        json.dump(catalogue.describe(a.modules), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if a.rows is None:
        p.error("--jobs needs --rows")
    _compile_jobs(a.jobs, a.rows, a.triton_cache)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
