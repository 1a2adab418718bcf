"""The A/B coordinator (``python -m compare ab``): the same backends, cases and modes in worker processes, K a side
(``Plan.workers``, default :data:`WORKERS`), each side's with its own interpreter, environment variables and
checkout (two virtual environments with other torch or jax versions, or two clones of this project at other
commits), all 2K timed in one interleaved group: every round runs one block of each backend of each worker, in an
order drawn for the round.

Why K: what differs between two processes of one build (XLA's thread pool placement, the memory layout, the compile)
stays for a process's whole life, and no order of rounds inside one pair of processes takes it out: A/A of the jitted
JAX backend on ``cpu-mlp`` with one worker a side had one at 32-34 ms and the other at 40 ms, called different in 3 of
8 trials. With K a side, the verdict (``compare.timing.significance.compare_processes``) takes the process as its unit
and calls a difference only beyond the spread between the processes of one side. Each worker's timing is kept
(``ab.json``'s per-process figures).

Each worker (``compare.run.ab_worker``) runs from its checkout (its working folder and ``PYTHONPATH``), says
first who it is (the checkout it imported ``compare`` from, which must be the side's; its commit and versions), and
stages each case and mode as a run does (``compare.run.harness.Staged``: the first calls judged by the gate against
the golden data, whose hash both sides must share, and the fresh draw of one seed both share). The coordinator then
runs the shared timer's interleaved rounds (``compare.timing.timer.measure_interleaved``: warm-up, block sizing,
rounds in an order drawn per round, the budget) over every backend of every worker, each block timed inside its
worker by that worker's clock (:class:`RemoteEntrant`): the pipe is never inside a sample, only the decision of what
runs next crosses it. The timings of a backend share the group and its round numbers. While timed, every worker's
main thread stays on one CPU drawn per case and mode (``compare.run.ab_worker.Worker.place``: left to the
scheduler, one side could stay the slower one for a whole trial, which no order of rounds undoes); the rows say which
(``ab_cpu``). Last, each
worker finishes its cells (profile, memory, its calls on the fresh draw judged) and sends back its results, to which
the coordinator adds the timings.

A worker that dies, hangs past a bound or cannot start makes an ``error`` row for its side, with the worker's exit
and the tail of its stderr; the other workers' cells are kept, and the next case and mode starts a new worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import random
import socket
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec
from compare.formats.codec import from_json, to_json
from compare.gate import fresh
from compare.problem.cases import Case
from compare.results import load as machine_load
from compare.results.ab import ABResults, Pair, Process, Side
from compare.results.document import Result
from compare.run import ab_worker, child, stop
from compare.timing import timer
from compare.timing.timer import Timing, TimingConfig

#: Worker processes a side by default: the fewest whose per-process medians the t-test of ``compare_processes`` can
#: judge with power (two a side: 53% for 1.84x at a 10% between-process spread; three: 99%), and whose A/A false
#: alarms stay under 2% a direction even when processes fall on two levels 25% apart at random. The cost: every
#: worker imports, stages (its float64 reference, its compile) and settles in turn, so ``ab --preset cpu-mlp --backend
#: torch-eager`` and the jitted JAX backend ``--no-profile`` took 118 s with three a side against 35 s with one, back
#: to back on a 2-core VM that others kept busy; the timed seconds are the same (a side's ``--budget`` is shared by
#: its workers).
WORKERS = 3
#: Seconds from a worker's start to its handshake (an interpreter importing ``compare``).
HANDSHAKE_S = 120.0
#: Seconds a worker may take to stage a case and mode (golden data, plain computation, first calls: a compile).
START_S = 900.0
#: Seconds one timed block may take before its worker is taken to hang.
BLOCK_S = 300.0
#: Seconds a worker may take to finish its cells (profile, memory, the fresh draw's reference and verdicts).
SETTLE_S = 900.0
#: Seconds a worker gets to exit after ``bye`` (or after its end of the socket closed) before its group is ended.
EXIT_S = 5.0


#: Set in each worker's environment unless this one or the side's variables set them: an idle side's thread pools
#: go to sleep at once instead of spinning. Two processes take turns here, and a pool that spins after its block
#: (OpenBLAS's for about 2^28 cycles, GNU OpenMP's for 300,000 turns) takes the cores from the other side's next
#: block: on a 2-core machine numpy-plain's ``tiny`` step read 50 to 90 ms instead of 3 ms, and torch-eager's
#: samples spread over +/-150% instead of +/-15%. Both sides get the same; the user's values win.
QUIET_IDLE: dict[str, str] = {"OMP_WAIT_POLICY": "passive", "KMP_BLOCKTIME": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}


def side_env(env: dict[str, str], here: Mapping[str, str] | None = None) -> dict[str, str]:
    """A side's variables over this environment (``here``, default ``os.environ``): ``env`` with every
    :data:`QUIET_IDLE` variable that neither sets, first."""
    here = os.environ if here is None else here
    return {**{k: v for k, v in QUIET_IDLE.items() if k not in here and k not in env}, **env}


class SideDown(Exception):
    """A side's worker is gone, hangs, or refused the job: the message says how (its exit, its stderr's tail)."""


@dataclass
class Remote:
    """The coordinator's handle on one side's worker: started on demand (:meth:`ensure`, again after it died), asked
    one message at a time (:meth:`ask`), every wait bounded."""

    side: Side
    proc: child.Child | None = None
    channel: ab_worker.Channel | None = None
    ready: bool = False
    #: why the last worker is gone ("": none was lost)
    lost: str = ""
    #: whether a worker of this side ever said who it is
    greeted: bool = False
    #: the process id its last worker said in its handshake (0: none said)
    pid: int = 0

    def spawn(self) -> None:
        """Start the worker: the side's interpreter, in its checkout, with its variables over this environment."""
        mine, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": self.side.path, **self.side.env}
        cmd = [self.side.python, "-m", "compare.run.ab_worker", str(theirs.fileno())]
        try:
            self.proc = child.start(cmd, env=env, cwd=self.side.path, pass_fds=[theirs.fileno()])
        except OSError as exc:
            mine.close()
            self.lost = f"its worker could not start ({self.side.python}): {exc}"
            raise SideDown(self.lost) from exc
        finally:
            theirs.close()
        self.channel, self.ready = ab_worker.Channel(mine), False

    def ensure(self) -> None:
        """A worker that has said who it is: started (again) when there is none or it has exited, then its handshake
        read and checked (:meth:`_greet`); :class:`SideDown` when it cannot be had."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.spawn()
        if not self.ready:
            self._greet(self._receive(HANDSHAKE_S, "its handshake"))
            self.ready = self.greeted = True

    def _greet(self, hello: dict[str, Any]) -> None:
        if hello.get("protocol") != ab_worker.PROTOCOL:
            self._refuse(
                f"its worker speaks A/B protocol {hello.get('protocol')!r}, this coordinator "
                f"{ab_worker.PROTOCOL}: run both from checkouts of one protocol"
            )
        checkout = str(hello.get("checkout", ""))
        if Path(checkout).resolve() != Path(self.side.path).resolve():
            self._refuse(
                f"its worker imported compare from {checkout}, not from its checkout {self.side.path} (PYTHONPATH "
                "or an installed fusion-compare shadows it)"
            )
        self.pid = int(hello.get("pid") or 0)
        self.side = replace(
            self.side,
            commit=str(hello.get("commit", "")),
            python_version=str(hello.get("python", "")),
            versions=dict(hello.get("versions") or {}),
        )

    def _refuse(self, reason: str) -> None:
        self.close()
        self.lost = reason
        raise SideDown(reason)

    def _receive(self, timeout_s: float, what: str) -> dict[str, Any]:
        assert self.channel is not None and self.proc is not None
        try:
            return self.channel.receive(timeout_s, stop.check)
        except TimeoutError:
            self.close()
            self.lost = f"its worker gave no answer ({what}) in {timeout_s:g} s and was ended"
            raise SideDown(self.lost) from None
        except (EOFError, OSError, ValueError) as exc:
            raise SideDown(self._gone(what, exc)) from None

    def _gone(self, what: str, exc: BaseException) -> str:
        """Why the worker stopped answering: its exit and the last lines of its stderr."""
        assert self.proc is not None
        rc = self.proc.wait(EXIT_S)
        tail = self.proc.tail(3).replace("\n", " | ")
        how = child.describe_exit(rc) if rc is not None else f"stopped answering ({type(exc).__name__}: {exc})"
        self.close()
        self.lost = f"its worker {how} (waiting for {what})" + (f"; stderr: {tail}" if tail else "")
        return self.lost

    def ask(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``message`` and return the answer; :class:`SideDown` when the worker is gone or silent."""
        if self.channel is None or not self.ready:
            raise SideDown(self.lost or "its worker is not running")
        try:
            self.channel.send(message)
        except OSError as exc:
            raise SideDown(self._gone(message["op"], exc)) from None
        return self._receive(timeout_s, message["op"])

    def close(self) -> None:
        """Say bye, give the worker :data:`EXIT_S` to exit, then end its process group (what it started too: a compile
        pool outlives its leader); close the socket."""
        if self.channel is not None:
            try:
                if self.proc is not None and self.proc.poll() is None:
                    self.channel.send({"op": "bye"})
            except OSError:
                pass
            self.channel.sock.close()
        if self.proc is not None:
            self.proc.wait(EXIT_S)
            self.proc.end()
            self.proc.close()
        self.proc, self.channel, self.ready = None, None, False


