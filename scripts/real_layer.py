"""What judging a real layer costs: the README's module command on a layer of a real model's shape, from nothing and
with its golden cached, its wall time, peak memory and where the time went.

    python scripts/real_layer.py                      # Llama 3 8B's MLP (4096 -> 14336), 3.2 3B and 1B, Qwen2.5 0.5B
    python scripts/real_layer.py --layer llama3.2-1b --out out/real-layer
    python scripts/real_layer.py --layer qwen2.5-0.5b --checkpoint 24   # every layer of a 24-layer checkpoint

For each layer: a safetensors file of random bfloat16 weights under Hugging Face's names (``model.layers.0.mlp.``,
as a checkpoint's shard holds them), then ``python -m compare run --module examples/llama_mlp.py ... --dtype bfloat16
--mode fwd+bwd`` (the README's five module backends, 1 x 16 tokens) twice in a fresh data cache: the first computes
the golden data, the second finds it cached. Each run is a child process (this script with ``--child``: the CLI
in-process, the functions of :data:`PARTS` wrapped by a clock), and ``os.wait4`` gives its own peak resident
memory. Its time is parted into judging (the gate on a judged output, the every-call check, the gate's statistics of
the plain computation against the golden), the golden data (the
float64 reference, the plain computation, the resolution rows, the fresh draw and its reference), the timed samples
alone (every backend's median call times its samples' calls, from ``results.json``), the first calls (compiles
included) and the rest. No profiler: ``cProfile``'s cost per Python call made the gate's many small numpy calls
look three times their cost. Writes ``real-layer.json`` and prints a table; no test reads it (a figure of this
machine).
``--checkpoint N`` instead writes N such layers in two shards with their ``model.safetensors.index.json`` and runs the
command once on all of them (``--prefix 'model.layers.{i}.mlp.' --layers all``), from nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: name -> (hidden size, intermediate size), from the models' published configs.
LAYERS: dict[str, tuple[int, int]] = {
    "llama3-8b": (4096, 14336),
    "llama3.2-3b": (3072, 8192),
    "llama3.2-1b": (2048, 8192),
    "qwen2.5-0.5b": (896, 4864),
}
#: The Hugging Face names' prefix of layer ``i``'s MLP.
TEMPLATE = "model.layers.{i}.mlp."
#: The functions whose seconds make each part of a run (module, name: each called through its module's namespace,
#: where the wrapper replaces it): judging (the gate on a judged output, the every-call check, the gate's statistics
#: of the plain computation against the golden) and the golden data
#: (the float64 reference, the plain computation, the resolution rows, the fresh draw and its reference). A call
#: inside another of its part counts once.
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "judging": (
        ("compare.run.pipeline", "judge_read"),
        ("compare.run.pipeline", "spot_failures"),
        ("compare.run.harness", "golden_stats"),
    ),
    "golden": (
        ("compare.run.harness", "_golden"),
        ("compare.run.harness", "plain_reference"),
        ("compare.run.harness", "case_resolution"),
        ("compare.gate.fresh", "draw"),
        ("compare.gate.fresh", "reference"),
    ),
}


def write_layer(path: Path, dim: int, hidden: int) -> None:
    """Random bfloat16 weights of a Llama-style MLP, ``N(0, 1) / sqrt(fan_in)``, under Hugging Face's names."""
    from safetensors.torch import save_file

    save_file(_layers(dim, hidden, 1), str(path))


def _layers(dim: int, hidden: int, layers: int) -> dict[str, Any]:
    """``layers`` Llama-style MLPs' random bfloat16 weights by their Hugging Face names (``model.layers.{i}.mlp.``)."""
    import torch

    g = torch.Generator().manual_seed(0)

    def w(out: int, inp: int) -> torch.Tensor:
        return (torch.randn(out, inp, generator=g) / inp**0.5).to(torch.bfloat16)

    tensors = {}
    for i in range(layers):
        prefix = TEMPLATE.format(i=i)
        tensors |= {f"{prefix}gate_proj.weight": w(hidden, dim), f"{prefix}up_proj.weight": w(hidden, dim)}
        tensors[f"{prefix}down_proj.weight"] = w(dim, hidden)
    return tensors


