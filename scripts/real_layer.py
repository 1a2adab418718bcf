"""What judging a real layer costs: the README's module command on a layer of a real model's shape, from nothing and
with its golden cached, its wall time, peak memory and where the time went.

    python scripts/real_layer.py                      # Llama 3 8B's MLP (4096 -> 14336), 3.2 3B and 1B, Qwen2.5 0.5B
    python scripts/real_layer.py --layer llama3.2-1b --out out/real-layer

For each layer: a safetensors file of random bfloat16 weights under Hugging Face's names (``model.layers.0.mlp.``,
as a checkpoint's shard holds them), then ``python -m compare run --module examples/llama_mlp.py ... --dtype bfloat16
--mode fwd+bwd`` (the README's five module backends, 1 x 16 tokens) twice in a fresh data cache: the first computes
the golden data, the second finds it cached. Each run is a child process under ``cProfile`` (its overhead is on
Python calls; the work is in numpy, torch and XLA), and ``os.wait4`` gives its own peak resident memory. The time is
parted into the golden data (reference, plain computation, resolution, the fresh draw's reference), judging (the
gate on every judged output, the every-call check) and the rest (imports, compiles, timing), from the profile's
cumulative times. Writes ``real-layer.json`` and prints a table; no test reads it (a figure of this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: name -> (hidden size, intermediate size), from the models' published configs.
LAYERS: dict[str, tuple[int, int]] = {
    "llama3-8b": (4096, 14336),
    "llama3.2-3b": (3072, 8192),
    "llama3.2-1b": (2048, 8192),
    "qwen2.5-0.5b": (896, 4864),
}
#: Cumulative profile entries (file suffix, function) of each part; none of one part runs inside another's.
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "golden": (
        ("compare/run/cell.py", "plain_reference"),
        ("compare/run/harness.py", "case_resolution"),
        ("compare/run/pipeline.py", "get"),
    ),
    "judging": (
        ("compare/run/pipeline.py", "judge_read"),
        ("compare/run/pipeline.py", "judge_calls"),
        ("compare/run/pipeline.py", "add"),
    ),
}


def write_layer(path: Path, dim: int, hidden: int) -> None:
    """Random bfloat16 weights of a Llama-style MLP, ``N(0, 1) / sqrt(fan_in)``, under Hugging Face's names."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)

    def w(out: int, inp: int) -> torch.Tensor:
        return (torch.randn(out, inp, generator=g) / inp**0.5).to(torch.bfloat16)

    prefix = "model.layers.0.mlp."
    save_file(
        {
            f"{prefix}gate_proj.weight": w(hidden, dim),
            f"{prefix}up_proj.weight": w(hidden, dim),
            f"{prefix}down_proj.weight": w(dim, hidden),
        },
        str(path),
    )


def predicted_peak(dim: int, hidden: int) -> int:
    """The preflight's predicted peak (``compare.run.preflight.peak_plan``) of the run :func:`run_once` makes: five
    backends, fwd+bwd, with the cold-cache flush of this machine."""
    from compare.problem.cases import Case, Shape
    from compare.run import preflight
    from compare.timing import llc

    case = Case("swiglu", Shape(1, 16, dim, hidden), "bfloat16")  # the module's three weights, of the same shapes
    return preflight.peak_plan(case, 5, True, llc.flush_bytes(llc.cpu_last_level())).peak


def run_once(dim: int, hidden: int, weights: Path, cache: Path, out: Path, prof: Path) -> dict[str, float]:
    """One run of the README's command: wall seconds, peak resident bytes, seconds per part."""
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "compare", "run"]
    cmd += ["--module", str(ROOT / "examples" / "llama_mlp.py"), "--dim", str(dim), "--hidden", str(hidden)]
    cmd += ["--batch", "1", "--seq", "16", "--dtype", "bfloat16", "--mode", "fwd+bwd", "--weights", str(weights)]
    cmd += ["--prefix", "model.layers.0.mlp.", "--out", str(out), "--quiet"]
    env = {**os.environ, "FUSION_COMPARE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the run exited {os.waitstatus_to_exitcode(status)}: {' '.join(cmd)}")
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    parts = {name: 0.0 for name in PARTS}
    for (file, _, func), (_, _, _, cum, _) in stats.items():
        for name, where in PARTS.items():
            if any(file.endswith(f) and func == fn for f, fn in where):
                parts[name] += cum
    return {"wall_s": wall, "peak_bytes": usage.ru_maxrss * 1024, **{f"{k}_s": v for k, v in parts.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--out", default="out/real-layer")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.layer:
        dim, hidden = LAYERS[name]
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            t = Path(tmp)
            write_layer(t / "model.safetensors", dim, hidden)
            for label in ("from nothing", "cached"):
                got = run_once(dim, hidden, t / "model.safetensors", t / "cache", t / "run", t / "profile")
                predicted = predicted_peak(dim, hidden)
                rows.append({"layer": name, "dim": dim, "hidden": hidden, "run": label, **got, "predicted": predicted})
                r = rows[-1]
                print(
                    f"{name:13} {label:12} {r['wall_s']:6.1f} s  peak {r['peak_bytes'] / 1e9:5.2f} GB "
                    f"(predicted {predicted / 1e9:5.2f} GB, {predicted / r['peak_bytes'] - 1:+.0%})  "
                    f"golden {r['golden_s']:5.1f} s  judging {r['judging_s']:5.1f} s "
                    f"({r['judging_s'] / r['wall_s']:.0%})",
                    flush=True,
                )
    cpu = (
        next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            "?",
        )
        if Path("/proc/cpuinfo").exists()
        else "?"
    )
    machine = {"cpu": cpu, "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    (out / "real-layer.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
