"""How busy the machine was while a run timed its steps: the load average, the CPU time other processes used and the
time the hypervisor gave other guests (steal), over one window, as a :class:`Load` record of the results document.

The sampler is two reads, no thread: :func:`start` before timing, :meth:`LoadSampler.stop` after. Both read
``/proc/stat``'s aggregate ``cpu`` line (clock ticks: ``user nice system idle iowait irq softirq steal ...``) and this
process's own CPU time (``os.times``: itself and the children it has waited for). Over the window, *others* is the
machine's busy time (``user + nice + system + irq + softirq``; ``guest`` is inside ``user``) less this process's own;
*steal* is the ``steal`` column's growth. Both are CPU seconds; their share of ``cores x window`` is what this run could
not have. What it cannot see: a child of this process still running at :meth:`~LoadSampler.stop` (not yet waited for)
counts as another process; the clock-tick granularity (1/``SC_CLK_TCK`` s per core, 10 ms on Linux) makes a share
over a window shorter than a second coarse; a busy *GPU* (another process's kernels) is not here at all. On a machine
without ``/proc/stat`` every figure is None and ``reason`` says why."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The share of the machine's CPU time (cores x window) that other processes and steal took together above which the
#: machine counts as busy: its timings' noise is wider than the samples' own spread shows (a run competes for cores
#: with what it does not see), and the report and ``diff`` say so.
BUSY_SHARE = 0.10
#: The largest share :meth:`Load.explained_ratio` believes: 1 / (1 - 0.99) = 100x.
MAX_SHARE = 0.99
#: ``/proc/stat`` aggregate columns that are CPU busy time (``guest`` and ``guest_nice`` are counted inside ``user``
#: and ``nice`` already); ``steal`` is column 7.
BUSY_COLUMNS = (0, 1, 2, 5, 6)
STEAL_COLUMN = 7


@dataclass(frozen=True)
class Load:
    """The machine's load over one window (the module docstring says how each figure is read): ``window_s`` wall
    seconds, ``cores`` the CPUs ``/proc/stat`` lists, ``loadavg_1m`` the 1-minute load average at the end,
    ``others_cpu_s`` the CPU seconds other processes used, ``steal_s`` the seconds the hypervisor took (None: the
    kernel does not report it). A figure that could not be read is None, and ``reason`` says why."""

    window_s: float | None = None
    cores: int | None = None
    loadavg_1m: float | None = None
    others_cpu_s: float | None = None
    steal_s: float | None = None
    reason: str = ""

    @property
    def taken_share(self) -> float | None:
        """The share of ``cores x window`` that other processes and steal took (0 = the machine was this run's;
        None: not measured)."""
        if self.others_cpu_s is None or not self.window_s or not self.cores:
            return None
        return (self.others_cpu_s + (self.steal_s or 0.0)) / (self.window_s * self.cores)

    @property
    def busy(self) -> bool:
        """Whether others took more than :data:`BUSY_SHARE` of the machine (False when not measured)."""
        share = self.taken_share
        return share is not None and share > BUSY_SHARE

    def explained_ratio(self) -> float:
        """The slowdown this load can explain: on a busy machine (:attr:`busy`) any, ``inf``: a step whose threads
        wait on each other (a barrier in a parallel GEMM) loses far more than its share when one thread is
        descheduled (25x was seen for torch-eager on a 2-core machine with one core taken), so a busy run cannot
        tell a regression from its load; below that, the fair share's ``1 / (1 - share)`` (share capped at
        :data:`MAX_SHARE`); 1.0 when not measured."""
        share = self.taken_share
        if share is None:
            return 1.0
        return math.inf if self.busy else 1.0 / (1.0 - min(max(share, 0.0), MAX_SHARE))

    def describe(self) -> str:
        """One line for the report and ``diff``: what others took, steal and the load average, or why unknown."""
        share = self.taken_share
        if share is None or self.cores is None or self.window_s is None:
            return f"not measured ({self.reason or 'no load record'})"
        steal = "steal not reported" if self.steal_s is None else f"steal {self.steal_s:.2f} s"
        avg = "" if self.loadavg_1m is None else f", load average {self.loadavg_1m:.2f} (1 min)"
        return (
            f"other processes and steal took {share:.0%} of {self.cores} cores over {self.window_s:.1f} s "
            f"(others {self.others_cpu_s:.2f} CPU s, {steal}){avg}" + (": busy" if self.busy else "")
        )


def busier(*loads: Load | None) -> Load | None:
    """The load that took the largest share of its machine, of those measured (None: none was)."""
    measured = [x for x in loads if x is not None and x.taken_share is not None]
    return max(measured, key=lambda x: x.taken_share or 0.0) if measured else None


def own_cpu_s() -> float:
    """This process's CPU seconds: its own and its waited-for children's, user and system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class _Stat:
    """One read of ``/proc/stat``'s aggregate line: busy and steal ticks (steal None where the line lacks it)."""

    busy: int
    steal: int | None
    cores: int


