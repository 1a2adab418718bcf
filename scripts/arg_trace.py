"""Which files of ``compare/`` a run's arguments visit, from the command line to the written report.

Usage: ``python scripts/arg_trace.py run --preset tiny --dtype float32 --backend torch-eager --out DIR [...]``.

A call into a ``compare/`` function counts when one of its parameters carries the preset's name, the dtype or the
output folder: the value itself, the argparse namespace, or a dataclass, dict, list or tuple holding one of them (up
to three levels down, 50 items a level). Prints the files in the order first visited, then their count. This
measures the code's shape, not its speed: the profile hook makes the run several times slower.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from compare.cli import main as cli

    ns = cli.parser().parse_args(argv)
    marks = {str(getattr(ns, k)) for k in ("preset", "out") if getattr(ns, k, None)} | set(getattr(ns, "dtype", []))

    def carries(v: Any, depth: int = 0) -> bool:
        if isinstance(v, (str, Path)):
            return str(v) in marks
        if isinstance(v, argparse.Namespace):
            return True
        if depth >= 3:
            return False
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return any(carries(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v))
        if isinstance(v, dict):
            return any(carries(x, depth + 1) for x in list(v.values())[:50])
        if isinstance(v, (list, tuple)):
            return any(carries(x, depth + 1) for x in list(v)[:50])
        return False

    visits: list[str] = []

    def hook(frame: Any, event: str, _: Any) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(ROOT / "compare")):
            return
        params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(carries(frame.f_locals.get(n)) for n in params):
            rel = str(Path(code.co_filename).relative_to(ROOT))
            visits.append(rel)

    sys.setprofile(hook)
    try:
        status = cli.main(argv)
    finally:
        sys.setprofile(None)
    files = list(dict.fromkeys(visits))
    print("\n".join(files))
    print(f"exit {status}: {len(files)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
