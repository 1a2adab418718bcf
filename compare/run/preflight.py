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
from dataclasses import dataclass, replace
from pathlib import Path

from compare.backends.registry import BackendSpec, module_file
from compare.cost.model import ITEMSIZE
from compare.formats.atomic import write_bytes_new
from compare.formats.markdown import si
from compare.problem import checkpoint, golden
from compare.problem.cases import Case, InputError, is_moe
from compare.results import environment

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


#: A run's own memory before any data: the interpreter with numpy, torch, JAX, Inductor and XLA loaded and the
#: ceilings' probes run. Measured: a 64 -> 96 module case through the five module backends peaks at 1.12 GB warm
#: (2-core Xeon VM, torch 2.13, jax 0.10.2), and at 2.41 GB with its 1.5 GB cold-cache flush.
BASE_BYTES = 1_000_000_000
#: The same for a run whose backends import no framework (numpy ones): the interpreter and numpy.
BASE_BYTES_NO_FRAMEWORK = 150_000_000


@dataclass(frozen=True)
class PeakPlan:
    """A run's predicted peak memory for one case: per phase (run one after another, each freeing what it made),
    what it holds in bytes by part; the peak is the base plus the largest phase.

    Counted from what the code holds, per element of the weights ``W`` and of the judged tensors ``E`` (``y``, and
    with a backward ``dx`` and every weight's gradient), ``d`` bytes an element of the case dtype:

    - every phase: the golden inputs and weights in float32 (``Golden``: 4 per element) and, from the plain
      computation on, its tensors: held in the dtype and unrounded in float32 (``d + 4`` per ``E``); in float32 for a
      model with an activation also its envelope twin (4) and signatures (``[2, ...]`` float64: 16);
    - ``golden``: the float64 module its reference is computed on, with its gradients (16 per ``E``), and one float64
      copy of the largest weight for ``compare.problem.fixedbits.matmul64``;
    - ``resolution``: the float64 computation with an error injected (16 per ``E``) and one float32 gradient (4);
    - ``timing``: per backend timed together its weights in the dtype (``d`` per ``W``: a step's float32 copy is
      released once it is built), one call's outputs in flight (``d`` per ``E``: one backend runs at a time), and
      the cold-cache flush's buffer (``compare.timing.llc.flush_bytes``) when cold samples are taken;
    - ``fresh``: the fresh draw's float64 reference (16 per ``E``, spilled to disk once made), then its plain
      computation: a float64 module (8 per ``W``), its unrounded tensors (4 per ``E``) and, where the case has
      twins, the envelope (4) and the signatures' three float64 runs and their differences (48). The steps are
      released by then.

    Measured against it (``scripts/real_layer.py`` prints both): within 20% on Llama-shaped layers of 2048 -> 8192
    and 4096 -> 14336 in bfloat16 and 2048 -> 8192 in float32. What it leaves out: the allocator's retained heap.
    glibc keeps freed blocks of up to 32 MB for reuse, and a layer whose weight tensors are smaller than that
    (Qwen2.5 0.5B's 8.7 MB) grows by up to 1.4 GB while it is timed, a third over this plan; fixing the allocator's
    threshold removed the growth but made every step 1.5 to 1.9 times slower, so a run keeps the default."""

    base: int
    phases: dict[str, dict[str, int]]

    @property
    def phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def peak(self) -> int:
        return self.base + sum(self.phases[self.phase].values())

    def describe(self) -> str:
        """The peak's phase and its parts, e.g. ``timing: base 1 GB, golden data 0.7 GB, ...``."""
        parts = ", ".join(f"{k} {si(v, 'B')}" for k, v in self.phases[self.phase].items() if v)
        return f"{self.phase}: base {si(self.base, 'B')}, {parts}"


