"""A disk cache for data that is a pure function of the case: generated golden data and the plain computation.

Both are deterministic and the same bits on every machine (``compare.problem.fixedbits``), and costly on a large case (a
``cpu-mlp`` golden and its plain computation take tens of seconds on a 2-core CPU), and every process of a
tensor-parallel group or a sweep needs them. An entry is a safetensors file (no pickle) under
``$FUSION_COMPARE_CACHE`` (default ``$XDG_CACHE_HOME/fusion-compare``, else ``~/.cache/fusion-compare``; ``off``
disables the cache), named by a sha256 of what it is (``kind``, the case) and of the source of every module that
computes it, so a changed formula misses the cache instead of reading a stale answer. Writes are atomic; an entry
that cannot be read (truncated, foreign) is a miss and is written again.

The cache has a size bound (:func:`bound`: ``$FUSION_COMPARE_CACHE_MAX``, default :data:`DEFAULT_MAX`). After every
write, and at the end of a command of the command line, :func:`trim` removes entries least recently used first (a
hit refreshes an entry's modification time: access times are often not kept) until the cache fits, never one this
process read or wrote, nor one used since the command began (:func:`run_scope`: its worker processes inherit the
time in ``$FUSION_COMPARE_CACHE_SINCE``): a run never evicts its own data, and where its own data alone exceeds the
bound it is kept and the run says so (:func:`run_use`). Trimming also removes what a crash left behind: the spill
file of a process that is gone and an atomic write's temporary file untouched for an hour. An entry a concurrent run
read before this command began may be removed; that run computes it again when it needs it next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import mmap
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from compare.formats.atomic import write_bytes_atomic, write_text_atomic
from compare.problem.cases import InputError

ENV = "FUSION_COMPARE_CACHE"
#: The variable of the cache's size bound (:func:`bound`).
MAX_ENV = "FUSION_COMPARE_CACHE_MAX"
#: The variable holding when the command a process works for began (seconds since the epoch; :func:`run_scope`).
SINCE_ENV = "FUSION_COMPARE_CACHE_SINCE"
#: The modules whose source decides the cached values (a change to any of them is a new key).
SOURCES: tuple[str, ...] = (
    "problem/fixedbits.py",
    "problem/reference.py",
    "problem/moe.py",
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
        if not lazy:
            got = {k: np.asarray(v) for k, v in got.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # truncated or foreign: a miss, written again
        return None
    _used(path)
    return got


#: safetensors' dtype names of the float types an entry holds.
_DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}


#: Bytes of a :class:`Stored` tensor read through the memory map before its pages are handed back (``madvise``):
#: what a pass over it adds to the process's resident memory at most, however large the tensor (one ``madvise`` per
#: 8 MB read: nothing next to the pass).
RELEASE_BYTES = 1 << 23


class Stored:
    """One tensor of a cache entry, on disk: ``shape``, ``dtype`` and its bytes at ``offset`` of an open file (a
    descriptor held while the object lives: an entry replaced or removed meanwhile is still read as it was). The gate
    reads it a block of rows at a time (``read_rows``, ``compare.gate.stream``) through the file's memory map, without
    a copy, and never holds it whole: the pages a pass has read are handed back every :data:`RELEASE_BYTES` (the page
    cache keeps them for the next pass), and a new pass hands back the last one's; ``numpy`` reads it whole
    (``np.asarray``)."""

    def __init__(self, file: _File, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self._file, self.offset, self.dtype, self.shape = file, offset, dtype, shape
        self.ndim, self.size = len(shape), int(np.prod(shape))
        self.nbytes = self.size * dtype.itemsize
        self._held_from = offset  # where the pages this object's reads may have made resident begin

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
        """Rows ``[i0, i1)`` of the tensor seen as ``[-1, last dim]`` (a vector: one column): a read-only view of the
        file's memory map."""
        cols = self.shape[-1] if self.ndim > 1 else 1
        count, at = (i1 - i0) * cols, self.offset + i0 * cols * self.dtype.itemsize
        if not count:
            return np.empty((0, cols), dtype=self.dtype)
        rows = np.frombuffer(self._file.map(), dtype=self.dtype, count=count, offset=at).reshape(i1 - i0, cols)
        if at < self._held_from:  # a new pass from an earlier row: the last one's pages go
            self._file.release(self._held_from, self.offset + self.nbytes)
            self._held_from = at
        elif at - self._held_from >= RELEASE_BYTES:
            self._held_from = self._file.release(self._held_from, at)
        return rows

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self._read(0, self.size).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)


