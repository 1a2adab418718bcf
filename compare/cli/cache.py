"""The data cache on the command line (``compare.problem.datacache``): ``--data-cache-max SIZE`` on the commands that
write it (``run``, ``profile``, ``sweep``, ``prepare``, ``cache``), each of them run inside one
:func:`~compare.problem.datacache.run_scope` (what they use is never trimmed while they run), the line a run prints
on what it added, and ``python -m compare cache``: where the cache is, its size against its bound, its entries by
kind and the largest; ``--trim`` trims it to the bound, ``--clear`` empties it."""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import os
import shutil
from pathlib import Path
from typing import Any

from compare.cli.args import sub
from compare.formats.markdown import si
from compare.problem import datacache
from compare.problem.cases import InputError
from compare.results.document import Results
from compare.results.environment import DataCacheUse
from compare.run import exitcodes

#: Entries ``cache`` lists by size.
LARGEST = 5
#: The GPU build's folder under the cache (``compare.gpu_build.records``): its records and Triton's cache, outside
#: the bound, emptied by ``--clear``.
GPU_BUILD = "gpu-build"


def add_data_cache_arg(p: argparse.ArgumentParser) -> None:
    """``--data-cache-max SIZE``: the data cache's bound for this command (and its worker processes)."""
    p.add_argument(
        "--data-cache-max",
        metavar="SIZE",
        help=f"the data cache's size bound (e.g. 20GB, 10G, 512MiB; 0 keeps only what this command uses): least "
        f"recently used entries are removed past it (default: ${datacache.MAX_ENV}, else "
        f"{si(datacache.DEFAULT_MAX, 'B')})",
    )


def run_in_scope(a: argparse.Namespace) -> int:
    """Command ``a.fn`` inside a :func:`~compare.problem.datacache.run_scope` where it has ``--data-cache-max``,
    its bound checked first (``--data-cache-max``, else ``$FUSION_COMPARE_CACHE_MAX``: a bad one raises InputError,
    exit 2) and given to its worker processes through the variable; a command without the option runs as it is."""
    if not hasattr(a, "data_cache_max"):
        return int(a.fn(a))
    given = a.data_cache_max
    if given is not None:
        datacache.parse_bound(given, "--data-cache-max")
    old = os.environ.get(datacache.MAX_ENV)
    try:
        if given is not None:
            os.environ[datacache.MAX_ENV] = given
        datacache.bound()
        with datacache.run_scope():
            return int(a.fn(a))
    finally:
        if old is None:
            os.environ.pop(datacache.MAX_ENV, None)
        else:
            os.environ[datacache.MAX_ENV] = old


def use_record() -> DataCacheUse | None:
    """The data cache trimmed to its bound and what this command did to it, as a results document records it (None
    outside a :func:`~compare.problem.datacache.run_scope`)."""
    use = datacache.run_use()
    if use is None:
        return None
    if use.folder is None:
        return DataCacheUse(off=True)
    return DataCacheUse(added=use.added, removed=use.removed, size=use.size, bound=use.bound)


def use_line(record: DataCacheUse | None) -> str:
    """The line a command prints on the data cache ("" outside a scope)."""
    if record is None:
        return ""
    where = "" if record.off else f" ({datacache.folder()})"
    return f"data cache: {record.describe()}{where}"


def with_use(doc: Results) -> Results:
    """``doc`` (a run's or a sweep's document, before it is written) with what the command did to the data cache in
    its environment (:func:`use_record`: the cache trimmed to its bound first), that said on a line of its own;
    ``doc`` as it is outside a data cache scope."""
    use = use_record()
    if use is None:
        return doc
    print(use_line(use), flush=True)
    return dataclasses.replace(doc, environment=dataclasses.replace(doc.environment, data_cache=use))


def cmd_cache(a: argparse.Namespace) -> int:
    """Print the data cache's state; ``--trim`` first trims it to its bound, ``--clear`` first empties it (every
    entry, stale file and the GPU build's folder), each saying what it freed. The cache off: the state says so, and
    ``--trim`` or ``--clear`` is refused (exit 2)."""
    d = datacache.folder()
    if d is None:
        if a.clear or a.trim:
            raise InputError(f"the data cache is off (${datacache.ENV}=off): there is nothing to {_verb(a)}")
        print(f"data cache: off (${datacache.ENV}=off): nothing is kept")
        return exitcodes.OK
    if a.clear:
        n, freed = clear(d)
        print(f"cleared {d}: removed {n} files, {si(freed, 'B')} freed")
    elif a.trim:
        t = datacache.trim()
        print(
            f"trimmed {d} to its {si(t.bound, 'B')} bound: removed {t.removed} entries ({si(t.freed, 'B')}) and "
            f"{t.stale} stale files ({si(t.stale_bytes, 'B')})"
        )
    for line in describe(d):
        print(line)
    return exitcodes.OK