def peak_plan(case: Case, timed: int, backward: bool, flush: int = 0, frameworks: bool = True) -> PeakPlan:
    """The :class:`PeakPlan` of ``case`` with ``timed`` backends timed together in this process, gradients with
    ``backward``, a cold-cache flush of ``flush`` bytes (0: warm only); ``frameworks``: some backend imports torch
    or JAX (:data:`BASE_BYTES`)."""
    n_in, n_out, n_w = case.elements()
    d, g = ITEMSIZE[case.dtype], int(backward)
    e = n_out + g * (n_in + n_w)  # the judged tensors' elements
    # envelope and signatures (``reference.plain_run``; a MoE case's plain computation has none)
    twins = case.dtype == "float32" and case.model != "linear" and not is_moe(case.model)
    golden = 4 * (n_w + n_in + n_out)
    plain = (d + 4 + (4 + 16) * twins) * e
    largest = max(math.prod(s) for s in case.weight_shapes().values())
    fresh_plain = 8 * n_w + (4 + (4 + 48) * twins) * e
    phases = {
        "golden": {"golden data": golden, "float64 reference": 16 * e + 8 * largest},
        "resolution": {"golden data": golden, "plain": plain, "float64 twin": 16 * e + 4 * g * n_w},
        "timing": {
            "golden data": golden,
            "plain": plain,
            f"{timed} backends' weights": timed * d * n_w,
            "a call's outputs": d * e if timed else 0,
            "cold-cache flush": flush if timed else 0,
        },
        "fresh": {"golden data": golden, "plain": plain, "fresh draw's reference": max(16 * e, fresh_plain)},
    }
    return PeakPlan(BASE_BYTES if frameworks else BASE_BYTES_NO_FRAMEWORK, phases)


def check_memory(
    cases: Iterable[Case],
    specs: Sequence[BackendSpec] = (),
    backward: bool = True,
    available: tuple[int, str] | None = None,
    flush: int = 0,
) -> None:
    """Refuse a case whose :func:`peak_plan` (with ``specs`` timed together in this process: those that implement
    its model; a tensor-parallel one runs in its own workers; ``flush``: the cold-cache flush's bytes) exceeds the
    memory available now, naming the phase, its parts, and what would fit (fewer backends, a narrower dtype, no
    cold-cache flush, fewer tokens).

    Cases run one after another, so each is checked alone. Where the available memory cannot be read, nothing is
    refused.
    """
    available = available if available is not None else environment.available_memory_bytes()
    if available is None:
        return
    free, source = available
    frameworks = not specs or any(s.framework in ("torch", "jax") for s in specs)
    for case in cases:
        timed = sum(case.model in s.models and not s.runtime for s in specs)
        plan = peak_plan(case, timed, backward, flush, frameworks)
        if plan.peak <= free:
            continue
        fits = [n for n in range(timed - 1, 0, -1) if peak_plan(case, n, backward, flush, frameworks).peak <= free]
        hints = [f"at most {fits[0]} backends" if fits else ""]
        if case.dtype == "float32":
            narrow = replace(case, dtype="bfloat16")
            if peak_plan(narrow, timed, backward, flush, frameworks).peak <= free:
                hints.append("--dtype bfloat16")
        if flush and peak_plan(case, timed, backward, 0, frameworks).peak <= free:
            hints.append("--cache warm (no cold-cache flush)")
        tokens = case.shape.batch * case.shape.seq
        one = peak_plan(_tokens(case, 1), timed, backward, flush, frameworks).peak
        if plan.peak - one >= plan.peak / 10:  # the tokens are a cost worth naming, not the weights alone
            for t in (tokens // 2**k for k in range(1, tokens.bit_length())):
                if peak_plan(_tokens(case, t), timed, backward, flush, frameworks).peak <= free:
                    hints.append(f"at most {t} tokens (--batch 1 --seq {t})")
                    break
        hint = " or ".join(h for h in hints if h) or "a smaller layer"
        raise InputError(
            f"case {case.name} needs about {si(plan.peak, 'B')} ({plan.peak:,} bytes) of memory at its peak "
            f"({plan.describe()}), but only {si(free, 'B')} ({free:,} bytes) are available ({source}); "
            f"try {hint}"
        )


def _tokens(case: Case, tokens: int) -> Case:
    """``case`` with ``tokens`` tokens in one sequence (its weights and dtype as they were)."""
    return replace(case, shape=replace(case.shape, batch=1, seq=tokens))


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