class _File:
    """An open file and its read-only memory map (made at the first :meth:`Stored.read_rows`), closed when the last
    :class:`Stored` of it goes and the last view of the map is gone (an array read from it holds the map)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self._map: mmap.mmap | None = None

    def map(self) -> mmap.mmap:
        if self._map is None:
            self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        return self._map

    def release(self, start: int, end: int) -> int:
        """The whole pages of ``[start, end)`` handed back (``MADV_DONTNEED``: read again, they come back from the
        page cache, unchanged); where the pages not handed back begin."""
        lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if self._map is not None and hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return max(hi, start)

    def __del__(self) -> None:
        os.close(self.fd)


def _stored(path: Path, lazy_bytes: int | None) -> dict[str, Any]:
    """Every tensor of the safetensors file ``path``: a :class:`Stored` where it has ``lazy_bytes`` or more (None:
    none: every one read), else read. The format is the one ``safetensors`` writes (``compare.problem.checkpoint``
    reads it by hand too: ``safetensors.numpy`` has no bfloat16); a tensor whose bytes lie past the file's end
    raises ``OSError`` here (its memory map could not read them)."""
    file = _File(path)
    n = int.from_bytes(os.pread(file.fd, 8, 0), "little")
    if not 0 < n <= min(os.fstat(file.fd).st_size - 8, 100 << 20):
        raise ValueError(f"{path} is not a safetensors file: a header of {n} bytes")
    header = json.loads(os.pread(file.fd, n, 8))
    out: dict[str, Any] = {}
    for k, e in header.items():
        if k != "__metadata__":
            t = Stored(file, 8 + n + int(e["data_offsets"][0]), _DTYPES[e["dtype"]], tuple(e["shape"]))
            if t.offset + t.nbytes > file.size:  # its map would end before its bytes do
                raise OSError(f"{path}: tensor {k} ends past the file's end")
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
    _USED.add(f"{name}.safetensors")
    _trim_after_write()


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
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # absent, truncated or foreign: a miss
        return None
    _used(path)
    return value


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
    _USED.add(f"{name}.json")
    _trim_after_write()


# The size bound, least recently used first (module docstring).

#: The bound where ``$FUSION_COMPARE_CACHE_MAX`` is unset: room for every built-in preset's data many times over
#: (``cpu-mlp``'s, the default report's, is about 0.1 GB a dtype) and for seven layers of Llama 3 8B (2.8 GB each: a
#: rerun of a few checkpoint layers hits), while a laptop's disk is never filled by what no run needs any more.
DEFAULT_MAX = 20 * 10**9
#: An atomic write's temporary file untouched this long belongs to a writer that is gone (a writer writes it
#: without a pause, then renames it).
STALE_S = 3600.0
#: An entry modified this long before the command began still counts as the command's (file times run on a coarser
#: clock than ``time.time``).
SLACK_S = 2.0
#: The units of a bound, as ``dd`` reads them: ``K``, ``M``, ``G``, ``T`` and the ``iB`` forms binary, ``kB``,
#: ``MB``, ``GB``, ``TB`` decimal.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{u: 1 << 10 * i for i, u in enumerate("kmgt", 1)},
    **{f"{u}ib": 1 << 10 * i for i, u in enumerate("kmgt", 1)},
    **{f"{u}b": 10 ** (3 * i) for i, u in enumerate("kmgt", 1)},
}
_ENTRY_SUFFIXES = (".safetensors", ".json")
_SPILL = re.compile(r"spill-(\d+)-\d+\.safetensors")
#: The names of the entries this process read or wrote (never trimmed by it).
_USED: set[str] = set()
#: When this process began, as far as it knows: the start of its command where no :func:`run_scope` says.
_STARTED = time.time()


def parse_bound(value: str, where: str) -> int:
    """A size bound in bytes from ``20GB``, ``10G``, ``512MiB``, ``0`` (:data:`_UNITS`); anything else is an
    :class:`~compare.problem.cases.InputError` naming ``where`` (the variable or the option)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise InputError(
            f"{where}: {value!r} is not a size; give a number with a unit, e.g. 20GB, 10G, 512MiB, or 0 (keep only "
            "what the running command uses); units: B, K/KiB, M/MiB, G/GiB, T/TiB (binary), kB, MB, GB, TB (decimal)"
        )
    return int(float(m.group(1)) * _UNITS[unit])


