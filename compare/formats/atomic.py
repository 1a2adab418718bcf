"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

Every output of the tool (``results.json``, ``REPORT.md``, a diff, a sweep's summary) goes through
:func:`write_text_atomic`: the text is written to a temporary file in the same folder, flushed and ``fsync``'d,
then ``os.replace``'d over the target (atomic on POSIX and Windows within one file system), and the folder is
``fsync``'d so the rename itself survives a power cut. If anything fails before the rename (a full disk, an
encoding error, an interrupt), the temporary file is removed, the previous file is left untouched and the error
propagates.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

#: Mode of a newly created file (before the umask), as ``open(path, "w")`` would create it.
NEW_FILE_MODE = 0o666


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically; keep an existing file's permissions."""
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = NEW_FILE_MODE & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # already renamed, or never got that far: nothing to remove
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def write_text_atomic(path: Path | str, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) atomically; see the module docstring."""
    write_bytes_atomic(path, text.encode("utf-8"))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