def write_checkpoint(folder: Path, dim: int, hidden: int, layers: int) -> Path:
    """A sharded checkpoint of ``layers`` such MLPs, the first half in one shard and the rest in another, as Hugging
    Face writes them: the path of its ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    tensors = _layers(dim, hidden, layers)
    shards = [f"model-0000{k}-of-00002.safetensors" for k in (1, 2)]
    where = {n: shards[int(n.split(".")[2]) >= layers // 2] for n in tensors}
    for shard in shards:
        save_file({n: t for n, t in tensors.items() if where[n] == shard}, str(folder / shard))
    index = folder / "model.safetensors.index.json"
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": where}))
    return index


def predicted_peak(dim: int, hidden: int) -> int:
    """The preflight's predicted peak (``compare.run.preflight.peak_plan``) of the run :func:`run_once` makes: five
    backends, fwd+bwd, with the cold-cache flush of this machine."""
    from compare.problem.cases import Case, Shape
    from compare.run import preflight
    from compare.timing import llc

    case = Case("swiglu", Shape(1, 16, dim, hidden), "bfloat16")  # the module's three weights, of the same shapes
    return preflight.peak_plan(case, 5, True, llc.flush_bytes(llc.cpu_last_level())).peak


def run_once(dim: int, hidden: int, weights: Path, cache: Path, out: Path, layers: bool = False) -> dict[str, Any]:
    """One run of the README's command (``layers``: on every layer of a sharded checkpoint, ``--layers all``): wall
    seconds, its CPU seconds (user and system, from ``os.wait4``: what a busy machine's other work moves less than
    the wall time), peak resident bytes, seconds judging and on the golden data, the timed samples' and first calls'
    seconds, and the seconds from each progress line to the next (the CLI prints a stage's line only now and then
    where its output is not a terminal: a guide, not a breakdown)."""
    args = ["run", "--module", str(ROOT / "examples" / "llama_mlp.py"), "--dim", str(dim), "--hidden", str(hidden)]
    args += ["--batch", "1", "--seq", "16", "--dtype", "bfloat16", "--mode", "fwd+bwd", "--weights", str(weights)]
    args += ["--prefix", TEMPLATE if layers else TEMPLATE.format(i=0), "--out", str(out)]
    args += ["--layers", "all"] if layers else []
    spent = out.parent / "judging.json"
    env = {**os.environ, "FUSION_COMPARE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(spent), "--", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert proc.stdout is not None
    lines = [(time.perf_counter() - t0, line.rstrip("\n")) for line in proc.stdout]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        tail = "\n".join(text for _, text in lines[-20:])
        raise SystemExit(f"the run exited {os.waitstatus_to_exitcode(status)}: {' '.join(cmd)}\n{tail}")
    stages: dict[str, float] = {"start-up": lines[0][0] if lines else wall}
    for (t, text), (t_next, _) in zip(lines, [*lines[1:], (wall, "")], strict=True):
        label = text.split("  (elapsed")[0].removeprefix("... ").removeprefix("fwd+bwd: ")
        label = "judging and the end" if label.startswith(("[", "judging ", "data cache", "wrote ")) else label
        stages[label] = stages.get(label, 0.0) + t_next - t
    cpu = usage.ru_utime + usage.ru_stime  # the child's own CPU seconds: a figure a busy machine moves less
    got = {"wall_s": wall, "cpu_s": cpu, "peak_bytes": usage.ru_maxrss * 1024, **_samples_s(out / "results.json")}
    return {**got, **json.loads(spent.read_text()), "stages": stages}


def child(spent: Path, argv: list[str]) -> None:
    """The CLI on ``argv`` in this process, with :data:`PARTS`' functions wrapped by a clock; each part's seconds
    go to ``spent`` (``{"judging_s": ..., "golden_s": ...}``) whatever the exit."""
    import importlib

    from compare.cli.main import main

    total = dict.fromkeys(PARTS, 0.0)
    depth = dict.fromkeys(PARTS, 0)
    for part, where in PARTS.items():
        for module, name in where:
            mod = importlib.import_module(module)

            fn = getattr(mod, name)

            def timed(*a: Any, _fn: Any = fn, _part: str = part, **k: Any) -> Any:
                depth[_part] += 1
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:
                    depth[_part] -= 1
                    if not depth[_part]:
                        total[_part] += time.perf_counter() - t0

            setattr(mod, name, timed)
    try:
        code = main(argv)
    finally:
        spent.write_text(json.dumps({f"{k}_s": v for k, v in total.items()}))
    raise SystemExit(code)


def _samples_s(results: Path) -> dict[str, float]:
    """What the run's timed samples alone took (``samples_s``: every backend's median call times its warm and cold
    samples' calls, the least any timing of these steps with these sample counts costs) and its first calls
    (``first_calls_s``: compiles included), from its ``results.json``."""
    samples = first = 0.0
    for r in json.loads(results.read_text())["results"]:
        for key in ("timing", "cold"):
            t = r.get(key)
            if t:
                samples += t["median_s"] * t["n"] * t["calls_per_sample"]
        first += (r.get("timing") or {}).get("first_call_s") or 0.0
    return {"samples_s": samples, "first_calls_s": first}


def checkpoint(name: str, layers: int, out: Path) -> None:
    """Every layer of a generated ``layers``-layer checkpoint of ``name``'s shape in one run, from nothing."""
    dim, hidden = LAYERS[name]
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        t = Path(tmp)
        index = write_checkpoint(t, dim, hidden, layers)
        got = run_once(dim, hidden, index, t / "cache", t / "run", layers=True)
        row = {"layer": name, "layers": layers, "dim": dim, "hidden": hidden, **got}
    print(
        f"{name}: {layers} layers in {row['wall_s']:.0f} s ({row['wall_s'] / layers:.1f} s a layer), "
        f"peak {row['peak_bytes'] / 1e9:.2f} GB",
        flush=True,
    )
    (out / f"checkpoint-{name}-{layers}.json").write_text(json.dumps({"machine": _machine(), "run": row}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--out", default="out/real-layer")
    ap.add_argument(
        "--checkpoint", type=int, default=0, help="instead: every layer of a checkpoint of this many layers of --layer"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)  # run_once's child: the CLI on the arguments after --
    a, rest = ap.parse_known_args()
    if a.child:
        return child(Path(a.child), rest[1:] if rest[:1] == ["--"] else rest)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.checkpoint:
        return checkpoint(a.layer[0], a.checkpoint, out)
    rows = []
    for name in a.layer:
        dim, hidden = LAYERS[name]
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            t = Path(tmp)
            write_layer(t / "model.safetensors", dim, hidden)
            for label in ("from nothing", "cached"):
                got = run_once(dim, hidden, t / "model.safetensors", t / "cache", t / "run")
                predicted = predicted_peak(dim, hidden)
                rows.append({"layer": name, "dim": dim, "hidden": hidden, "run": label, **got, "predicted": predicted})
                r = rows[-1]
                print(
                    f"{name:13} {label:12} {r['wall_s']:6.1f} s (CPU {r['cpu_s']:6.1f} s)  "
                    f"peak {r['peak_bytes'] / 1e9:5.2f} GB "
                    f"(predicted {predicted / 1e9:5.2f} GB, {predicted / r['peak_bytes'] - 1:+.0%})  "
                    f"golden {r['golden_s']:5.1f} s  judging {r['judging_s']:5.1f} s "
                    f"({r['judging_s'] / r['wall_s']:.0%})  timed samples {r['samples_s']:5.1f} s  "
                    f"first calls {r['first_calls_s']:5.1f} s",
                    flush=True,
                )
    (out / "real-layer.json").write_text(json.dumps({"machine": _machine(), "runs": rows}, indent=1) + "\n")


def _machine() -> dict[str, Any]:
    """The CPU's model name, its count and the load before the run."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}


if __name__ == "__main__":
    main()
