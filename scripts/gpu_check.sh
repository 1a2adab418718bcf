#!/usr/bin/env bash
# GPU check, for one CUDA machine (H100/H200 class). Every step is capped and runs whatever happened before it;
# each one's exit status and seconds land in OUT_DIR/steps.md, and the script exits non-zero if any step failed.
#
#   bash scripts/gpu_check.sh            # on the GPU machine: writes reports/gpu/
#   bash scripts/gpu_check.sh --dry-run  # on any machine: every step that can run without CUDA, small, on CPU
#
# Steps (caps on the GPU add up to 560 s, under 10 minutes; the dry run's caps are its own):
#   1 environment      versions, GPU, driver (10 s)
#   2 gpu-build        every Triton kernel and autotune config compiled for sm_90 (+ sm_80) with its register,
#                      spill and shared-memory bill: catches a broken kernel before device time is spent (70 s)
#                      dry run: sm_90, bf16 only
#   3 tests            the whole suite on CUDA, no -x: every failure is listed (160 s)
#                      dry run: the GPU-marked blog-kernel tests (they skip, saying why; the suite runs the rest)
#   4 report           blog-mlp bf16, every backend, fwd / bwd / fwd+bwd, kernel counts, traces and memory (saved
#                      for backward against the cost model, peak from the device allocators) (120 s)
#                      dry run: tiny bf16 fwd, torch-eager, a short budget, with its memory
#   5 bandwidth        the GeGLU elementwise kernel against the copy bandwidth (30 s); needs CUDA
#   6 gpu-timing       NVML telemetry (clocks, power, throttle reasons, energy) over timed blocks, and a CUDA-graph
#                      capture and replay checked against eager (30 s); dry run: the same code paths on a scripted
#                      NVML device and without CUDA (NotCaptured)
#   7 graphs-report    tiny bf16 fwd, torch-eager and torch-compile replayed from CUDA graphs, cold and warm, with
#                      the telemetry in the timing table (40 s); needs CUDA
#   8 memory           tiny bf16 fwd+bwd, torch-eager, torch-triton-fused and jax-xla: saved for backward against
#                      the cost model, the peak from torch.cuda.max_memory_allocated and JAX's memory_stats (30 s);
#                      dry run: the same readers on scripted devices
#   9 gemm-fusion      jax-xla-gemm-fusion, blog-mlp bf16 fwd and fwd+bwd, profiled, in a process started with its
#                      XLA flags (XLA reads them once per process; the plain jax-xla is the report step's) (30 s);
#                      dry run: the same command, tiny, where the backend says it needs a GPU
#  10 ray-sweep        a two-cell sweep on a local Ray instance (--engine ray): tiny bf16, torch-eager and jax-xla,
#                      each cell a Ray task asking for the GPU, rows labelled with the node (40 s); needs ray
#                      (pip install -e '.[cluster]'); dry run: torch-eager in fp32 and bf16 on CPU
#
# The report step runs every backend, torch-compile-max-autotune too: its compile autotunes every GEMM.
#
# The python on PATH (or $PYTHON) must already have torch with CUDA, triton, jax[cuda], flax, safetensors, matplotlib
# and pytest. The one thing it installs, before the first step and offline, is what the GPU image lacks
# (constraints/gpu-extra.txt: jax-triton, for the jax-triton backend), from the ignored folder gpu-wheels/ that
# `make gpu-wheels` fills on a machine with network: copy that folder along with the checkout. Without it nothing is
# installed and the output says so (jax-triton then is there only if the environment has it). The dry run only
# resolves those wheels (pip --dry-run). JAX is told not to preallocate 75% of the GPU, since torch shares it in the
# same processes.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$arg'; allowed: --dry-run" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
# jax-xla-gemm-fusion's flags (jax_impl/backends/xla_gemm_fusion.py: FLAGS), for the process of its step only
GEMM_FUSION_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=true --xla_gpu_triton_gemm_any=true"
if [ "$DRY" = 1 ]; then
  OUT_DIR=${OUT_DIR:-$(mktemp -d)}
else
  OUT_DIR=${OUT_DIR:-reports/gpu}
fi
mkdir -p "$OUT_DIR" || { echo "error: cannot create $OUT_DIR" >&2; exit 2; }
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
STEPS="$OUT_DIR/steps.md"
printf '| step | status | seconds | log |\n|---|---|---|---|\n' > "$STEPS"
failed=0

# step NAME CAP_SECONDS LOG COMMAND...: run capped, record the exit status (124: hit its cap), never stop here
step() {
  local name=$1 cap=$2 log=$3; shift 3
  echo "== $name (cap ${cap}s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$cap" "$@" > "$OUT_DIR/$log" 2>&1
  rc=$?
  local status=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status="timed out after ${cap}s"; failed=1
  elif [ "$name" = report ] && [ "$rc" = 1 ]; then status="finding (exit 1: a parity failure, see the report)"; failed=1
  elif [ "$rc" != 0 ]; then status="failed (exit $rc)"; failed=1; fi
  printf '| %s | %s | %s | %s |\n' "$name" "$status" "$((SECONDS - t0))" "$log" >> "$STEPS"
  tail -n 8 "$OUT_DIR/$log"
  echo "-- $name: $status"
}

