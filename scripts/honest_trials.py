"""Repeated trials of the two claims that no difference and no finding is called where there is none, quiet or with
one core kept busy by another process (a spinning ``python -c`` loop, stopped at the end):

- ``aa``: ``python -m compare ab`` with the same interpreter, environment and checkout on both sides (A/A), counting
  the trials in which any pair's verdict is ``slower`` or ``faster`` (``compare.report.ab.paired_verdicts``);
- ``report``: ``python -m compare run`` of the default report's cases (geglu ``cpu-mlp``, float32 and bfloat16, every
  backend, the ceilings measured) counting the trials in which an honest real backend fails or is flagged
  implausible.

    python scripts/honest_trials.py aa --trials 20 [--busy] -- --preset cpu-mlp --backend torch-eager jax-xla
    python scripts/honest_trials.py report --trials 20 --busy

Prints one line per trial and a closing count; exits 1 when a trial called a difference or a finding. It measures
this machine at this moment: the counts say nothing of another CPU or another load.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compare.report.ab import paired_verdicts  # noqa: E402
from compare.results import ab as ab_doc  # noqa: E402
from compare.results import document  # noqa: E402

REPORT_ARGS = ["--preset", "cpu-mlp", "--dtype", "float32", "bfloat16", "--time-budget", "45", "--no-plots", "--quiet"]


def trial(kind: str, extra: list[str], out: Path) -> tuple[bool, str]:
    """One trial into ``out``: (whether it called something, what it called)."""
    if kind == "aa":
        cmd = [sys.executable, "-m", "compare", "ab", "--no-profile", "--out", str(out), *extra]
    else:
        cmd = [sys.executable, "-m", "compare", "run", "--out", str(out), *REPORT_ARGS, *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1):
        return True, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    if kind == "aa":
        called = [
            f"{v.backend} {v.verdict} x{v.ratio:.2f}"
            for v in paired_verdicts(ab_doc.read_json(out / "ab.json"))
            if v.verdict in ("slower", "faster")
        ]
        seen = [f"{v.backend} {v.verdict} x{v.ratio:.2f}" for v in paired_verdicts(ab_doc.read_json(out / "ab.json"))]
        return bool(called), "; ".join(called or seen)
    doc = document.read_json(out / "results.json")
    bad = [
        f"{r.backend} {r.dtype} {r.mode} {r.status}: {r.reason[:120]}"
        for r in doc.results
        if r.status in ("parity-fail", "error", "implausible") or r.implausible
    ]
    return bool(bad), "; ".join(bad) or f"{sum(r.status == 'ok' for r in doc.results)} ok, none failed or implausible"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("aa", "report"))
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--busy", action="store_true", help="keep one core busy with another process")
    cut = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    args = ap.parse_args(sys.argv[1:cut])
    args.extra = sys.argv[cut + 1 :]  # after --: more arguments for the command
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    called = 0
    try:
        for i in range(args.trials):
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                hit, what = trial(args.kind, args.extra, Path(d) / "out")
            called += hit
            print(
                f"trial {i + 1}/{args.trials} ({time.perf_counter() - t0:.0f} s): {'CALLED ' if hit else ''}{what}",
                flush=True,
            )
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    load = "one core busy" if args.busy else "no load added"
    print(f"{args.kind}: {called} of {args.trials} trials called a difference or a finding ({load})")
    return 1 if called else 0


if __name__ == "__main__":
    raise SystemExit(main())