def _verb(a: argparse.Namespace) -> str:
    return "clear" if a.clear else "trim"


def clear(d: Path) -> tuple[int, int]:
    """Remove every entry of the cache folder ``d``, its spill and temporary files and the GPU build's folder; the
    files removed and their bytes. Files of other names are left (the folder may be one the user shares)."""
    n = freed = 0
    paths = [d / e.file for e in datacache.entries(d)]
    with contextlib.suppress(OSError):
        paths += [Path(e.path) for e in os.scandir(d) if _leftover(e.name)]
    for path in paths:
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            path.unlink()
            n, freed = n + 1, freed + size
    build = d / GPU_BUILD
    if build.is_dir() and not build.is_symlink():
        for path in [p for p in build.rglob("*") if p.is_file() or p.is_symlink()]:
            with contextlib.suppress(OSError):
                size = 0 if path.is_symlink() else path.stat().st_size
                path.unlink()
                n, freed = n + 1, freed + size
        shutil.rmtree(build, ignore_errors=True)  # the folders left
    return n, freed


def _leftover(name: str) -> bool:
    """A spill file or an atomic write's temporary file, live or stale."""
    spill = name.startswith("spill-") and name.endswith(".safetensors")
    return spill or (name.startswith(".") and name.endswith(".tmp"))


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def describe(d: Path) -> list[str]:
    """The lines of ``cache``: the folder, its size against the bound, the entries by kind, the largest, stale files
    and the GPU build's folder."""
    found = datacache.entries(d)
    total, limit = sum(e.size for e in found), datacache.bound()
    source = f"${datacache.MAX_ENV}" if os.environ.get(datacache.MAX_ENV, "").strip() else "the default"
    over = "; over the bound: the next write or run trims it" if total > limit else ""
    lines = [
        f"data cache: {d}" + ("" if d.is_dir() else " (not made yet)"),
        f"size: {si(total, 'B')} of its {si(limit, 'B')} bound ({source}){over}",
    ]
    kinds: dict[str, list[int]] = collections.defaultdict(list)
    for e in found:
        kinds[e.kind].append(e.size)
    by_kind = sorted(kinds.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    lines.append(
        f"entries: {len(found)}"
        + (": " + ", ".join(f"{k} {len(v)} ({si(sum(v), 'B')})" for k, v in by_kind) if found else "")
    )
    if found:
        lines.append(f"largest ({min(LARGEST, len(found))}):")
        for e in sorted(found, key=lambda e: (-e.size, e.file))[:LARGEST]:
            used = datetime.datetime.fromtimestamp(e.used).astimezone().isoformat(timespec="seconds")
            lines.append(f"  {si(e.size, 'B'):>9}  {e.file}  (last used {used})")
    stale = datacache.stale(d) if d.is_dir() else []
    if stale:
        size = sum(_size(p) for p in stale)
        lines.append(f"stale: {len(stale)} files a crash left ({si(size, 'B')}): `cache --trim` removes them")
    build = d / GPU_BUILD
    if build.is_dir():
        size = sum(_size(p) for p in build.rglob("*") if p.is_file())
        lines.append(f"{GPU_BUILD}: {si(size, 'B')} (the GPU build's records and Triton's cache; outside the bound)")
    return lines


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``cache`` on an ``argparse`` subparsers object."""
    p = sub(
        subparsers,
        "cache",
        help="the data cache: where it is, its size against its bound, its entries (--trim, --clear)",
        description=__doc__,
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--trim", action="store_true", help="trim it to its bound first, least recently used first")
    how.add_argument(
        "--clear",
        action="store_true",
        help="empty it first: every entry, stale file and the GPU build's records (a later run computes them again)",
    )
    add_data_cache_arg(p)
    p.set_defaults(fn=cmd_cache)
    return p
