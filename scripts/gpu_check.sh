#!/usr/bin/env bash
# GPU check, for one CUDA machine (H100/H200 class), with every step capped: 150 + 260 + 50 s, under 8 minutes. Everything lands under OUT_DIR
# (default reports/gpu): environment.txt, tests.log, the blog-mlp bf16 report (REPORT.md, results.json, traces,
# plots) for every backend in fwd, bwd and fwd+bwd with kernel counts, and the elementwise-kernel bandwidth.
#
#   bash scripts/gpu_check.sh      # the python on PATH: torch with CUDA, triton, jax[cuda], flax, safetensors,
#                                  # matplotlib, pytest (and jax-triton for the jax-triton backend)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-reports/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
status=0

{
  echo "# GPU check environment"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "triton", "jax", "jaxlib", "flax", "jax_triton", "numpy", "safetensors", "matplotlib"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as exc:  # report what is missing, keep going
        print(m, "MISSING:", type(exc).__name__, exc)
import torch, jax
print("cuda", torch.version.cuda, torch.cuda.get_device_name(0), "| jax devices", jax.devices())
PY
} > "$OUT_DIR/environment.txt" 2>&1
cat "$OUT_DIR/environment.txt"

echo "== tests on CUDA"
timeout 150 $PY -m pytest -q -x -p no:cacheprovider tests > "$OUT_DIR/tests.log" 2>&1 || status=1
tail -n 15 "$OUT_DIR/tests.log"

echo "== blog-mlp bf16: every backend, fwd / bwd / fwd+bwd, kernel counts and traces"
timeout 260 $PY -m compare run --preset blog-mlp --dtype bfloat16 --mode fwd bwd fwd+bwd --trace \
  --budget 0.5 --out "$OUT_DIR" > "$OUT_DIR/run.log" 2>&1 || status=1
tail -n 5 "$OUT_DIR/run.log"

echo "== GeGLU elementwise kernel against copy bandwidth"
timeout 50 $PY scripts/kernel_bandwidth.py --out "$OUT_DIR" > "$OUT_DIR/kernel_bandwidth.log" 2>&1 || status=1
cat "$OUT_DIR/kernel_bandwidth.log"
exit $status
