"""The command line, python -m compare: every argparse parser, and the commands that turn parsed arguments into
checked, typed options for the packages below (main: the parser and the small commands; run, sweep, ab and gpu_build:
the bigger subcommands; cache: the data cache's bound and its command; args: the options they share)."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``): every other one.
MAY_IMPORT: tuple[str, ...] = (
    "formats",
    "problem",
    "backends",
    "timing",
    "gate",
    "kernels",
    "cost",
    "results",
    "run",
    "report",
    "gpu_build",
    "cluster",
)
