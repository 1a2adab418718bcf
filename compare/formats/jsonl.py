"""Append-only JSON-lines files, the stores of finished cells (a sweep's ``results.jsonl``, a run's
``cells.jsonl``): one JSON object per line, each line written with a single ``write`` and flushed to disk (``fsync``)
before the caller goes on, so a process killed at any moment leaves every line it finished, and at most one torn
(unterminated) last line, which :class:`Appender` drops on open and :func:`read_records` ignores.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any


class Appender:
    """Appends JSON lines to ``path`` (created; emptied first when ``fresh``): one ``write`` per line, then
    ``fsync``. A write that fails (a full disk: ``OSError`` ENOSPC) raises, and the lines before it stay whole (a
    partial line is cut off again)."""

    def __init__(self, path: Path, fresh: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if fresh else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            self._drop_torn_tail()
        except BaseException:
            os.close(self.fd)
            raise

    def _drop_torn_tail(self) -> None:
        size = os.fstat(self.fd).st_size
        if size == 0:
            return
        data = os.pread(self.fd, size, 0)
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        os.ftruncate(self.fd, keep)
        print(f"dropped a torn last line ({len(data) - keep} bytes) from {self.path}", file=sys.stderr)

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line and ``fsync``; on a failed write the file is cut back to its last whole line
        and the error raised."""
        data = (json.dumps(record, allow_nan=True) + "\n").encode()
        start = os.fstat(self.fd).st_size
        try:
            while data:
                n = os.write(self.fd, data)
                data = data[n:]
            os.fsync(self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path) -> list[Any]:
    """Every complete line of ``path``, parsed; a torn last line (unterminated and unparsable) is ignored, a bad
    line before it raises ``ValueError`` naming its number."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a torn last line
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {i} is not valid JSON: {exc}") from exc
    if tail.strip():
        with contextlib.suppress(json.JSONDecodeError):  # complete JSON without its newline still counts
            out.append(json.loads(tail))
    return out