def _read_stat(path: Path) -> _Stat:
    """The aggregate ``cpu`` line and the number of ``cpuN`` lines of a ``/proc/stat`` text; ``OSError`` or
    ``ValueError`` where it cannot be read."""
    lines = path.read_text().splitlines()
    head = next((ln.split()[1:] for ln in lines if ln.split()[:1] == ["cpu"]), None)
    if head is None or len(head) < 4:
        raise ValueError(f"{path} has no aggregate 'cpu' line")
    ticks = [int(x) for x in head]
    cores = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    busy = sum(ticks[i] for i in BUSY_COLUMNS if i < len(ticks))
    return _Stat(busy, ticks[STEAL_COLUMN] if len(ticks) > STEAL_COLUMN else None, cores)


def _loadavg(proc: Path) -> float | None:
    """The 1-minute load average: ``proc/loadavg``'s first field, else ``os.getloadavg`` (None where neither)."""
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class LoadSampler:
    """One window's load (module docstring): :meth:`start`, then :meth:`stop` for the :class:`Load`. ``proc`` is the
    ``/proc`` to read, ``own`` this process's CPU seconds, ``clock`` the wall clock (each replaceable in tests)."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        own: Callable[[], float] = own_cpu_s,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.proc, self.own, self.clock = proc, own, clock
        self._t0 = self._own0 = 0.0
        self._stat0: _Stat | None = None
        self._why = "not started"

    def start(self) -> LoadSampler:
        self._t0, self._own0 = self.clock(), self.own()
        try:
            self._stat0, self._why = _read_stat(self.proc / "stat"), ""
        except (OSError, ValueError) as exc:
            self._stat0, self._why = None, f"no CPU accounting: {exc}"
        return self

    def stop(self) -> Load:
        window, own = self.clock() - self._t0, self.own() - self._own0
        avg = _loadavg(self.proc)
        if self._stat0 is None:
            return Load(window_s=window, loadavg_1m=avg, reason=self._why)
        try:
            end = _read_stat(self.proc / "stat")
        except (OSError, ValueError) as exc:
            return Load(window_s=window, loadavg_1m=avg, reason=f"no CPU accounting: {exc}")
        hz = os.sysconf("SC_CLK_TCK")
        # ticks -> seconds; a small negative is the ticks' rounding against os.times' (10 ms a core): 0
        others = max(0.0, (end.busy - self._stat0.busy) / hz - own)
        steal = None if end.steal is None or self._stat0.steal is None else (end.steal - self._stat0.steal) / hz
        return Load(window, end.cores or None, avg, others, steal)


def start(proc: Path = Path("/proc")) -> LoadSampler:
    """A :class:`LoadSampler` started now: call ``.stop()`` after the timed window for its :class:`Load`."""
    return LoadSampler(proc).start()
