"""``python -m compare sweep``: run a grid of cells, one JSON line per finished cell, resumable after a crash.

The grid is ``tokens x dtypes x modes x backends`` at a fixed model, ``dim`` and ``hidden`` (from ``--preset`` or
``--model/--dim/--hidden``). Each token count ``T`` becomes the shape ``batch = T / seq, seq`` (``--seq``, default
1, so ``batch = T``); ``T`` must be a multiple of ``--seq``. A *cell* is ``(backend, case, mode)`` and its key is
``"backend|case name|mode"`` (the case name holds model, shape, dtype, distribution and seed).

``<out>/results.jsonl`` is append-only. Every start of the sweep appends a ``header`` line (schema, time, config,
environment); every finished cell is appended as one ``cell`` line (the result record, the precision settings its
backend reported and the GPU it saw), written with a single ``write`` and flushed to disk (``fsync``) before the
next cell starts. A restart with the same ``--out`` and the same grid skips every cell already in the file, so
killing the sweep loses at most the cell in flight; a torn last line (the process died inside the write) is
dropped. A different grid in the same folder is refused (bad input): one file holds one sweep. An exclusive lock
on the file keeps a second sweep from writing it at the same time.

:func:`load_sweep` turns the file, at any time, into a regular results document (the shape of
``compare.harness.run``'s); at the end the sweep writes it as ``<out>/results.json`` with ``<out>/REPORT.md`` and
plots under ``<out>/plots/``.

A backend that raises on a cell is an ``error`` result and the sweep goes on (``harness.run_one``). With
``--isolate`` each cell runs in its own worker process (``python -m compare.sweep --worker CELL RESULT``), so a
hard crash (segfault, the OOM killer, an abort) is recorded as an ``error`` naming the exit status or signal,
and ``--cell-timeout`` turns a hang into an error too. The workers' scratch files live under ``<out>/.cells/``,
removed when the sweep ends (however it ends) and, if a killed sweep left one, when the next one starts.
``--retry-errors`` runs again, on a restart, the cells whose stored result is an ``error`` (the new line wins).

Ctrl-C or SIGTERM stops the sweep: the worker in flight and everything it started are killed, what is done is
written to ``results.json`` and ``REPORT.md``, and the exit status is 130 (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compare import environment, exitcodes, harness, preflight, report, results
from compare.atomic import write_text_atomic
from compare.cases import (
    MODELS,
    PRESETS,
    Case,
    InputError,
    Shape,
    check_finite,
    check_name,
    check_seed,
    preset,
)
from compare.options import add_grid_args, check_grid_args
from compare.progress import Display, progress_level
from compare.registry import BackendSpec, spec

JSONL = "results.jsonl"
#: Scratch folder of the isolated workers, under the sweep's output folder.
SCRATCH = ".cells"
DEFAULT_TOKENS: tuple[int, ...] = (1, 16, 128, 1024)
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: Config keys that define the grid; a restart must match them exactly.
GRID_KEYS: tuple[str, ...] = ("grid", "backends", "dtypes", "modes", "timing")
#: Lines of a crashed worker's stderr kept in its error record.
STDERR_TAIL_LINES = 20
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cell:
    """One unit of the sweep: a backend on a case in a mode."""

    backend: str
    case: Case
    mode: str

    @property
    def key(self) -> str:
        return cell_key(self.backend, self.case.name, self.mode)

    def label(self) -> str:
        dtype = SHORT_DTYPE.get(self.case.dtype, self.case.dtype)
        return f"{self.backend} tokens={self.case.shape.tokens} {dtype} {self.mode}"


def cell_key(backend: str, case_name: str, mode: str) -> str:
    """The key a cell is stored and skipped under: ``backend|case name|mode``."""
    return f"{backend}|{case_name}|{mode}"


def result_key(r: dict[str, Any]) -> str:
    return cell_key(r["backend"], r["case"], r["mode"])


# --- the grid -------------------------------------------------------------------------------------------------


def grid_config(
    model: str,
    dim: int,
    hidden: int,
    tokens: Sequence[int],
    seq: int = 1,
    dist: str = "normal",
    seed: int = 0,
) -> dict[str, Any]:
    """The ``grid`` part of a sweep's config (validated: a bad size raises :class:`InputError`)."""
    check_name("model", model, MODELS)
    check_seed(seed)
    Shape(1, seq, dim, hidden)  # validates seq, dim, hidden (before seq divides anything)
    if not tokens:
        raise InputError("give at least one token count (--tokens)")
    for t in tokens:
        if not isinstance(t, int) or t <= 0:
            raise InputError(f"token counts must be positive integers, got {t!r}")
        if t % seq:
            raise InputError(f"token count {t} is not a multiple of --seq {seq} (batch = tokens / seq)")
    if len(set(tokens)) != len(tokens):
        raise InputError(f"token counts repeat: {list(tokens)}")
    return {
        "model": model,
        "dim": dim,
        "hidden": hidden,
        "seq": seq,
        "tokens": list(tokens),
        "dist": dist,
        "seed": seed,
    }


