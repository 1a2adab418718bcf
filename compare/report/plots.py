"""PNG plots of a results document (a pure function of it, like the report), and the report section for them.

Results are grouped into *families* of one model, ``dim`` and ``hidden``; within a family the x axis is the token
count (``batch x seq``) and each panel is one (dtype, mode). Per family, with files named deterministically:

- ``time-<model>-d<dim>-h<hidden>.png``: median time per call against tokens, log-log, one line per backend,
  error bars from the first to the third quartile (of ``samples_s`` when present, else median -/+ IQR/2);
- ``speedup-<model>-d<dim>-h<hidden>.png``: the baseline's (``torch-eager``) median over each backend's;
- ``roofline-<model>-d<dim>-h<hidden>.png``: achieved FLOP/s against the cost model's arithmetic intensity, under
  the compute and bandwidth roofs measured in the same run (the document's ``ceilings``); one shape is enough;
- ``memory-<model>-d<dim>-h<hidden>.png``: the bytes each backend saved for its backward (measured points, the
  least-squares line dotted) and its peak above inputs and weights, against tokens (results with a memory record,
  ``compare.report.memory``; its fit and the largest token count within a device memory are in the report's table);
- ``ceiling-<model>-d<dim>-h<hidden>.png``: achieved fraction of the compute (solid) and bandwidth (dashed)
  ceilings, only if results carry the cost model's roofline numbers (``cost.achieved``: ``flops_fraction`` and
  ``bytes_fraction``, made by ``compare.cost.model.roofline`` when the run measured its ceilings);
- ``layers-<model>-d<dim>-h<hidden>.png`` (a ``--layers`` run of two layers or more, ``compare.report.layers``):
  each backend's worst gate statistic (its parity's ``worst_ratio``, a multiple of its pass line) against the layer
  index, log scale, the pass line dotted, a panel per dtype, mode (and token count); a statistic beyond the axis
  (an infinite one: a failure no number measures, or zero) is drawn at its edge as a triangle. Every judged result
  counts, timed or not.

A family with fewer than two token counts gets no plot (the ``sweep`` command's job; one point per line says
nothing), and a plot with nothing to draw is skipped. matplotlib is imported only inside :func:`render_plots`, with Agg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from compare.backends.registry import baseline_of
from compare.cost.records import Achieved
from compare.problem.cases import DTYPES, MODES
from compare.report.layers import PLOT_KIND, layer_of, layer_rows, worst_ratio
from compare.report.memory import family, linear_fit
from compare.results.document import Result, Results
from compare.timing import significance
from compare.timing.timer import Timing

Family = tuple[str, int, int]
#: The fields of a result's ``cost.achieved`` plotted against the ceilings, with their legend suffix and line style.
CEILINGS: tuple[tuple[Callable[[Achieved], float], str, str], ...] = (
    (lambda a: a.flops_fraction, "compute", "-"),
    (lambda a: a.bytes_fraction, "bandwidth", "--"),
)


def tokens(r: Result) -> int:
    return r.shape.tokens


def spread(t: Timing) -> tuple[float, float, float]:
    """(q1, median, q3) seconds of a timing record (:func:`compare.timing.significance.spread`, the diff's own)."""
    s = significance.spread(t)
    return s.q1, s.median, s.q3


def _median(r: Result) -> float:
    """The median of a timed result (:func:`_timed` keeps only those)."""
    assert r.timing is not None
    return r.timing.median_s


def _timed(results: Iterable[Result]) -> list[Result]:
    shown = ("ok", "deviates", "parity-fail", "implausible")
    return [r for r in results if r.timing is not None and r.status in shown and r.timing.median_s > 0]


def _ordered(xs: Iterable[str], order: Iterable[str]) -> list[str]:
    order = list(order)
    return sorted(set(xs), key=lambda x: (order.index(x) if x in order else len(order), x))


def _panels(rs: list[Result]) -> list[tuple[str, str]]:
    dtypes = _ordered((r.dtype for r in rs), DTYPES)
    modes = _ordered((r.mode for r in rs), MODES)
    return [(d, m) for d in dtypes for m in modes]


def _series(rs: list[Result]) -> dict[tuple[str, str, str], list[Result]]:
    """(dtype, mode, backend) -> results sorted by tokens (the first result per token count)."""
    out: dict[tuple[str, str, str], dict[int, Result]] = {}
    for r in rs:
        out.setdefault((r.dtype, r.mode, r.backend), {}).setdefault(tokens(r), r)
    return {k: [v[t] for t in sorted(v)] for k, v in out.items()}


def figure(n_panels: int, title: str) -> tuple[Any, list[Any]]:
    """A matplotlib ``Figure`` (no pyplot: no global state) of ``n_panels`` axes, up to 3 a row, titled; the axes in
    reading order (also ``compare.report.history``'s)."""
    from matplotlib.figure import Figure

    cols = min(3, n_panels)
    rows = -(-n_panels // cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n_panels]


def colors(backends: list[str]) -> dict[str, str]:
    """One color of matplotlib's default cycle per backend, in the order given."""
    return {b: f"C{i % 10}" for i, b in enumerate(backends)}


def _axes_style(ax: Any, xs: Iterable[int], title: str, ylabel: str) -> None:
    """Log-log axes with a tick at each token count present, a title, labels, a grid and a legend."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted(set(xs))
    if ticks:
        ax.set_xticks(ticks, labels=[str(t) for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_title(title)
    ax.set_xlabel("tokens (batch x seq)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    return path


def _time_plot(rs: list[Result], fam: Family, path: Path) -> Path | None:
    series = _series(rs)
    panels = _panels(rs)
    color = colors(sorted({b for (_, _, b) in series}))
    fig, axes = figure(len(panels), f"{fam[0]} dim={fam[1]} hidden={fam[2]}: median time per call")
    for ax, (dtype, mode) in zip(axes, panels, strict=True):
        for b, c in color.items():
            pts = series.get((dtype, mode, b))
            if not pts:
                continue
            xs = [tokens(r) for r in pts]
            q = [spread(r.timing) for r in pts if r.timing is not None]
            ys = [m for _, m, _ in q]
            err = [[max(m - lo, 0.0) for lo, m, _ in q], [max(hi - m, 0.0) for _, m, hi in q]]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, color=c, label=b)
        _axes_style(ax, (tokens(r) for r in rs), f"{dtype} {mode}", "seconds per call")
    return _save(fig, path)


def _speedup_plot(rs: list[Result], fam: Family, path: Path) -> Path | None:
    baseline = baseline_of(fam[0])
    base = {(r.case, r.mode): _median(r) for r in rs if r.backend == baseline}
    others = [r for r in rs if r.backend != baseline and (r.case, r.mode) in base]
    if not others:
        return None
    series = _series(others)
    panels = _panels(others)
    color = colors(sorted({b for (_, _, b) in series}))
    fig, axes = figure(len(panels), f"{fam[0]} dim={fam[1]} hidden={fam[2]}: speedup over {baseline}")
    for ax, (dtype, mode) in zip(axes, panels, strict=True):
        for b, c in color.items():
            pts = series.get((dtype, mode, b))
            if not pts:
                continue
            xs = [tokens(r) for r in pts]
            ys = [base[(r.case, r.mode)] / _median(r) for r in pts]
            ax.plot(xs, ys, marker="o", ms=3, color=c, label=b)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label=baseline)
        _axes_style(ax, (tokens(r) for r in others), f"{dtype} {mode}", f"{baseline} median / median")
    return _save(fig, path)


def _frac(r: Result, key: Callable[[Achieved], float]) -> float | None:
    a = r.cost.achieved if r.cost is not None else None
    v = key(a) if a is not None else None
    return float(v) if v is not None and v > 0 else None


def _ceiling_plot(rs: list[Result], fam: Family, path: Path) -> Path | None:
    rs = [r for r in rs if any(_frac(r, k) is not None for k, _, _ in CEILINGS)]
    if not rs:
        return None
    series = _series(rs)
    panels = _panels(rs)
    color = colors(sorted({b for (_, _, b) in series}))
    fig, axes = figure(len(panels), f"{fam[0]} dim={fam[1]} hidden={fam[2]}: achieved fraction of ceilings")
    for ax, (dtype, mode) in zip(axes, panels, strict=True):
        for b, c in color.items():
            for key, what, style in CEILINGS:
                pts = [(tokens(r), _frac(r, key)) for r in series.get((dtype, mode, b), [])]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    ax.plot(
                        [x for x, _ in pts],
                        [y for _, y in pts],
                        linestyle=style,
                        marker="o",
                        ms=3,
                        color=c,
                        label=f"{b} {what}",
                    )
        _axes_style(ax, (tokens(r) for r in rs), f"{dtype} {mode}", "fraction of ceiling")
    return _save(fig, path)


def _roofline_plot(doc: Results, rs: list[Result], fam: Family, path: Path) -> Path | None:
    """Achieved FLOP/s against arithmetic intensity (FLOP per byte, from the cost model) for every timed result of
    the family, under the roofs measured in the same run: ``min(peak FLOP/s, intensity x peak bandwidth)``. One
    panel per dtype; renders for a single shape too."""
    ceilings = doc.ceilings
    if ceilings is None:
        return None
    pts = [
        (r, r.cost, r.cost.achieved)
        for r in rs
        if r.cost is not None
        and r.cost.achieved is not None
        and r.cost.achieved.flops_per_s
        and ceilings.get(r.dtype) is not None
    ]
    if not pts:
        return None
    dtypes = _ordered((r.dtype for r, _, _ in pts), DTYPES)
    backends = sorted({r.backend for r, _, _ in pts})
    color = colors(backends)
    fig, axes = figure(len(dtypes), f"{fam[0]} dim={fam[1]} hidden={fam[2]}: roofline (ceilings of this run)")
    for ax, dtype in zip(axes, dtypes, strict=True):
        ceil = ceilings.by_dtype[dtype]
        peak_f, peak_b = float(ceil.flops_per_s), float(ceil.bytes_per_s)
        mine = [(r, c, a) for r, c, a in pts if r.dtype == dtype]
        xs = [float(c.arithmetic_intensity) for _, c, _ in mine]
        lo, hi = min([*xs, peak_f / peak_b]) / 4, max([*xs, peak_f / peak_b]) * 4
        grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
        ax.plot(grid, [min(peak_f, x * peak_b) for x in grid], color="grey", linewidth=1.5, label="roof")
        for (r, _, a), x in zip(mine, xs, strict=True):
            ax.plot(
                [x],
                [a.flops_per_s],
                marker="o",
                linestyle="",
                color=color[r.backend],
                label=f"{r.backend} {r.mode} ({tokens(r)} tokens)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte, cost model)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(dtype)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _compile_plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """From the document's ``shape_sweep`` rows: first call (compile + run, dashed) and steady median (solid)
    against tokens, one line pair per (backend, dynamic), a panel per dtype."""
    timed = [r for r in rows if r.get("timed") and r.get("median_s") and r.get("first_call_s") and not r.get("error")]
    dtypes = sorted({r["dtype"] for r in timed})
    if not dtypes or len({r["tokens"] for r in timed}) < 2:
        return None
    r0 = timed[0]
    fig, axes = figure(len(dtypes), f"{r0['model']} dim={r0['dim']} hidden={r0['hidden']}: compile cost by shape")
    keys = sorted({(r["backend"], str(r.get("dynamic"))) for r in timed})
    color = colors([f"{b} dynamic={d}" for b, d in keys])
    for ax, dtype in zip(axes, dtypes, strict=True):
        for b, d in keys:
            pts = sorted(
                (r for r in timed if (r["backend"], str(r.get("dynamic"))) == (b, d) and r["dtype"] == dtype),
                key=lambda r: r["tokens"],
            )
            if not pts:
                continue
            label = f"{b} dynamic={d}"
            xs = [r["tokens"] for r in pts]
            ax.plot(xs, [r["median_s"] for r in pts], marker="o", ms=3, color=color[label], label=f"{label} median")
            ax.plot(
                xs,
                [r["first_call_s"] for r in pts],
                marker="^",
                ms=3,
                ls="--",
                color=color[label],
                label=f"{label} first call",
            )
        _axes_style(ax, (r["tokens"] for r in timed), dtype, "seconds")
    return _save(fig, path)


def _memory_plot(rs: list[Result], fam: Family, path: Path) -> Path | None:
    """Saved-for-backward bytes (solid, measured points, with the fitted line dotted) and the peak above inputs and
    weights (dashed) against tokens, one line per backend, a panel per dtype and mode."""
    series = _series(rs)
    panels = _panels(rs)
    color = colors(sorted({b for (_, _, b) in series}))
    fig, axes = figure(len(panels), f"{fam[0]} dim={fam[1]} hidden={fam[2]}: memory per step")
    drawn = False
    for ax, (dtype, mode) in zip(axes, panels, strict=True):
        for b, c in color.items():
            pts = [r for r in series.get((dtype, mode, b), []) if r.memory is not None]
            saved = [(tokens(r), r.memory.saved.bytes) for r in pts if r.memory and r.memory.saved]
            peak = [(tokens(r), r.memory.peak.bytes) for r in pts if r.memory and r.memory.peak]
            if len(saved) >= 2 and any(y > 0 for _, y in saved):
                ax.plot(*zip(*saved, strict=True), marker="o", ms=3, color=c, label=f"{b} saved")
                f = linear_fit("saved", saved)
                xs = [x for x, _ in saved]
                ax.plot(xs, [f.intercept + f.slope * x for x in xs], ":", color=c, linewidth=1)
                drawn = True
            if len(peak) >= 2 and any(y > 0 for _, y in peak):
                ax.plot(*zip(*peak, strict=True), "--", marker="x", ms=3, color=c, label=f"{b} peak")
                drawn = True
        _axes_style(ax, (tokens(r) for r in rs), f"{dtype} {mode}", "bytes")
    return _save(fig, path) if drawn else None


#: The layer plot's y range (multiples of the pass line): a statistic beyond it is drawn at its edge.
LAYER_RANGE = (1e-4, 1e4)


def _layers_plot(rs: list[Result], fam: Family, path: Path) -> Path | None:
    """Each backend's worst gate statistic against the layer index, a panel per dtype, mode and (where several)
    token count; the pass line (1) dotted."""
    pts = [r for r in rs if worst_ratio(r) is not None]
    if len({layer_of(r) for r in pts}) < 2:
        return None
    several = len({tokens(r) for r in pts}) > 1
    keys = sorted(
        {(r.dtype, r.mode, tokens(r)) for r in pts},
        key=lambda k: (DTYPES.index(k[0]) if k[0] in DTYPES else 9, MODES.index(k[1]) if k[1] in MODES else 9, k[2]),
    )
    color = colors(list(dict.fromkeys(r.label for r in pts)))
    lo, hi = LAYER_RANGE
    fig, axes = figure(len(keys), f"{fam[0]} d={fam[1]} h={fam[2]}: worst statistic by layer")
    for ax, (dtype, mode, t) in zip(axes, keys, strict=True):
        for b, c in color.items():
            mine = sorted(
                (r for r in pts if (r.label, r.dtype, r.mode, tokens(r)) == (b, dtype, mode, t)),
                key=lambda r: layer_of(r) or 0,
            )
            if not mine:
                continue
            xs = [layer_of(r) or 0 for r in mine]
            ys = [min(max(worst_ratio(r) or 0.0, lo), hi) for r in mine]
            ax.plot(xs, ys, marker="o", ms=3, color=c, label=b)
            out = [(x, y) for x, y in zip(xs, ys, strict=True) if y in (lo, hi)]
            if out:
                ax.plot(*zip(*out, strict=True), linestyle="", marker="^", ms=7, color=c)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="pass line")
        ax.set_yscale("log")
        layers = sorted({layer_of(r) or 0 for r in pts})
        ax.set_xticks(layers if len(layers) <= 32 else layers[:: -(-len(layers) // 32)])
        ax.set_title(f"{dtype} {mode}" + (f" ({t} tokens)" if several else ""))
        ax.set_xlabel("layer")
        ax.set_ylabel("worst statistic / pass line")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path)


def render_plots(doc: Results, out_dir: Path) -> list[Path]:
    """Write the PNG plots of ``doc`` into ``out_dir``; return their paths (sorted by family, then kind)."""
    import matplotlib

    matplotlib.use("Agg")
    rs = _timed(doc.results)
    fams: dict[Family, list[Result]] = {}
    for r in rs:
        fams.setdefault(family(r), []).append(r)
    written: list[Path | None] = []
    for fam in sorted(fams):
        group = fams[fam]
        stem = f"{fam[0]}-d{fam[1]}-h{fam[2]}"
        written.append(_roofline_plot(doc, group, fam, out_dir / f"roofline-{stem}.png"))
        if len({tokens(r) for r in group}) >= 2:
            for kind, fn in (("time", _time_plot), ("speedup", _speedup_plot), ("ceiling", _ceiling_plot)):
                written.append(fn(group, fam, out_dir / f"{kind}-{stem}.png"))
    mems: dict[Family, list[Result]] = {}
    for r in doc.results:
        if r.memory is not None and r.world_size == 1:
            mems.setdefault(family(r), []).append(r)
    for fam in sorted(mems):
        if len({tokens(r) for r in mems[fam]}) >= 2:
            written.append(_memory_plot(mems[fam], fam, out_dir / f"memory-{fam[0]}-d{fam[1]}-h{fam[2]}.png"))
    layered: dict[Family, list[Result]] = {}
    for r in layer_rows(doc.results):
        layered.setdefault(family(r), []).append(r)
    for fam in sorted(layered):
        path = out_dir / f"{PLOT_KIND}-{fam[0]}-d{fam[1]}-h{fam[2]}.png"
        written.append(_layers_plot(layered[fam], fam, path))
    shape_rows = list(doc.shape_sweep)
    if shape_rows:
        r0 = shape_rows[0]
        written.append(_compile_plot(shape_rows, out_dir / f"compile-{r0['model']}-d{r0['dim']}-h{r0['hidden']}.png"))
    return [p for p in written if p is not None]


_CAPTIONS = {
    "time": "median time per call against tokens",
    "speedup": "speedup over the case's baseline (its eager torch step: the built-in module's, or your own MLP file's)",
    "ceiling": "achieved fraction of the compute and bandwidth ceilings",
    "roofline": "achieved FLOP/s against arithmetic intensity, under this run's measured roofs",
    "compile": "first call (compile + run, dashed) and steady-state median (solid) against tokens",
    "memory": "saved for backward (solid, fit dotted) and peak above inputs and weights (dashed) against tokens",
    PLOT_KIND: "each backend's worst gate statistic (x its pass line) against the layer index",
}


def plots_section(doc: Results, plot_paths: list[str] | None = None) -> str:
    """Markdown embedding the plots (``plot_paths``, else the document's ``plots``, relative to the report); "" if
    none."""
    paths = list(doc.plots if plot_paths is None else plot_paths)
    if not paths:
        return ""
    lines = [
        "## Plots",
        "",
        "Token count on x (batch x seq); one line per backend, one panel per dtype and mode. Error bars span "
        "the first to the third quartile of the samples."
        + (
            " The layer plot has the layer index on x, the pass line dotted."
            if any(Path(p).stem.startswith(PLOT_KIND + "-") for p in paths)
            else ""
        ),
    ]
    for p in paths:
        stem = Path(p).stem
        kind, _, fam = stem.partition("-")
        caption = f"{fam}: {_CAPTIONS[kind]}" if kind in _CAPTIONS else stem
        lines += ["", f"![{caption}]({p})"]
    return "\n".join(lines)
