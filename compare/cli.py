"""``python -m compare``: a thin command line over typed functions (list, run, report)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from compare import diff, harness, report, results, shapes, sweep
from compare.cases import DTYPES, MODELS, MODES, PRESETS, Case, InputError, check_name, preset, resolve_shape
from compare.golden import GoldenError
from compare.registry import BACKENDS, spec

DEFAULT_BACKENDS = tuple(BACKENDS)


def cmd_list(_: argparse.Namespace) -> int:
    print("presets:")
    for p in PRESETS.values():
        print(f"  {p.name:12s} {p.model:7s} {p.shape.label():22s} {p.dist:10s} {p.about}")
    print("backends:")
    for s in BACKENDS.values():
        a = s.availability()
        interp = "" if a.timed else " (interpreted: parity only, not timed)"
        state = ("available" + interp) if a.ok else "unavailable"
        reason = f": {a.reason}" if a.reason else ""
        print(f"  {s.name:20s} {state}{reason}  [{s.about}; models: {', '.join(s.models)}]")
    return 0


def cases_from_args(a: argparse.Namespace) -> list[Case]:
    base = preset(a.preset) if a.preset else None
    model = check_name("model", a.model, MODELS) if a.model else (base.model if base else None)
    if model is None:
        raise InputError(f"give --preset or --model; known models: {', '.join(MODELS)}")
    shape = resolve_shape(base.shape if base else None, a.batch, a.seq, a.dim, a.hidden)
    dist = base.dist if base else "normal"
    return [Case(model, shape, check_name("dtype", d, DTYPES), dist, a.seed) for d in a.dtype]


def cmd_run(a: argparse.Namespace) -> int:
    cases = cases_from_args(a)
    specs = [spec(b) for b in a.backend]
    modes = [check_name("mode", m, MODES) for m in a.mode]
    cfg = harness.TimingConfig(budget_s=a.budget)
    config = {"command": "python -m compare " + shlex.join(a.argv), "preset": a.preset, "backends": a.backend,
              "dtypes": a.dtype, "modes": modes}
    out = Path(a.out)
    doc = harness.run(cases, specs, modes, cfg, config, progress=lambda s: print(s, file=sys.stderr, flush=True),
                      profile=a.profile or a.trace, trace_dir=out / "traces" if a.trace else None,
                      ceilings=not a.no_ceilings)
    if a.shape_sweep:
        doc["shape_sweep"] = shapes.run_shape_sweep(cases, a.shape_sweep, a.budget,
                                         lambda s: print(s, file=sys.stderr, flush=True))
    if not a.no_plots:
        from compare.plots import render_plots

        doc["plots"] = [p.relative_to(out).as_posix() for p in render_plots(doc, out / "plots")]
    results.write_json(out / "results.json", doc)
    (out / "REPORT.md").write_text(report.render(doc))
    print(f"wrote {out / 'results.json'} and {out / 'REPORT.md'} ({report.summary(doc['results'])})")
    return 0 if all(r["status"] in ("ok", "skipped") for r in doc["results"]) else 1


def cmd_report(a: argparse.Namespace) -> int:
    path = Path(a.results)
    doc = sweep.load_sweep(path) if path.is_dir() or path.suffix == ".jsonl" else results.read_json(path)
    out = Path(a.out) if a.out else (path if path.is_dir() else path.parent) / "REPORT.md"
    out.write_text(report.render(doc))
    print(f"wrote {out}")
    return 0


def add_grid_args(p: argparse.ArgumentParser, budget_help: str) -> None:
    """Dtypes, backends, modes, seed and timing budget: the options shared by ``run``, ``profile`` and ``sweep``."""
    p.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    p.add_argument("--backend", nargs="+", default=list(DEFAULT_BACKENDS), help=f"any of: {', '.join(BACKENDS)}")
    p.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=1.0, help=budget_help)


def _add_run_args(r: argparse.ArgumentParser) -> None:
    """The options shared by ``run`` and ``profile``."""
    r.add_argument("--preset", help=f"one of: {', '.join(PRESETS)}")
    r.add_argument("--model", help=f"one of: {', '.join(MODELS)} (default: the preset's)")
    for dim in ("batch", "seq", "dim", "hidden"):
        r.add_argument(f"--{dim}", type=int, help=f"override the preset's {dim}")
    add_grid_args(r, budget_help="seconds of timed samples per backend and mode")
    r.add_argument("--out", default="out", help="output folder (default: out)")
    r.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring this machine's matmul FLOP/s and copy bandwidth (roofline columns)")
    r.add_argument("--shape-sweep", nargs="+", type=int, metavar="TOKENS",
                   help="also sweep these token counts through one compiled function per backend (compile cost)")
    r.add_argument("--no-plots", action="store_true", help="do not render PNG plots (matplotlib)")
    r.add_argument("--profile", action="store_true", help="count kernels and fusions per step (profiler / HLO)")
    r.add_argument("--trace", action="store_true",
                   help="also write a Chrome/Perfetto trace per backend (implies --profile)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compare", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="presets and backends, with whether each can run here").set_defaults(fn=cmd_list)
    r = sub.add_parser("run", help="run backends on a case; write results.json and REPORT.md")
    _add_run_args(r)
    r.set_defaults(fn=cmd_run)
    prof = sub.add_parser("profile", help="like run, plus kernel counts and a Chrome/Perfetto trace per backend")
    _add_run_args(prof)
    prof.set_defaults(fn=cmd_run, trace=True, profile=True)
    rep = sub.add_parser("report", help="rebuild REPORT.md from a results.json (measures nothing)")
    rep.add_argument("results")
    rep.add_argument("--out", help="where to write (default: REPORT.md beside the results)")
    rep.set_defaults(fn=cmd_report)
    sweep.add_parser(sub)
    diff.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    a.argv = argv
    try:
        return int(a.fn(a))
    except (InputError, GoldenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
