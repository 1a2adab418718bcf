"""The grid options shared by ``run``, ``profile`` and ``sweep`` (dtypes, backends, modes, seed, budget, how much
to print), and their checks. One definition, used by ``compare.cli`` and ``compare.sweep`` alike."""

from __future__ import annotations

import argparse

from compare.cases import DTYPES, MODES, check_finite, check_name, check_seed, check_unique
from compare.registry import BACKENDS, spec


def add_grid_args(p: argparse.ArgumentParser, budget_help: str) -> None:
    """Dtypes, backends, modes, seed and timing budget: the options shared by ``run``, ``profile`` and ``sweep``."""
    p.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    # the registry as it is when the parser is built (a backend registered later, by a test, is not a stale default)
    p.add_argument("--backend", nargs="+", default=list(BACKENDS), help=f"any of: {', '.join(BACKENDS)}")
    p.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the golden data (a non-negative integer)")
    p.add_argument("--budget", type=float, default=1.0, help=budget_help)
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true", help="print only problems (failed cells) and the result")
    talk.add_argument("--verbose", action="store_true", help="print every cell as it starts and every message")


def check_grid_args(a: argparse.Namespace) -> None:
    """The options :func:`add_grid_args` defines, checked before anything runs (bad input raises InputError)."""
    check_seed(a.seed)
    check_finite("--budget", a.budget)
    for b in a.backend:
        spec(b)
    check_unique("backend", a.backend)
    check_unique("dtype", [check_name("dtype", d, DTYPES) for d in a.dtype])
    check_unique("mode", [check_name("mode", m, MODES) for m in a.mode])