@dataclass(frozen=True)
class RemoteEntrant:
    """One backend of one side in the coordinator's interleaved group (``compare.timing.timer.Timed``): each block
    runs and is timed in its worker; the clock readings are that worker's own."""

    remote: Remote
    index: int
    first_call_s: float

    def block(self, calls: int, before: Callable[[], None] | None = None) -> tuple[float, float]:
        if before is not None:
            raise ValueError("an A/B block is warm: it takes nothing to run before it")
        got = self.remote.ask({"op": "block", "entrant": self.index, "calls": calls}, BLOCK_S)
        if "error" in got:
            raise RuntimeError(f"side {self.remote.side.name}: {got['error']}")
        return float(got["t0"]), float(got["t1"])


@dataclass(frozen=True)
class Plan:
    """What ``ab`` measures: the cases, backends and modes, the timer's settings, whether each worker profiles its
    steps and records their memory, and the command line as given."""

    cases: tuple[Case, ...]
    specs: tuple[BackendSpec, ...]
    modes: tuple[str, ...]
    cfg: TimingConfig
    profile: bool = True
    memory: bool = True
    command: str = ""
    #: worker processes a side (``--workers``): the unit of replication of the verdict
    workers: int = WORKERS


def _errors(name: str, specs: Sequence[BackendSpec], case: Case, mode: str, reason: str) -> list[Result]:
    why = f"side {name}: {reason}"
    return [Result.for_case(s.name, case, mode, "error", reason=why) for s in specs]


