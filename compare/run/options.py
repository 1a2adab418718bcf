"""The grid options shared by ``run``, ``profile`` and ``sweep`` (dtypes, backends, modes, seed, budget, how much
to print), and their checks. One definition, used by ``compare.cli`` and ``compare.sweep.command`` alike."""

from __future__ import annotations

import argparse

from compare.backends.registry import BACKENDS, spec
from compare.problem.cases import DTYPES, MODES, check_finite, check_name, check_seed, check_unique


def add_grid_args(p: argparse.ArgumentParser, budget_help: str) -> None:
    """Dtypes, backends, modes, seed and timing budget: the options shared by ``run``, ``profile`` and ``sweep``."""
    p.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    # resolved by check_grid_args from the registry as it is then (a backend registered by a test is seen)
    p.add_argument(
        "--backend",
        nargs="+",
        default=None,
        help=f"any of: {', '.join(BACKENDS)} (default: every single-device backend, or every tensor-parallel one "
        "when a --world-size above 1 is given)",
    )
    p.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the golden data (a non-negative integer)")
    p.add_argument("--budget", type=float, default=1.0, help=budget_help)
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on a parity deviation too (a real difference an honest implementation can have), not only on a "
        "failure",
    )
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true", help="print only problems (failed cells) and the result")
    talk.add_argument("--verbose", action="store_true", help="print every cell as it starts and every message")


def check_grid_args(a: argparse.Namespace) -> None:
    """The options :func:`add_grid_args` defines, checked before anything runs (bad input raises InputError)."""
    check_seed(a.seed)
    check_finite("--budget", a.budget)
    if a.backend is None:
        sizes = getattr(a, "world_size", None) or [1]
        a.backend = default_backends(sizes if isinstance(sizes, list) else [sizes])
    for b in a.backend:
        spec(b)
    check_unique("backend", a.backend)
    check_unique("dtype", [check_name("dtype", d, DTYPES) for d in a.dtype])
    check_unique("mode", [check_name("mode", m, MODES) for m in a.mode])


def default_backends(world_sizes: list[int]) -> list[str]:
    """Every single-device backend, or, when a world size above 1 is asked for, every tensor-parallel one."""
    parallel = max(world_sizes) > 1
    return [name for name, s in BACKENDS.items() if bool(s.runtime) == parallel]
