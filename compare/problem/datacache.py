"""A disk cache for data that is a pure function of the case: generated golden data and the plain computation.

Both are deterministic and the same bits on every machine (``compare.problem.fixedbits``), and costly on a large case (a
``cpu-mlp`` golden and its plain computation take tens of seconds on a 2-core CPU), and every process of a
tensor-parallel group or a sweep needs them. An entry is a safetensors file (no pickle) under
``$FUSION_COMPARE_CACHE`` (default ``$XDG_CACHE_HOME/fusion-compare``, else ``~/.cache/fusion-compare``; ``off``
disables the cache), named by a sha256 of what it is (``kind``, the case) and of the source of every module that
computes it, so a changed formula misses the cache instead of reading a stale answer. Writes are atomic; an entry
that cannot be read (truncated, foreign) is a miss and is written again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from compare.formats.atomic import write_bytes_atomic, write_text_atomic

ENV = "FUSION_COMPARE_CACHE"
#: The modules whose source decides the cached values (a change to any of them is a new key).
SOURCES: tuple[str, ...] = (
    "problem/fixedbits.py",
    "problem/reference.py",
    "problem/golden.py",
    "problem/checkpoint.py",
    "run/cell.py",
    "problem/datacache.py",
)


def folder() -> Path | None:
    """The cache folder, or None when the cache is off."""
    where = os.environ.get(ENV, "")
    if where == "off":
        return None
    if where:
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fusion-compare"


def _source_digest() -> str:
    here = Path(__file__).resolve().parents[1]  # compare/
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()


def key(kind: str, what: dict[str, Any]) -> str:
    """The entry name of ``kind`` (e.g. ``golden``, ``plain``) for ``what`` (a JSON-able description of the case)."""
    text = json.dumps({"kind": kind, "what": what, "source": _source_digest()}, sort_keys=True)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


#: A tensor of at least this many bytes is left on disk by :func:`load` with ``lazy`` and by :func:`spill` (a
#: :class:`Stored`); a smaller one is read into memory (every built-in preset's: ``blog-mlp``'s largest, 50 MB).
LAZY_BYTES = 1 << 26


def load(name: str, lazy: bool = False) -> dict[str, Any] | None:
    """The tensors of entry ``name``, or None (cache off, no entry, or an entry that cannot be read). ``lazy``: each
    of :data:`LAZY_BYTES` or more a :class:`Stored`, read from the file when asked (the gate reads a block of rows at
    a time), for entries of float types (every entry the cache holds)."""
    d = folder()
    if d is None:
        return None
    path = d / f"{name}.safetensors"
    if not path.is_file():
        return None
    try:
        got = _stored(path, LAZY_BYTES if lazy else None)
        return got if lazy else {k: np.asarray(v) for k, v in got.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # truncated or foreign: a miss, written again
        return None


#: safetensors' dtype names of the float types an entry holds.
_DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}


class Stored:
    """One tensor of a cache entry, on disk: ``shape``, ``dtype`` and its bytes at ``offset`` of an open file (a
    descriptor held while the object lives: an entry replaced or removed meanwhile is still read as it was). The gate
    reads it a block of rows at a time (``read_rows``, ``compare.gate.stream``) and never holds it whole; ``numpy``
    reads it whole (``np.asarray``)."""

    def __init__(self, file: _File, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self._file, self.offset, self.dtype, self.shape = file, offset, dtype, shape
        self.ndim, self.size = len(shape), int(np.prod(shape))
        self.nbytes = self.size * dtype.itemsize

    def _read(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=self.dtype)
        view, at = out.view(np.uint8).data, self.offset + start * self.dtype.itemsize
        got = 0
        while got < len(view):
            n = os.preadv(self._file.fd, [view[got:]], at + got)
            if n <= 0:
                raise OSError(f"a cache entry ended early: {got} of {len(view)} bytes at {at}")
            got += n
        return out

    def read_rows(self, i0: int, i1: int) -> np.ndarray:
        """Rows ``[i0, i1)`` of the tensor seen as ``[-1, last dim]`` (a vector: one column)."""
        cols = self.shape[-1] if self.ndim > 1 else 1
        return self._read(i0 * cols, (i1 - i0) * cols).reshape(i1 - i0, cols)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self._read(0, self.size).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)


class _File:
    """An open file, closed when the last :class:`Stored` of it goes."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self) -> None:
        os.close(self.fd)


