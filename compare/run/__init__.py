"""Running cells: the conductor of a run or sweep and its executors (the harness and its cell pipeline, a sweep's
local engine and cell worker process; the engines' registry), progress, preflight checks, options, the stores of
finished cells and a sweep's grid, exit codes, the compile-cost sweep, the tensor-parallel launcher, worker and
host commands, and the A/B coordinator and its worker (two interpreters or checkouts timed in one group)."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends", "timing", "gate", "kernels", "cost", "results")
