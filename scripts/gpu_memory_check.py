"""The memory readers of a GPU step end to end (issue 19): what each step saves for its backward and its peak.

    python scripts/gpu_memory_check.py --out DIR [--fake] [--limit-s 240]

On a CUDA machine (without ``--fake``): the ``tiny`` GeGLU case in bfloat16, ``fwd+bwd``, for torch-eager,
torch-triton-fused and jax-xla (torch-compile's memory on a GPU is in the GPU check's report step), each cell
through ``compare.run.harness.run_one(memory=True)`` (parity only); checks that each has its saved-for-backward
bytes, that the torch ones equal their cost-model plan byte for byte, that each peak was read from the device
(``torch.cuda.max_memory_allocated``; JAX's ``memory_stats``, a bound) and holds at least the saved bytes. With
``--fake``, or where torch sees no CUDA device: the same readers on scripted devices (``torch_impl.memory.cuda_peak``
on a scripted allocator, ``jax_impl.memory.device_peak`` on a scripted JAX device), their arithmetic checked.

Writes ``DIR/gpu_memory.json`` and prints it. Exit 0 when every check passed, 1 when one failed (each named on
stderr), 2 for a usage error. The whole run is ended after ``--limit-s`` seconds (``faulthandler``).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

from compare.formats.codec import to_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BACKENDS = ("torch-eager", "torch-triton-fused", "jax-xla")


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail})

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["ok"]]


class ScriptedCuda:
    """A CUDA allocator's counters as ``torch_impl.memory.CudaMemory`` reads them: ``before`` bytes allocated, the
    step allocating ``step_peak`` more at its most."""

    def __init__(self, before: int, step_peak: int) -> None:
        self.before, self.step_peak, self.peak, self.resets = before, step_peak, before, 0

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak = self.before

    def allocated(self) -> int:
        return self.before

    def max_allocated(self) -> int:
        return self.peak

    def synchronize(self) -> None:
        pass

    def run(self) -> str:
        self.peak = max(self.peak, self.before + self.step_peak)
        return "out"


class ScriptedJaxDevice:
    """A JAX GPU device's ``memory_stats()``: ``in_use`` bytes before the step, a peak of ``in_use + step_peak``
    after it (the process's peak so far)."""

    platform = "gpu"

    def __init__(self, in_use: int, step_peak: int) -> None:
        self.in_use, self.step_peak, self.ran = in_use, step_peak, False

    def memory_stats(self) -> dict[str, int]:
        peak = self.in_use + (self.step_peak if self.ran else 0)
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": peak}

    def run(self) -> str:
        self.ran = True
        return "out"


def fake_run(why: str, checks: Checks) -> dict[str, Any]:
    from jax_impl import memory as jax_memory
    from torch_impl import memory as torch_memory

    cuda = ScriptedCuda(before=3 << 20, step_peak=5 << 20)
    got = torch_memory.cuda_peak(cuda.run, cuda)  # type: ignore[arg-type]
    checks.add("torch: peak = max_memory_allocated - allocated before", got["bytes"] == 5 << 20, str(got))
    checks.add("torch: the peak was reset before the step", cuda.resets == 1, f"{cuda.resets} resets")
    dev = ScriptedJaxDevice(in_use=7 << 20, step_peak=2 << 20)
    jgot = jax_memory.device_peak(dev.run, lambda outs: None, dev)
    ok = jgot is not None and jgot["bytes"] == 2 << 20 and jgot["bound"] is True
    checks.add("jax: peak_bytes_in_use after - bytes_in_use before, a bound", ok, str(jgot))

    class NoStats:
        platform = "cpu"

        def memory_stats(self) -> None:
            return None

    none = jax_memory.device_peak(dev.run, print, NoStats())
    checks.add("jax: a device without statistics has no peak", none is None, str(none))
    return {"mode": "fake", "why": why, "torch": got, "jax": jgot}


def cuda_run(checks: Checks) -> dict[str, Any]:
    from compare.backends.registry import spec
    from compare.problem.cases import preset
    from compare.results.memory import model_check
    from compare.run.cell import plain_reference
    from compare.run.harness import run_one
    from compare.timing.timer import TimingConfig

    case = preset("tiny").case("bfloat16")
    plain = plain_reference(case)
    out: dict[str, Any] = {"mode": "cuda", "case": case.name, "cells": {}}
    for name in BACKENDS:
        r = run_one(spec(name), case, "fwd+bwd", plain, TimingConfig(), {}, time_it=False, memory=True)
        m = r.memory
        out["cells"][name] = {"status": r.status, "reason": r.reason, "memory": to_json(m) if m else None}
        checks.add(f"{name}: ran", r.status in ("ok", "deviates"), f"{r.status}: {r.reason}")
        if m is None or m.saved is None or m.peak is None:
            why = "no memory record" if m is None else f"{m.saved_reason}; {m.peak_reason}"
            checks.add(f"{name}: saved and peak measured", False, why)
            continue
        device = "max_memory_allocated" in m.peak.source or "memory_stats" in m.peak.source
        checks.add(f"{name}: peak read from the device", device, m.peak.source)
        checks.add(f"{name}: peak >= saved", m.peak.bytes >= m.saved.bytes, f"{m.peak.bytes} vs {m.saved.bytes}")
        if name.startswith("torch"):
            c = model_check(m, r.cost)
            checks.add(f"{name}: saved = its cost-model plan", c.verdict == "= model", c.text)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_memory.json")
    p.add_argument("--fake", action="store_true", help="scripted devices, on any machine")
    p.add_argument("--limit-s", type=float, default=240.0, help="end the whole run after this many seconds")
    a = p.parse_args(argv)
    if not a.limit_s > 0:
        print(f"error: --limit-s must be positive, got {a.limit_s}", file=sys.stderr)
        return 2
    try:
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot create --out {a.out}: {exc}", file=sys.stderr)
        return 2
    faulthandler.dump_traceback_later(a.limit_s, exit=True)
    try:
        import torch

        from compare.formats.atomic import write_text_atomic

        checks = Checks()
        if a.fake:
            summary = fake_run("asked for (--fake)", checks)
        elif not torch.cuda.is_available():
            summary = fake_run("no CUDA device here: scripted devices instead", checks)
        else:
            summary = cuda_run(checks)
        summary["checks"] = checks.rows
        summary["ok"] = not checks.failed
        text = json.dumps(summary, indent=2)
        write_text_atomic(a.out / "gpu_memory.json", text + "\n")
        print(text)
    finally:
        faulthandler.cancel_dump_traceback_later()
    for row in checks.failed:
        print(f"error: check failed: {row['check']}: {row['detail']}", file=sys.stderr)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