def _stored(path: Path, lazy_bytes: int | None) -> dict[str, Any]:
    """Every tensor of the safetensors file ``path``: a :class:`Stored` where it has ``lazy_bytes`` or more (None:
    none: every one read), else read. The format is the one ``safetensors`` writes (``compare.problem.checkpoint``
    reads it by hand too: ``safetensors.numpy`` has no bfloat16); a tensor whose bytes lie past the file's end
    raises ``OSError`` when read."""
    file = _File(path)
    n = int.from_bytes(os.pread(file.fd, 8, 0), "little")
    if not 0 < n <= min(os.fstat(file.fd).st_size - 8, 100 << 20):
        raise ValueError(f"{path} is not a safetensors file: a header of {n} bytes")
    header = json.loads(os.pread(file.fd, n, 8))
    out: dict[str, Any] = {}
    for k, e in header.items():
        if k != "__metadata__":
            t = Stored(file, 8 + n + int(e["data_offsets"][0]), _DTYPES[e["dtype"]], tuple(e["shape"]))
            out[k] = t if lazy_bytes is not None and t.nbytes >= lazy_bytes else np.asarray(t)
    return out


def save(name: str, tensors: dict[str, np.ndarray]) -> None:
    """Write entry ``name`` (atomically); a cache that cannot be written (read-only, full) is left as it is."""
    d = folder()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(d / f"{name}.safetensors", lambda f: _write(f, tensors))
    except OSError:  # the cache is an optimisation: the caller already holds the values
        return


def spill(tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """``tensors`` moved to disk: written to a file of the cache folder, read back as :class:`Stored` and unlinked at
    once (the open descriptor keeps the data until the last :class:`Stored` goes; nothing stays behind). For data that
    is no pure function of the case and is read a block at a time (a fresh draw's float64 reference, 1.4 GB on a
    Llama 3 8B layer). Where the cache is off or cannot be written: ``tensors`` as they are."""
    d = folder()
    if d is None or all(np.asarray(v).nbytes < LAZY_BYTES for v in tensors.values()):
        return tensors
    path = d / f"spill-{os.getpid()}-{next(_SPILLS)}.safetensors"
    try:
        d.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            _write(f, tensors)
        return _stored(path, LAZY_BYTES)
    except OSError:
        return tensors
    finally:
        path.unlink(missing_ok=True)


_SPILLS = itertools.count()
#: safetensors' names of the dtypes an entry may hold.
_NAMES: dict[np.dtype[Any], str] = {v: k for k, v in _DTYPES.items()}


def _write(f: BinaryIO, tensors: dict[str, np.ndarray]) -> None:
    """``tensors`` in the safetensors format, written from the arrays themselves (``safetensors.numpy.save`` copies
    each into a bytes object first: 1.4 GB more for a Llama 3 8B layer's reference): an 8-byte length, the JSON
    header (padded with spaces to 8 bytes, as safetensors pads it), the data in the header's order."""
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    header, at = {}, 0
    for k, v in arrays.items():
        header[k] = {"dtype": _NAMES[v.dtype], "shape": list(v.shape), "data_offsets": [at, at + v.nbytes]}
        at += v.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    f.write(len(text).to_bytes(8, "little") + text)
    for v in arrays.values():
        f.write(v.view(np.uint8).data)


def source_digest(paths: list[str]) -> str:
    """A sha256 of the source of the modules ``paths`` (relative to the project root, files or folders: every
    ``.py`` below a folder, in sorted order), for a key whose value depends on more than :data:`SOURCES`."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in paths:
        p = root / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def load_json(name: str) -> Any:
    """The JSON value of entry ``name``, or None (cache off, no entry, or one that cannot be read or parsed)."""
    d = folder()
    if d is None:
        return None
    path = d / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # absent, truncated or foreign: a miss
        return None


def save_json(name: str, value: Any) -> None:
    """Write entry ``name`` as JSON (atomically); a cache that cannot be written is left as it is."""
    d = folder()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / f"{name}.json", json.dumps(value, sort_keys=True, allow_nan=True))
    except OSError:  # the cache is an optimisation: the caller already holds the value
        return
