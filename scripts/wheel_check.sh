#!/usr/bin/env bash
# The package as a user gets it: build the wheel from the working tree, install it into a fresh virtual environment
# with the pinned CPU stack (constraints/cpu.txt, as `make env` installs it), and run it from a folder outside the
# checkout, where nothing of the checkout can be imported or read: `python -m compare list`, a `tiny` run of a few
# backends (the Triton ones interpreted) that must exit 0 and write its report, and a one-kernel `gpu-build`. The
# environment and every file it wrote are removed at the end, however the check ends.
#
# Usage: scripts/wheel_check.sh (`make wheel-check`, part of `make ci`). PYTHON picks the interpreter the venv is
# made from (default python3). Installs come from pip's cache after the first run (about a minute then).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PYTHON=${PYTHON:-python3}

start=$SECONDS
step() { printf 'wheel-check: %s (%ds)\n' "$1" $((SECONDS - start)); }

work=$(mktemp -d)
trap 'rm -rf "$work"; step "removed the environment and the scratch folder"' EXIT
venv=$work/venv

# Every step is bounded: an install that hangs on the network, or a run that hangs, fails the check.
step "copy the working tree (tracked and untracked files, nothing git ignores: no earlier build output)"
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$work/src"

step "fresh virtual environment"
timeout 120 "$PYTHON" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

step "build the wheel"
timeout 600 "${pip[@]}" wheel --no-deps -w "$work/dist" "$work/src"
wheels=("$work"/dist/fusion_compare-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "wheel-check: expected one wheel, got: ${wheels[*]}" >&2; exit 1; }

step "install the pinned stack and the wheel (with the triton extra)"
# no byte-compiling at install: seconds less, and thousands of files fewer to remove afterwards
timeout 1200 "${pip[@]}" install --no-compile -c "$repo/constraints/cpu.txt" torch
timeout 1200 "${pip[@]}" install --no-compile -c "$repo/constraints/cpu.txt" "${wheels[0]}[triton]"

# Outside the checkout, nothing but the installed package: no PYTHONPATH, no golden folder of the tests, the data
# caches in the scratch folder.
mkdir "$work/run"
cd "$work/run"
unset PYTHONPATH FUSION_COMPARE_GOLDEN_DIR
export FUSION_COMPARE_CACHE=$work/cache
py=$venv/bin/python

step "the package and its golden data are the installed ones"
timeout 120 "$py" - "$venv" <<'EOF'
import sys
from pathlib import Path

import compare
from compare.problem import golden

venv = Path(sys.argv[1]).resolve()
for where in (Path(compare.__file__), golden.GOLDEN_DIR / golden.MANIFEST):
    assert where.resolve().is_relative_to(venv) and where.is_file(), f"{where} is not a file of the installed package"
print(f"golden data: {golden.GOLDEN_DIR} ({len(golden.read_manifest()['files'])} cases)")
EOF

step "python -m compare list"
timeout 300 "$py" -m compare list >list.txt
grep -q "^  tiny " list.txt

step "python -m compare run --preset tiny"
timeout 600 "$py" -m compare run --preset tiny --backend torch-eager torch-triton torch-triton-fused jax-xla \
    --dtype float32 --mode fwd --budget 0.1 --cache warm --no-ceilings --no-plots --quiet --out out
for f in REPORT.md DETAILS.md results.json; do
    [ -s "out/$f" ] || { echo "wheel-check: the run wrote no out/$f" >&2; exit 1; }
done

step "python -m compare gpu-build (one kernel, sm_90)"
timeout 600 "$py" -m compare gpu-build --arch sm_90 --dtype float32 --kernel glu_fwd --quick --jobs 1 \
    --cache-dir "$work/gpu-build-cache" --out gpu-build --timeout 300
[ -s gpu-build/gpu_build.json ] || { echo "wheel-check: gpu-build wrote no gpu_build.json" >&2; exit 1; }

step "passed"