# the wheels of gpu-wheels/, installed offline (the dry run: resolved only); its line also opens environment.txt
WHEELS=gpu-wheels
if [ -d "$WHEELS" ]; then
  pip_dry=; [ "$DRY" = 1 ] && pip_dry=--dry-run
  "$PY" -m pip install --disable-pip-version-check --no-index --find-links "$WHEELS" --no-deps $pip_dry \
    -r constraints/gpu-extra.txt > "$OUT_DIR/wheels.log" 2>&1
  rc=$?
  done_re='^(Successfully installed|Would install|Requirement already satisfied)'
  if [ "$rc" = 0 ]; then WHEELS_NOTE="$WHEELS/ present: $(grep -E "$done_re" "$OUT_DIR/wheels.log" | tail -n 1)"
  else WHEELS_NOTE="$WHEELS/ present, but its offline install failed (exit $rc, wheels.log)"; fi
else
  WHEELS_NOTE="$WHEELS/ absent: nothing installed (make gpu-wheels, then copy the folder along with the checkout)"
fi
echo "== wheels: $WHEELS_NOTE"
export WHEELS_NOTE

skip() {
  printf '| %s | skipped: %s | 0 | - |\n' "$1" "$2" >> "$STEPS"
  echo "== $1: skipped: $2"
}

env_report() {
  echo "# GPU check environment"; date -u
  echo "wheels: $WHEELS_NOTE"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  "$PY" - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "triton", "jax", "jaxlib", "flax", "jax_triton", "numpy", "safetensors", "matplotlib", "pytest"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as exc:  # report what is missing and keep going
        print(m, "MISSING:", type(exc).__name__, exc)
import torch
cuda = torch.cuda.is_available()
print("torch cuda", torch.version.cuda, torch.cuda.get_device_name(0) if cuda else "(no CUDA device)")
try:
    import jax
    print("jax devices", jax.devices())
except Exception as exc:
    print("jax devices: error:", exc)
PY
}
export -f env_report
export PY

step environment 10 environment.txt bash -c env_report

if [ "$DRY" = 1 ]; then
  step gpu-build 90 gpu_build.log "$PY" -m compare gpu-build --arch sm_90 --dtype bfloat16 --out "$OUT_DIR/gpu-build"
  step tests 200 tests.log "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_blog_kernels.py
  step report 130 run.log "$PY" -m compare run --preset tiny --dtype bfloat16 --mode fwd --backend torch-eager \
    --budget 0.05 --no-plots --memory --out "$OUT_DIR/report"
  skip bandwidth "needs CUDA (dry run)"
  step gpu-timing 30 gpu_timing.log "$PY" scripts/gpu_timing_check.py --fake --out "$OUT_DIR/gpu-timing"
  step graphs-report 60 graphs.log "$PY" -m compare run --preset tiny --dtype bfloat16 --mode fwd \
    --backend torch-eager --cuda-graphs --cache both --budget 0.05 --no-plots --no-parity-cache \
    --out "$OUT_DIR/graphs"
  step memory 40 gpu_memory.log "$PY" scripts/gpu_memory_check.py --fake --out "$OUT_DIR/gpu-memory"
  step gemm-fusion 40 gemm_fusion.log env XLA_FLAGS="$GEMM_FUSION_FLAGS" "$PY" -m compare run --preset tiny \
    --dtype bfloat16 --mode fwd fwd+bwd --backend jax-xla-gemm-fusion --profile --budget 0.05 --no-plots \
    --out "$OUT_DIR/gemm-fusion"
  step ray-sweep 60 ray_sweep.log "$PY" -m compare sweep --preset tiny --tokens 16 --dtype float32 bfloat16 \
    --backend torch-eager --engine ray --budget 0.05 --no-plots --no-ceilings --out "$OUT_DIR/ray-sweep"
else
  step gpu-build 70 gpu_build.log "$PY" -m compare gpu-build --arch sm_90 sm_80 --out "$OUT_DIR/gpu-build"
  step tests 160 tests.log "$PY" -m pytest -q -p no:cacheprovider tests
  step report 120 run.log "$PY" -m compare run --preset blog-mlp --dtype bfloat16 --mode fwd bwd fwd+bwd --trace \
    --budget 0.5 --out "$OUT_DIR"
  step bandwidth 30 kernel_bandwidth.log "$PY" scripts/kernel_bandwidth.py --out "$OUT_DIR"
  step gpu-timing 30 gpu_timing.log "$PY" scripts/gpu_timing_check.py --out "$OUT_DIR/gpu-timing"
  step graphs-report 40 graphs.log "$PY" -m compare run --preset tiny --dtype bfloat16 --mode fwd \
    --backend torch-eager torch-compile --cuda-graphs --cache both --budget 0.2 --no-plots --out "$OUT_DIR/graphs"
  step memory 30 gpu_memory.log "$PY" scripts/gpu_memory_check.py --limit-s 25 --out "$OUT_DIR/gpu-memory"
  step gemm-fusion 30 gemm_fusion.log env XLA_FLAGS="$GEMM_FUSION_FLAGS" "$PY" -m compare run --preset blog-mlp \
    --dtype bfloat16 --mode fwd fwd+bwd --backend jax-xla-gemm-fusion --profile --budget 0.2 --no-plots \
    --out "$OUT_DIR/gemm-fusion"
  step ray-sweep 40 ray_sweep.log "$PY" -m compare sweep --preset tiny --tokens 16 --dtype bfloat16 \
    --backend torch-eager jax-xla --engine ray --budget 0.2 --no-plots --out "$OUT_DIR/ray-sweep"
fi

echo "== steps"
cat "$STEPS"
exit $failed
