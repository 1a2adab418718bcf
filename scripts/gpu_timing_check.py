"""The GPU timing paths end to end: NVML telemetry around timed blocks, and a CUDA-graph capture of a step.

    python scripts/gpu_timing_check.py --out DIR [--fake] [--limit-s 120]

On a CUDA machine (without ``--fake``): NVML device 0 (``compare.timing.nvml.open_device``); a bf16 4096x4096
matmul captured into a CUDA graph (``torch_impl.cuda_graphs.capture``), its replay checked against the eager call;
then eager and replay timed in alternating blocks of about 50 ms, watched by ``NvmlWatch``, each entrant's telemetry
checked to hold samples. With ``--fake``, or where torch sees no CUDA device: the same blocks over a trivial step,
watched through a scripted device (``tests/fake_nvml.py``'s ``ScriptedDevice``: a clock drop and a thermal-slowdown bit
part-way), and the capture of a trivial step (``NotCaptured`` where there is no CUDA device).

Writes ``DIR/gpu_timing.json`` and prints it. Exit 0 when every check passed; 1 when one failed (each failed check
named on stderr), including NVML missing on a CUDA machine; 2 for a usage error. Bounded: the whole run is ended
after ``--limit-s`` seconds (``faulthandler`` prints every thread's stack and exits 1), the watch's sampling thread
is joined with a timeout.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Seconds a timed block should last, and the rounds of blocks each entrant gets.
BLOCK_S = 0.05
ROUNDS = 6


def run_blocks(
    watch: Any, steps: Sequence[Callable[[], Any]], sync: Callable[[], None], calls: int, rounds: int
) -> tuple[list[float], list[dict[str, Any] | None]]:
    """Alternating timed blocks of ``calls`` calls of each step (the order flips every round), each reported to
    ``watch`` as the shared timer reports them; the median seconds per call of each, and the watch's records."""
    per_call: list[list[float]] = [[] for _ in steps]
    watch.start(len(steps))
    try:
        for r in range(rounds):
            order = list(range(len(steps)))
            for i in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                outs = [steps[i]() for _ in range(calls)]
                sync()
                t1 = time.perf_counter()
                del outs
                watch.block(i, t0, t1, calls)
                per_call[i].append((t1 - t0) / calls)
    finally:
        records = watch.stop()
    return [statistics.median(p) for p in per_call], records


def calls_per_block(step: Callable[[], Any], sync: Callable[[], None]) -> int:
    """Calls that fill :data:`BLOCK_S`, from the fastest of a few synced calls (at most 5000)."""
    fastest = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        sync()
        fastest = min(fastest, time.perf_counter() - t0)
    return max(1, min(5000, math.ceil(BLOCK_S / max(fastest, 1e-7))))


