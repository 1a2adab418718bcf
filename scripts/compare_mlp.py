"""Compare every backend on a GeGLU MLP, taking shapes as the blog post's scripts do.

    python scripts/compare_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --dtype bfloat16

A thin wrapper over ``python -m compare run --model geglu ...``: every option of ``run`` is accepted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compare.cli.main import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--model" not in args and "--preset" not in args:
        args = ["--model", "geglu", *args]
    raise SystemExit(main(["run", *args]))