def bound() -> int:
    """The cache's size bound in bytes: ``$FUSION_COMPARE_CACHE_MAX`` (a bad value raises InputError naming it), else
    :data:`DEFAULT_MAX`."""
    value = os.environ.get(MAX_ENV, "")
    return parse_bound(value, MAX_ENV) if value.strip() else DEFAULT_MAX


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry on disk: its file name, its kind (``reference``, ``plain-fwd``, ``resolution``, ...: the name
    without its digest), its size in bytes and when it was last used (written or read: its modification time)."""

    file: str
    kind: str
    size: int
    used: float


def kind_of(file: str) -> str:
    """The kind of entry ``file``: its name less the suffix and the digest (``plain-fwd-3f2a...json``: ``plain-fwd``;
    an interpreted backend's verdict: ``interpreted-parity``)."""
    stem = file.removesuffix(".safetensors").removesuffix(".json")
    head, _, tail = stem.rpartition("-")
    kind = head if head and re.fullmatch(r"[0-9a-f]{16,}", tail) else stem
    return "interpreted-parity" if kind.startswith("interpreted-parity") else kind


def entries(d: Path | None = None) -> list[Entry]:
    """The entries in the cache folder ``d`` (default: :func:`folder`), oldest use first: its ``.safetensors`` and
    ``.json`` files, less spill and temporary files; none where the folder is off or absent."""
    d = folder() if d is None else d
    if d is None:
        return []
    out = []
    try:
        found = list(os.scandir(d))
    except OSError:
        return []
    for e in found:
        if e.name.startswith(".") or not e.name.endswith(_ENTRY_SUFFIXES) or _SPILL.fullmatch(e.name):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            st = e.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        out.append(Entry(e.name, kind_of(e.name), st.st_size, st.st_mtime))
    return sorted(out, key=lambda x: (x.used, x.file))


def _used(path: Path) -> None:
    """Entry ``path`` was read: a use (its modification time set to now; a cache that cannot be written keeps it)."""
    _USED.add(path.name)
    with contextlib.suppress(OSError):
        os.utime(path)


def run_started() -> float:
    """When the command this process works for began: ``$FUSION_COMPARE_CACHE_SINCE`` (:func:`run_scope`, inherited
    by its worker processes), else when this process imported this module."""
    try:
        return float(os.environ[SINCE_ENV])
    except (KeyError, ValueError):
        return _STARTED


def stale(d: Path) -> list[Path]:
    """What a crash left in the cache folder ``d``: spill files of a process that is gone (or untouched for
    :data:`STALE_S`) and atomic writes' temporary files untouched for :data:`STALE_S`."""
    now, out = time.time(), []
    try:
        found = list(os.scandir(d))
    except OSError:
        return []
    for e in found:
        spill = _SPILL.fullmatch(e.name)
        if not spill and not (e.name.startswith(".") and e.name.endswith(".tmp")):
            continue
        try:
            old = now - e.stat(follow_symlinks=False).st_mtime > STALE_S
        except OSError:
            continue
        if old or (spill is not None and not _alive(int(spill.group(1)))):
            out.append(Path(e.path))
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user's counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@dataclasses.dataclass(frozen=True)
class Trimmed:
    """What :func:`trim` did: the entries it removed and their bytes, the stale files it removed and their bytes,
    the entries' bytes left and the bound; ``kept`` the bytes of the entries it kept over the bound because the
    running command uses them."""

    removed: int = 0
    freed: int = 0
    stale: int = 0
    stale_bytes: int = 0
    size: int = 0
    bound: int = 0
    kept: int = 0


def trim(limit: int | None = None) -> Trimmed:
    """Trim the cache to ``limit`` bytes (default :func:`bound`, whose bad value raises InputError): the stale files
    (:func:`stale`) first, then the entries least recently used first, never one this process read or wrote or one
    used since the command began (:func:`run_started`). Nothing where the cache is off or absent."""
    d = folder()
    limit = bound() if limit is None else limit
    if d is None or not d.is_dir():
        return Trimmed(bound=limit)
    gone = sb = 0
    for path in stale(d):
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            path.unlink()
            gone, sb = gone + 1, sb + size
    found = entries(d)
    total, since = sum(e.size for e in found), run_started() - SLACK_S
    removed = freed = kept = 0
    for e in found:  # oldest use first
        if total <= limit:
            break
        if e.file in _USED or e.used >= since:
            kept += e.size
            continue
        path = d / e.file
        try:
            if path.stat().st_mtime >= since:  # used meanwhile, by a process of this command or another
                kept += e.size
                continue
            path.unlink()
        except FileNotFoundError:  # removed meanwhile
            pass
        except OSError:
            continue
        total, removed, freed = total - e.size, removed + 1, freed + e.size
    return Trimmed(removed, freed, gone, sb, total, limit, kept if total > limit else 0)


_WARNED: list[str] = []


def _trim_after_write() -> None:
    """:func:`trim` after a write; a bad bound is said once on stderr (the command line refuses it before it runs),
    and a cache that cannot be trimmed is left as it is (the cache is an optimisation)."""
    try:
        trim()
    except InputError as exc:
        if str(exc) not in _WARNED:
            _WARNED.append(str(exc))
            print(f"warning: the data cache is not trimmed: {exc}", file=sys.stderr)
    except OSError:
        pass


@dataclasses.dataclass(frozen=True)
class Use:
    """What one command did to the cache (:func:`run_use`): the bytes of the entries it added, the bytes of entries
    there when it began and gone at its end (trimmed by it or by another process meanwhile), the cache's size at the
    end and its bound; ``folder`` None: the cache was off. A write by another process meanwhile counts as added
    (``compare.results.environment.DataCacheUse`` is its record in a results document)."""

    folder: Path | None
    added: int = 0
    removed: int = 0
    size: int = 0
    bound: int = 0


@dataclasses.dataclass
class _Run:
    since: float
    before: dict[str, int]


_RUN: list[_Run] = []


@contextlib.contextmanager
def run_scope() -> Iterator[None]:
    """One command of the command line: from here on, what it (and every worker process it starts, through
    ``$FUSION_COMPARE_CACHE_SINCE``) uses is never trimmed, and :func:`run_use` measures against the entries there
    now. What this process used before it no longer counts as its own (a process that runs several commands keeps
    no entry for ever). The variable is restored at the end."""
    since, old = time.time(), os.environ.get(SINCE_ENV)
    _USED.clear()
    _RUN.append(_Run(since, {e.file: e.size for e in entries()}))
    os.environ[SINCE_ENV] = repr(since)
    try:
        yield
    finally:
        _RUN.pop()
        if old is None:
            os.environ.pop(SINCE_ENV, None)
        else:
            os.environ[SINCE_ENV] = old


def run_use() -> Use | None:
    """Trim the cache (:func:`trim`) and say what the command of the innermost :func:`run_scope` did to it; None
    outside one. A bad bound raises InputError."""
    if not _RUN:
        return None
    d = folder()
    if d is None:
        return Use(None)
    t = trim()
    now = {e.file: e.size for e in entries(d)}
    before = _RUN[-1].before
    added = sum(size for f, size in now.items() if f not in before)
    removed = sum(size for f, size in before.items() if f not in now)
    return Use(d, added, removed, sum(now.values()), t.bound)