def _group(remotes: Sequence[Remote], plan: Plan, case: Case, mode: str, seed: int) -> list[list[Result]]:
    """One case and mode on every worker of both sides: staged, timed together, settled; per worker its results, in
    ``plan.specs`` order (a worker that failed: its error rows)."""
    specs = plan.specs
    n = len(remotes)
    out: list[list[Result] | None] = [None] * n
    first: list[list[float | None]] = [[] for _ in range(n)]
    sha: list[str | None] = [None] * n
    backends = [{"name": s.name, "spec": to_json(s)} for s in specs]
    group = timer.new_group_id(f"ab/{case.name}/{mode}")
    rng = random.Random(zlib.crc32(group.encode()))
    order = rng.sample(range(n), n)  # which worker's first calls run first: drawn per group
    # the CPU every worker's main thread stays on while timed (``ab_worker.Worker.place``), drawn per group
    cpu = rng.choice(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    placed: list[int | None] = [None] * n
    for k in order:
        r = remotes[k]
        stop.check()
        try:
            r.ensure()
            job = {"op": "start", "case": to_json(case), "mode": mode, "backends": backends, "seed": seed, "cpu": cpu}
            got = r.ask(job, START_S)
            if "error" in got:
                raise SideDown(f"its worker could not stage {case.name} {mode}: {got['error']}")
            sha[k], first[k], placed[k] = got["golden_sha256"], list(got["first_s"]), got["cpu"]
        except SideDown as exc:
            out[k] = _errors(r.side.name, specs, case, mode, str(exc))
    if len({x for x in sha if x is not None}) > 1:
        said = ", ".join(f"{r.side.name} {x}" for r, x in zip(remotes, sha, strict=True) if x is not None)
        why = f"the workers' golden data for {case.name} differ (sha256 {said}): nothing to compare"
        return [_errors(r.side.name, specs, case, mode, why) for r in remotes]
    entrants = [
        (k, i, RemoteEntrant(r, i, f))
        for k, r in enumerate(remotes)
        if out[k] is None
        for i, f in enumerate(first[k])
        if f is not None
    ]
    timed: dict[tuple[int, int], Timing] = {}
    if entrants:
        got_t = timer.measure_interleaved(
            [e for _, _, e in entrants], group=group, seed=rng.getrandbits(32), **dataclasses.asdict(plan.cfg)
        )
        timed = {(k, i): t for (k, i, _), t in zip(entrants, got_t, strict=True) if isinstance(t, Timing)}
    for k, r in enumerate(remotes):
        if out[k] is not None:
            continue
        stop.check()
        try:
            got = r.ask({"op": "settle", "profile": plan.profile, "memory": plan.memory}, SETTLE_S)
            if "error" in got:
                raise SideDown(f"its worker could not finish {case.name} {mode}: {got['error']}")
            rows = [from_json(Result, d) for d in got["results"]]
            staged = {"ab_staged": "first" if k == order[0] else "second", "ab_cpu": placed[k]}
            out[k] = [
                replace(res, timing=timed.get((k, i), res.timing), extras={**res.extras, **staged})
                for i, res in enumerate(rows)
            ]
        except SideDown as exc:
            out[k] = _errors(r.side.name, specs, case, mode, str(exc))
    return [rows if rows is not None else [] for rows in out]


def _side_row(rows: Sequence[Result]) -> Result:
    """A side's row of one pair from its workers' rows: the first error where a worker erred, else the first
    worker's."""
    return next((r for r in rows if r.status == "error"), rows[0])


def _pairs(remotes: Sequence[Remote], plan: Plan, rows: Sequence[Sequence[Result]]) -> list[Pair]:
    """The pairs of one case and mode from every worker's rows (``remotes`` and ``rows``: side A's workers, then
    B's): per backend, each side's row and its workers' figures."""
    k = len(remotes) // 2
    out = []
    for j, s in enumerate(plan.specs):
        sides = [
            [(r, got[j]) for r, got in zip(remotes[h * k : (h + 1) * k], rows[h * k : (h + 1) * k], strict=True)]
            for h in (0, 1)
        ]
        a, b = (_side_row([res for _, res in side]) for side in sides)
        pa, pb = (tuple(Process(r.pid, res.status, res.timing) for r, res in side) for side in sides)
        out.append(Pair(s.framework, a, b, pa, pb))
    return out


def run_ab(a: Side, b: Side, plan: Plan) -> ABResults:
    """Every case and mode of ``plan`` on both sides, ``plan.workers`` worker processes a side (module docstring);
    returns the document, with the machine's load over the run. Every worker starts at once (their imports
    overlap); every process started is ended before this returns, however it returns."""
    if plan.workers < 1:
        raise ValueError(f"a side needs a worker at least, got workers={plan.workers}")
    remotes = [Remote(a) for _ in range(plan.workers)] + [Remote(b) for _ in range(plan.workers)]
    pairs: list[Pair] = []
    sampler = machine_load.start()
    try:
        for r in remotes:
            with contextlib.suppress(SideDown):  # tried again, and said, when its first case needs it
                r.spawn()
        for case in plan.cases:
            seed = fresh.new_seed()  # one fresh draw per case, for both sides
            for mode in plan.modes:
                pairs += _pairs(remotes, plan, _group(remotes, plan, case, mode, seed))
    finally:
        for r in remotes:
            r.close()
    load = sampler.stop()  # the workers are reaped: their CPU time is this process's, not others'
    stop.check()  # a signal while the workers were ending asked to stop too: no document (the last one is kept)
    a, b = (_said(remotes[: plan.workers]), _said(remotes[plan.workers :]))
    return ABResults(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=plan.command,
        timing=plan.cfg,
        a=a,
        b=b,
        pairs=tuple(pairs),
        load=load,
        workers=plan.workers,
    )


def _said(side: Sequence[Remote]) -> Side:
    """A side as its first worker that said who it is said it (its problem: "" then), else as asked, with why its
    first worker is gone."""
    r = next((r for r in side if r.greeted), side[0])
    return replace(r.side, problem="" if r.greeted else r.lost or "no worker was started")
