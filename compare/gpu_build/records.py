"""The GPU build's on-disk build records: one JSON record per job key, so a rerun compiles only what changed.

Under ``$FUSION_COMPARE_CACHE/gpu-build`` (the data cache's folder, ``compare.problem.datacache.folder``:
default ``$XDG_CACHE_HOME/fusion-compare``, else ``~/.cache/fusion-compare``; ``off`` keeps nothing between runs),
``records/<key>.json`` holds what the compiler produced for that key (``compare.gpu_build.plan.job_key``); rows are
made from records on every run, so a change to the hardware arithmetic (``compare.results.gpu_build``) needs no
recompile. A compile error is a record too (the same compile fails the same way); a worker that died or ran out of
time leaves none. Writes are atomic (``compare.formats.atomic``): a reader never sees half a record.
``triton/`` is Triton's own cache folder for the workers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compare.formats.atomic import write_text_atomic
from compare.problem import datacache

__all__ = ["Records", "default_folder"]


def default_folder() -> Path | None:
    """``<the data cache's folder>/gpu-build``; None when the data cache is off."""
    base = datacache.folder()
    return None if base is None else base / "gpu-build"


class Records:
    """The build records under ``folder`` (created), by job key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.records = folder / "records"
        self.triton = folder / "triton"
        self.records.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.records / f"{key}.json"

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of ``key``; None when there is none."""
        path = self._path(key)
        if not path.is_file():
            return None
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return record

    def put(self, record: dict[str, Any]) -> None:
        """Keep ``record`` under its ``key``."""
        write_text_atomic(self._path(record["key"]), json.dumps(record))
