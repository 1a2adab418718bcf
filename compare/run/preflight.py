"""Checks that run before anything is measured: a bad argument must cost seconds, not the measurements before it.

``run`` and ``sweep`` call these after parsing their arguments and before the first backend runs: the output
folder can be created and written (:func:`prepare_out_dir`) and is not in use by another command (:func:`lock_folder`),
a ``--history`` folder can take an entry (:func:`check_history`),
the cases fit in this machine's memory (:func:`check_memory`), and the committed golden files they use are intact
(:func:`check_golden`). Each failure raises :class:`~compare.problem.cases.InputError` (or ``GoldenError``): exit status
2.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from compare.backends.registry import BackendSpec, module_file
from compare.cost.model import ITEMSIZE
from compare.formats.atomic import write_bytes_new
from compare.formats.markdown import si
from compare.problem import checkpoint, datacache, golden
from compare.problem.cases import Case, InputError
from compare.results import environment
from compare.run.pipeline import KEPT_CALLS

LOCK_FILE = ".lock"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def prepare_out_dir(path: Path, option: str = "--out") -> Path:
    """Create the output folder ``path`` (with its parents) and prove a file can be written in it."""
    try:
        if path.exists() and not path.is_dir():
            raise InputError(f"{option} {path} exists and is not a folder")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create output folder {path} ({option}): {_reason(exc)}") from exc
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-") as f:
            f.write(b"ok")
            f.flush()
    except OSError as exc:
        raise InputError(f"cannot write in output folder {path} ({option}): {_reason(exc)}") from exc
    return path


def check_history(path: Path) -> Path:
    """Prove that the history folder ``path`` (``--history``) can take an entry as ``compare.results.history`` writes
    one: the folder is made and a probe file is created there without replacing anything (a hard link, which some
    file systems refuse) and removed again."""
    prepare_out_dir(path, "--history")
    probe = path / f".history-probe-{os.getpid()}"
    try:
        write_bytes_new(probe, b"ok")
    except OSError as exc:
        raise InputError(
            f"cannot add an entry to history folder {path} (--history): {_reason(exc)}; entries are created by a "
            "hard link, never replacing a file"
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return path


def check_file_writable(path: Path, option: str = "--out") -> Path:
    """Prove that the file ``path`` can be (re)written: its folder is prepared, and it is not itself a folder."""
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give a file name")
    prepare_out_dir(path.parent, option)
    return path


def _holder(fd: int, wait_s: float = 0.5) -> str:
    """The holder's line of a lock file held by another process. The holder writes it right after it takes the lock,
    so a command started at the same moment can find the file still empty: it reads again for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        line = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        if line or time.monotonic() >= deadline:
            return line
        time.sleep(0.01)


@contextlib.contextmanager
def lock_folder(path: Path, command: str = "run") -> Iterator[None]:
    """Hold the output folder's one lock, ``<path>/.lock``, while inside: every command that writes a folder
    (``run``, ``sweep``, ``tp-job``, ``tp-collect``, ``report``) takes it for its whole run, so a second one into
    the same folder is refused (bad input), naming the holder's pid and command line, which the holder writes into
    the file once it holds the lock.

    The lock is released by the kernel when the process ends, however it ends; the file itself stays.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    lock = path / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(f"cannot create the lock file {lock}: {_reason(exc)}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = _holder(fd) or "a process starting up"
            raise InputError(
                f"{path} is in use by another command ({holder}); wait for it or use another --out"
            ) from exc
        with contextlib.suppress(OSError):  # who holds it, for the message above; a full disk must not stop the run
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: python -m compare {command}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def held_bytes(case: Case, timed: int, backward: bool) -> int:
    """What a run holds for certain at the end of timing ``timed`` backends of ``case`` together (in one process),
    beside the frameworks' own tensors: the golden inputs and weights (float32), its float64 reference (a tensor of
    ``compare.problem.datacache.LAZY_BYTES`` or more is read from the data cache a block at a time, not held, while
    the cache is on), the plain computation's outputs and gradients (in the dtype's width:
    ``compare.problem.reference.held``), and per backend the copy of the inputs and weights its ``prepare`` got
    (float32: ``Golden.problem``) and the outputs its feed keeps to judge (``compare.run.pipeline.KEPT_CALLS``, in the
    dtype's width: ``compare.gate.fresh.compact``; a large one spilled to disk). A lower bound: the frameworks' own
    copies, the golden computation's working set and the cache flush's buffer are not counted."""
    n_in, n_out, n_w = case.elements()
    sizes = [n_out] + ([n_in, *(math.prod(s) for s in case.weight_shapes().values())] if backward else [])
    width = ITEMSIZE[case.dtype]
    on_disk = datacache.folder() is not None

    def in_memory(item: int) -> int:  # elements of the judged tensors held in memory at ``item`` bytes an element
        return sum(n for n in sizes if not (on_disk and item * n >= datacache.LAZY_BYTES))

    problem = 4 * (n_in + n_out + n_w)  # x, dy, the weights (float32)
    per_backend = problem + KEPT_CALLS * width * in_memory(width)
    return problem + 8 * in_memory(8) + width * sum(sizes) + timed * per_backend


def check_memory(
    cases: Iterable[Case],
    specs: Sequence[BackendSpec] = (),
    backward: bool = True,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuse a case whose :meth:`~compare.problem.cases.Case.estimated_bytes`, or with ``specs`` timed together in
    this process (those that implement its model; a tensor-parallel one runs in its own workers) its
    :func:`held_bytes`, exceed the memory available now.

    Cases run one after another, so each is checked alone. Where the available memory cannot be read, nothing is
    refused.
    """
    available = available if available is not None else environment.available_memory_bytes()
    if available is None:
        return
    free, source = available
    for case in cases:
        timed = sum(case.model in s.models and not s.runtime for s in specs)
        need = max(case.estimated_bytes(), held_bytes(case, timed, backward))
        if need > free:
            each = f" and, for each of the {timed} backends timed together, its inputs, weights and kept outputs"
            raise InputError(
                f"case {case.name} needs at least {si(need, 'B')} ({need:,} bytes) of memory for its "
                f"golden data, float64 reference and plain computation{each if timed else ''}, but only "
                f"{si(free, 'B')} ({free:,} bytes) are available ({source}); choose smaller sizes"
                f"{' or fewer backends' if timed > 1 else ''}"
            )


def check_golden(cases: Iterable[Case]) -> None:
    """Verify the committed golden files the cases use (manifest readable, hashes matching) before measuring.

    A truncated or edited ``MANIFEST.json`` or golden file raises ``GoldenError`` naming it (exit status 2).
    """
    for case in dict.fromkeys(cases):
        if golden.is_committed(case):
            golden.verify_file(f"{case.name}.safetensors")


def check_cases(cases: Iterable[Case], backward: bool = True) -> None:
    """What a case reads from the user's files, checked before anything is measured and after the memory check
    (:func:`check_memory`: a module is built here at its real size): a checkpoint's parameters
    against each case (names, shapes, dtypes: ``compare.problem.checkpoint.check``) and, once per module file and
    dtype (token counts share them), that the plain computation has a rule for every op of its module's forward and,
    with ``backward`` (a mode that needs gradients), its backward, and the file's own ``reference``, where it has
    one, against the golden. A mismatch raises :class:`InputError` naming both sides; an op without a rule, naming
    the file and the op."""
    cases = list(cases)
    checkpoint.check(cases)
    for case in {(c.module, c.dtype): c for c in cases if c.module is not None}.values():
        module_file().check_module(case)
        module_file().check_plain(case, backward)
        module_file().check_reference(case)