def cells_from_config(config: dict[str, Any]) -> list[Cell]:
    """Every cell of a sweep config, in run order: tokens, then dtype, then mode, then backend."""
    g = config["grid"]
    cells: list[Cell] = []
    for t in g["tokens"]:
        shape = Shape(t // g["seq"], g["seq"], g["dim"], g["hidden"])
        for dtype in config["dtypes"]:
            case = Case(g["model"], shape, dtype, g["dist"], g["seed"])
            for mode in config["modes"]:
                cells.extend(Cell(b, case, mode) for b in config["backends"])
    return cells


# --- the file -------------------------------------------------------------------------------------------------


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a sweep file; a torn (unterminated, unparsable) last line is ignored."""
    if not path.is_file():
        raise InputError(f"sweep file {path} does not exist")
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a torn last line
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"sweep file {path} line {i} is not valid JSON: {exc}") from exc
        if not isinstance(rec, dict) or rec.get("type") not in ("header", "cell"):
            raise InputError(f"sweep file {path} line {i} is neither a header nor a cell line")
        out.append(rec)
    if tail.strip():
        with contextlib.suppress(json.JSONDecodeError):  # complete JSON without its newline still counts
            rec = json.loads(tail)
            if isinstance(rec, dict) and rec.get("type") in ("header", "cell"):
                out.append(rec)
    if not out or out[0]["type"] != "header":
        raise InputError(f"sweep file {path} does not start with a header line: not a fusion-compare sweep")
    return out


def _jsonl_path(path: Path) -> Path:
    return path / JSONL if path.is_dir() else path


def load_sweep(path: Path | str) -> dict[str, Any]:
    """A results document (``schema, created, config, environment, results``) from a sweep file or its folder.

    Readable at any time, also while the sweep runs. ``created``, ``config`` and ``environment`` are the first
    header's; the environment's ``precision`` and ``threads`` merge what every finished cell reported, and its
    ``gpu`` is the first one a cell saw if the header had none (backends load torch after the header is written,
    and the GPU name is read only once torch is loaded). Results are in grid order, one per cell key (the last
    line wins if a key repeats). ``config["progress"]`` says how many grid cells are done and how many sessions
    (starts) wrote the file.
    """
    lines = _parse_lines(_jsonl_path(Path(path)))
    headers = [x for x in lines if x["type"] == "header"]
    first = headers[0]
    by_key: dict[str, dict[str, Any]] = {}
    precision: dict[str, Any] = {}
    threads: dict[str, Any] = {}
    gpus: list[str] = []
    for rec in lines:
        if rec["type"] == "cell":
            r = rec["result"]
            by_key[result_key(r)] = r
            precision.update(rec.get("precision") or {})
            gpus += [rec["gpu"]] if rec.get("gpu") else []
            threads.update(r.get("threads") or {})
    config = dict(first["config"])
    grid = [c.key for c in cells_from_config(config)]
    in_grid = set(grid)
    ordered = [by_key[k] for k in grid if k in by_key] + [r for k, r in by_key.items() if k not in in_grid]
    config["progress"] = {"cells": len(grid), "done": sum(k in by_key for k in grid), "sessions": len(headers)}
    env = dict(first["environment"])
    env["precision"] = {**env.get("precision", {}), **precision}
    env["threads"] = {**env.get("threads", {}), **threads}
    if not env.get("gpu") and gpus:
        env["gpu"] = gpus[0]
    return {
        "schema": first["schema"],
        "created": first["created"],
        "config": config,
        "environment": env,
        "results": ordered,
    }


def done_keys(path: Path, retry_errors: bool = False) -> set[str]:
    """Keys of the cells already in a sweep file (empty if there is none); with ``retry_errors``, less those whose
    last stored result is an ``error`` (they run again)."""
    if not path.is_file() or path.stat().st_size == 0:
        return set()
    last = {result_key(x["result"]): x["result"] for x in _parse_lines(path) if x["type"] == "cell"}
    return {k for k, r in last.items() if not (retry_errors and r.get("status") == "error")}


class SweepWriter:
    """Appends lines to a sweep file: one ``write`` per line, then ``fsync``; holds an exclusive lock on it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock()
            self._drop_torn_tail()
        except BaseException:
            os.close(self.fd)
            raise

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise InputError(f"another sweep is writing {self.path}; wait for it or use another --out") from exc

    def _drop_torn_tail(self) -> None:
        size = os.fstat(self.fd).st_size
        if size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        os.ftruncate(self.fd, keep)
        print(f"sweep: dropped a torn last line ({len(data) - keep} bytes) from {self.path}", file=sys.stderr)

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, allow_nan=True) + "\n").encode()
        while data:
            n = os.write(self.fd, data)
            data = data[n:]
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> SweepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_same_grid(path: Path, config: dict[str, Any], env: dict[str, Any]) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    first = _parse_lines(path)[0]
    old = first["config"]
    differ = [k for k in GRID_KEYS if old.get(k) != config.get(k)]
    if differ:
        raise InputError(
            f"{path} holds a different sweep (it differs in: {', '.join(differ)}); "
            f"use another --out, or delete the folder to start over"
        )
    old_env = first["environment"]
    changed = [k for k in ("cpu", "gpu", "versions") if old_env.get(k) != env.get(k)]
    if changed:
        print(
            f"sweep: warning: resuming on a different environment (differs in: {', '.join(changed)}); the "
            f"report keeps the first session's",
            file=sys.stderr,
        )