class Checks:
    """The named checks of the run: each passed or failed, with what was seen."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail})

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["ok"]]


def check_records(checks: Checks, names: Sequence[str], records: Sequence[dict[str, Any] | None]) -> None:
    for name, rec in zip(names, records, strict=True):
        checks.add(f"{name}: a telemetry record", rec is not None)
        if rec is None:
            continue
        checks.add(f"{name}: samples inside its blocks", rec["samples"] > 0, f"{rec['samples']} samples")
        checks.add(f"{name}: no read failed", not rec["read_errors"], "; ".join(rec["read_errors"]))


def fake_run(why: str, checks: Checks) -> dict[str, Any]:
    """Scripted NVML over blocks of a trivial step; the capture of a trivial step with the real ``torch.cuda``."""
    import torch

    from compare.timing.nvml import NvmlWatch
    from tests.fake_nvml import Phase, ScriptedDevice
    from torch_impl.cuda_graphs import Captured, capture

    t0 = time.perf_counter()
    device = ScriptedDevice(
        [
            Phase(after_s=0.0, sm_clock_mhz=1977, mem_clock_mhz=2619, power_w=311.7, temperature_c=47),
            Phase(0.313, 1417, 2619, 283.3, 83, throttle_reasons=0x40),
        ],
        origin_s=t0,
        energy_update_s=0.003,
    )
    a = torch.randn(67, 67, generator=torch.Generator().manual_seed(7))

    def step() -> Any:
        return a @ a

    def nothing() -> None:
        return None

    calls = calls_per_block(step, nothing)
    medians, records = run_blocks(NvmlWatch(device, period_s=0.002), [step, step], nothing, calls, ROUNDS)
    names = ["step-1", "step-2"]
    check_records(checks, names, records)
    for name, rec in zip(names, records, strict=True):
        if rec is not None:
            checks.add(f"{name}: energy measured", rec["energy_per_call_j"] is not None, rec["energy_note"])

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    x = torch.ones(31, device=dev)
    got = capture(lambda: x * 3)
    checks.add(
        "capture: captured exactly where CUDA is",
        isinstance(got, Captured) == cuda,
        got.note if isinstance(got, Captured) else got.reason,
    )
    return {
        "mode": "fake",
        "why": why,
        "step": f"a 67x67 float32 matmul on the CPU, {calls} calls per block, {ROUNDS} rounds",
        "per_call_s": dict(zip(names, medians, strict=True)),
        "telemetry": dict(zip(names, records, strict=True)),
        "capture": {
            "captured": isinstance(got, Captured),
            "outcome": got.note if isinstance(got, Captured) else got.reason,
        },
    }


def cuda_run(checks: Checks) -> dict[str, Any]:
    """Real NVML device 0, a bf16 4096x4096 matmul eager and as a CUDA-graph replay, watched in blocks."""
    import torch

    from compare.timing.nvml import NvmlWatch, Unavailable, open_device
    from torch_impl.cuda_graphs import Captured, capture

    out: dict[str, Any] = {"mode": "cuda", "why": "", "gpu": torch.cuda.get_device_name(0)}
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)

    def eager() -> Any:
        return a @ b

    reference = eager()
    torch.cuda.synchronize()
    got = capture(eager)
    checks.add("capture: captured", isinstance(got, Captured), got.note if isinstance(got, Captured) else got.reason)
    capture_out: dict[str, Any] = {"captured": isinstance(got, Captured)}
    steps, names = [eager], ["eager"]
    if isinstance(got, Captured):
        replayed = got.replay()
        torch.cuda.synchronize()
        diff = (replayed.float() - reference.float()).abs().max().item()
        bitwise = bool(torch.equal(replayed, reference))
        scale = reference.float().abs().max().item()
        close = diff <= 2e-2 * scale
        capture_out.update(outcome=got.note, bitwise_equal=bitwise, max_abs_diff=diff, reference_max_abs=scale)
        checks.add(
            "capture: the replay computes what eager does",
            bitwise or close,
            "bitwise equal" if bitwise else f"max abs diff {diff:.4g} against values up to {scale:.4g}",
        )
        steps.append(got.replay)
        names.append("graph-replay")
    else:
        capture_out["outcome"] = got.reason
    out["capture"] = capture_out

    device = open_device(0)
    if isinstance(device, Unavailable):
        checks.add("nvml: device 0 opens", False, device.reason)
        out["nvml"] = {"unavailable": device.reason}
        return out
    try:
        out["nvml"] = {"device": device.name(), "energy": device.energy_absent_reason() or "counter present"}
        checks.add("nvml: device 0 opens", True, device.name())
        calls = calls_per_block(eager, torch.cuda.synchronize)
        medians, records = run_blocks(NvmlWatch(device, period_s=0.01), steps, torch.cuda.synchronize, calls, ROUNDS)
    finally:
        device.close()
    check_records(checks, names, records)
    out["step"] = f"a 4096x4096 bf16 matmul, {calls} calls per block, {ROUNDS} rounds"
    out["per_call_s"] = dict(zip(names, medians, strict=True))
    out["telemetry"] = dict(zip(names, records, strict=True))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_timing.json")
    p.add_argument("--fake", action="store_true", help="a scripted NVML device and a trivial step, on any machine")
    p.add_argument("--limit-s", type=float, default=120.0, help="end the whole run after this many seconds")
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
            summary = fake_run("no CUDA device here: the scripted device and a trivial step instead", checks)
        else:
            summary = cuda_run(checks)
        summary["checks"] = checks.rows
        summary["ok"] = not checks.failed
        text = json.dumps(summary, indent=2)
        write_text_atomic(a.out / "gpu_timing.json", text + "\n")
        print(text)
    finally:
        faulthandler.cancel_dump_traceback_later()
    for row in checks.failed:
        print(f"error: check failed: {row['check']}: {row['detail']}", file=sys.stderr)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
