"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

Every output of the tool (``results.json``, ``REPORT.md``, a diff, a sweep's summary) goes through
:func:`write_text_atomic`: the text is written to a temporary file in the same folder, flushed and ``fsync``'d,
then ``os.replace``'d over the target (atomic on POSIX and Windows within one file system), and the folder is
``fsync``'d so the rename itself survives a power cut. If anything fails before the rename (a full disk, an
encoding error, an interrupt), the temporary file is removed, the previous file is left untouched and the error
propagates.

:func:`write_bytes_new` is the same for a file that must never replace another (a history entry): the finished
temporary file is hard-linked to its name (``os.link``, which refuses an existing name atomically, where
``os.replace`` would overwrite it and ``open(..., "x")`` would show a half-written file), then unlinked.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: Mode of a newly created file (before the umask), as ``open(path, "w")`` would create it.
NEW_FILE_MODE = 0o666


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary(path: Path, data: bytes | Callable[[BinaryIO], None], mode: int) -> str:
    """A finished temporary file beside ``path`` holding ``data`` (or what ``data(file)`` writes: a large file
    written in parts, never whole in memory), flushed, ``fsync``'d, its mode ``mode``; removed again if anything
    fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def write_bytes_atomic(path: Path | str, data: bytes | Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` by ``data`` (or what ``data(file)`` writes) atomically; keep an existing file's
    permissions."""
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = NEW_FILE_MODE & ~_umask()
    tmp = _temporary(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # already renamed: nothing to remove
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def write_bytes_new(path: Path | str, data: bytes) -> None:
    """Create ``path`` holding ``data`` atomically, never replacing a file of that name: ``FileExistsError`` when
    there is one (it is left as it was). A reader sees no file or the whole one. A file system without hard links
    raises its ``OSError``."""
    path = Path(path)
    tmp = _temporary(path, data, NEW_FILE_MODE & ~_umask())
    try:
        os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_folder(path.parent)


def write_text_atomic(path: Path | str, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) atomically; see the module docstring. A path or value in ``text`` that
    held bytes that are not UTF-8 (an argument's, kept by Python's surrogateescape) is written escaped."""
    write_bytes_atomic(path, text.encode("utf-8", "backslashreplace"))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