# --- running cells --------------------------------------------------------------------------------------------


def _spec_dict(s: BackendSpec) -> dict[str, Any]:
    return asdict(s)


def _case_dict(case: Case) -> dict[str, Any]:
    s = case.shape
    return {
        "model": case.model,
        "batch": s.batch,
        "seq": s.seq,
        "dim": s.dim,
        "hidden": s.hidden,
        "dtype": case.dtype,
        "dist": case.dist,
        "seed": case.seed,
    }


def _case_from_dict(d: dict[str, Any]) -> Case:
    return Case(d["model"], Shape(d["batch"], d["seq"], d["dim"], d["hidden"]), d["dtype"], d["dist"], d["seed"])


def run_cell_inprocess(
    s: BackendSpec, cell: Cell, cfg: harness.TimingConfig, plain_cache: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one cell here; return (result record, ``{"precision": ..., "gpu": ...}`` as the backend left them)."""
    if cell.case.name not in plain_cache:
        plain_cache.clear()  # cells come case by case: keep one plain reference at a time
        plain_cache[cell.case.name] = harness.plain_reference(cell.case)
    precision: dict[str, Any] = {}
    r = harness.run_one(s, cell.case, cell.mode, plain_cache[cell.case.name], cfg, precision)
    return r.to_dict(), {"precision": precision, "gpu": environment.gpu()}


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def run_cell_isolated(
    s: BackendSpec, cell: Cell, cfg: harness.TimingConfig, scratch: Path, timeout_s: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one cell in a worker process; a crash, a signal or a timeout becomes an ``error`` result."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="cell-") as tmp:
        cell_path, result_path = Path(tmp) / "cell.json", Path(tmp) / "result.json"
        write_text_atomic(
            cell_path,
            json.dumps(
                {"spec": _spec_dict(s), "case": _case_dict(cell.case), "mode": cell.mode, "timing": asdict(cfg)}
            ),
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
        cmd = [sys.executable, "-m", "compare.sweep", "--worker", str(cell_path), str(result_path)]
        with tempfile.TemporaryFile() as err:
            # its own session: a timeout or an interrupt kills the worker and anything it started (compile pools)
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
            timed_out = False
            try:
                rc = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(p)
                rc, timed_out = p.returncode, True
            except BaseException:
                _kill_group(p)
                raise
            err.seek(0)
            tail = err.read().decode(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
        if rc == 0 and not timed_out and result_path.is_file():
            out = json.loads(result_path.read_text(encoding="utf-8"))
            return out["result"], out["meta"]
    extras: dict[str, Any] = {"exit_code": rc, "stderr_tail": "\n".join(tail)}
    if timed_out:
        reason = f"worker process timed out after {timeout_s:g} s and was killed"
    elif rc < 0:
        extras["signal"] = _signal_name(rc)
        hint = " (the OOM killer sends this when memory runs out)" if -rc == signal.SIGKILL else ""
        reason = f"worker process killed by signal {extras['signal']}{hint}"
    elif rc != 0:
        reason = f"worker process exited with status {rc}"
        last = next((x for x in reversed(tail) if x.strip()), "")
        reason += f": {last.strip()}" if last else ""
    else:
        reason = "worker process exited with status 0 but wrote no result"
    r = results.Result.for_case(s.name, cell.case, cell.mode, "error", reason=reason, extras=extras)
    return r.to_dict(), {"precision": {}, "gpu": None}


def worker_main(cell_path: Path, result_path: Path) -> int:
    """Worker entry point: run the cell described in ``cell_path``, write the outcome to ``result_path``."""
    d = json.loads(cell_path.read_text(encoding="utf-8"))
    sd = d["spec"]
    s = BackendSpec(
        **{**sd, "models": tuple(sd["models"]), "modes": tuple(sd["modes"]), "sweep": tuple(sd.get("sweep") or ())}
    )
    case = _case_from_dict(d["case"])
    cell = Cell(s.name, case, d["mode"])
    result, meta = run_cell_inprocess(s, cell, harness.TimingConfig(**d["timing"]), {})
    write_text_atomic(result_path, json.dumps({"result": result, "meta": meta}, allow_nan=True))
    return 0


def run_sweep(
    config: dict[str, Any],
    out: Path,
    specs: dict[str, BackendSpec],
    *,
    isolate: bool = False,
    cell_timeout_s: float | None = None,
    progress: Display | None = None,
    retry_errors: bool = False,
) -> dict[str, Any]:
    """Run every cell of ``config`` not yet in ``out/results.jsonl``, appending each as it finishes.

    ``specs`` maps each backend name in the config to its spec; ``retry_errors`` runs stored ``error`` cells again.
    Returns :func:`load_sweep` of the file. The workers' scratch folder ``out/.cells`` is removed on the way out,
    and a stale one (a killed sweep's) on the way in, once this sweep holds the file's lock.
    """
    path = out / JSONL
    cfg = harness.TimingConfig(**config["timing"])
    env = environment.collect({}, {})
    cells = cells_from_config(config)
    with SweepWriter(path) as w:
        _check_same_grid(path, config, env)
        _remove_scratch(out)
        try:
            done = done_keys(path, retry_errors)
            w.append(
                {
                    "type": "header",
                    "schema": results.SCHEMA_VERSION,
                    "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "config": config,
                    "environment": env,
                    "isolate": isolate,
                }
            )
            todo = [c for c in cells if c.key not in done]
            n_done = len(cells) - len(todo)
            if progress:
                progress.resume(n_done, len(cells))
            if progress and n_done:
                progress.message(f"resuming {path}: {n_done}/{len(cells)} cells already done", important=True)
            if progress and retry_errors:
                progress.message(
                    f"retrying {len(done_keys(path)) - len(done)} cell(s) whose stored result is an error",
                    important=True,
                )
            plain_cache: dict[str, Any] = {}
            for cell in todo:
                t0 = time.perf_counter()
                s = specs[cell.backend]
                if progress:
                    progress.starting(cell.label())
                if isolate:
                    r, meta = run_cell_isolated(s, cell, cfg, out / SCRATCH, cell_timeout_s)
                else:
                    r, meta = run_cell_inprocess(s, cell, cfg, plain_cache)
                wall = time.perf_counter() - t0
                w.append({"type": "cell", "key": cell.key, "result": r, **meta, "wall_s": wall})
                n_done += 1
                if progress:
                    progress.cell(f"{cell.label()} ({wall:.1f}s)", r["status"], r.get("reason", ""))
        finally:
            _remove_scratch(out)
    return load_sweep(path)


def _remove_scratch(out: Path) -> None:
    """Remove the workers' scratch folder ``out/.cells`` if there is one."""
    with contextlib.suppress(FileNotFoundError):  # none: nothing to clean
        shutil.rmtree(out / SCRATCH)


def finish(out: Path, doc: dict[str, Any], plots: bool = True) -> dict[str, Any]:
    """Write ``results.json``, plots (``doc["plots"]``, paths relative to ``out``) and ``REPORT.md``."""
    if plots:
        from compare.plots import render_plots

        try:
            paths = render_plots(doc, out / "plots")
        except Exception as exc:  # plots are a convenience: never lose the results over them
            print(f"sweep: warning: no plots: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            doc["plots"] = [p.relative_to(out).as_posix() for p in paths]
    results.write_json(out / "results.json", doc)
    write_text_atomic(out / "REPORT.md", report.render(doc))
    return doc


# --- command line ---------------------------------------------------------------------------------------------


def config_from_args(a: argparse.Namespace) -> dict[str, Any]:
    """The sweep config (grid, backends, dtypes, modes, timing) from parsed arguments; bad input raises, and so
    does a grid whose largest case does not fit in memory."""

    check_grid_args(a)
    base = preset(a.preset) if a.preset else None
    model = check_name("model", a.model, MODELS) if a.model else (base.model if base else None)
    if model is None:
        raise InputError(f"give --preset or --model; known models: {', '.join(MODELS)}")
    dim = a.dim if a.dim is not None else (base.shape.dim if base else None)
    hidden = a.hidden if a.hidden is not None else (base.shape.hidden if base else None)
    missing = [n for n, v in (("--dim", dim), ("--hidden", hidden)) if v is None]
    if dim is None or hidden is None:
        raise InputError(f"without --preset, give every dimension; missing: {', '.join(missing)}")
    grid = grid_config(model, dim, hidden, a.tokens, a.seq, base.dist if base else "normal", a.seed)
    timing = asdict(dataclasses.replace(harness.TimingConfig(), budget_s=a.budget))
    config = {
        "command": "python -m compare " + shlex.join(getattr(a, "argv", None) or ["sweep"]),
        "preset": a.preset,
        "grid": grid,
        "backends": list(a.backend),
        "dtypes": list(a.dtype),
        "modes": list(a.mode),
        "timing": timing,
    }
    preflight.check_memory(dict.fromkeys(c.case for c in cells_from_config(config)))
    return config


def cmd_sweep(a: argparse.Namespace) -> int:
    """Run (or resume) a sweep; write results.json, REPORT.md and plots. 0 if every cell is ok or skipped.

    Everything is checked before the first cell: the arguments, the memory the largest case needs, the golden
    files, the output folder. Ctrl-C or SIGTERM: the cell in flight is dropped, the rest written, status 130.
    """
    config = config_from_args(a)
    if a.cell_timeout is not None:
        check_finite("--cell-timeout", a.cell_timeout)
        if not a.isolate:
            raise InputError("--cell-timeout needs --isolate (only a worker process can be stopped)")
    preflight.check_golden(dict.fromkeys(c.case for c in cells_from_config(config)))
    out = preflight.prepare_out_dir(Path(a.out))
    specs = {b: spec(b) for b in config["backends"]}
    interrupted = False
    try:
        with exitcodes.terminate_as_interrupt(), Display(0, progress_level(a), title="sweep") as display:
            doc = run_sweep(
                config,
                out,
                specs,
                isolate=a.isolate,
                cell_timeout_s=a.cell_timeout,
                progress=display,
                retry_errors=a.retry_errors,
            )
    except KeyboardInterrupt as exc:
        interrupted = True
        why = "terminated" if isinstance(exc, exitcodes.Terminated) else "interrupted"
        print(f"sweep: {why}; writing what is done (rerun the same command to resume)", file=sys.stderr)
        doc = load_sweep(out / JSONL)
    finish(out, doc, plots=not a.no_plots)
    prog = doc["config"]["progress"]
    print(
        f"wrote {out / 'results.json'} and {out / 'REPORT.md'}: {prog['done']}/{prog['cells']} cells "
        f"({report.summary(doc['results'])})"
    )
    if interrupted:
        return exitcodes.INTERRUPTED
    ok = all(r["status"] in ("ok", "skipped") for r in doc["results"])
    return exitcodes.OK if ok else exitcodes.FINDING


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``sweep`` subcommand on an ``argparse`` subparsers object."""

    p: argparse.ArgumentParser = subparsers.add_parser(
        "sweep",
        help="run a grid of token counts x dtypes x modes x backends; resumable (results.jsonl)",
        description=__doc__,
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", help=f"dim, hidden, model and distribution from: {', '.join(PRESETS)}")
    p.add_argument("--model", help=f"one of: {', '.join(MODELS)} (default: the preset's)")
    p.add_argument("--dim", type=int, help="override the preset's dim")
    p.add_argument("--hidden", type=int, help="override the preset's hidden")
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=list(DEFAULT_TOKENS),
        help="token counts (default: %(default)s); each is batch x seq with batch = tokens / seq",
    )
    p.add_argument("--seq", type=int, default=1, help="sequence length of every case (default: 1, batch = tokens)")
    add_grid_args(p, budget_help="seconds of timed samples per cell")
    p.add_argument("--out", default="out/sweep", help="output folder; rerun with the same one to resume")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run each cell in a worker process: a segfault or OOM kill is recorded, not fatal",
    )
    p.add_argument("--cell-timeout", type=float, help="with --isolate: seconds before a cell is killed")
    p.add_argument(
        "--retry-errors", action="store_true", help="on a restart, run again the cells whose stored result is an error"
    )
    p.add_argument("--no-plots", action="store_true", help="do not write plots")
    p.set_defaults(fn=cmd_sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m compare.sweep [sweep options]`` (same as ``python -m compare sweep``), or the worker."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        if len(argv) != 3:
            print("usage: python -m compare.sweep --worker CELL.json RESULT.json", file=sys.stderr)
            return 2
        return worker_main(Path(argv[1]), Path(argv[2]))
    top = argparse.ArgumentParser(prog="python -m compare.sweep")
    sub = top.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = top.parse_args(["sweep", *argv])
    a.argv = ["sweep", *argv]  # as `python -m compare` sets it: the subcommand and its arguments
    return exitcodes.exit_status(lambda: a.fn(a))


if __name__ == "__main__":
    raise SystemExit(main())
