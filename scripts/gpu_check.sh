#!/usr/bin/env bash
# GPU check, for a CUDA machine: the test suite on CUDA, then the blog-mlp report in bfloat16 for every backend.
# Everything lands under one folder: OUT_DIR (default reports/gpu), with a log per step and the environment.
#
#   bash scripts/gpu_check.sh            # uses the python on PATH (torch with CUDA, triton, jax[cuda], flax)
#
# Budget: about 6 minutes on one H100/H200-class GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-reports/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

{
  echo "# GPU check environment"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  $PY -c "import triton; print('triton', triton.__version__)" || true
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || true
  $PY -c "import flax; print('flax', flax.__version__)" || true
} > "$OUT_DIR/environment.txt" 2>&1
cat "$OUT_DIR/environment.txt"

status=0
timeout 240 $PY -m pytest -q -x -p no:cacheprovider tests 2>&1 | tee "$OUT_DIR/tests.log" | tail -n 30 || status=1

timeout 300 $PY -m compare run --preset blog-mlp --dtype bfloat16 \
  --backend torch-eager torch-compile torch-triton jax-xla --budget 2 --out "$OUT_DIR" 2>&1 \
  | tee "$OUT_DIR/run.log" | tail -n 20 || status=1
exit $status
