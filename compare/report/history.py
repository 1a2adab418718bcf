"""A machine's history (``python -m compare history DIR``): each cell's warm median over the entries of
``compare.results.history``, in time order, with the commit and the package versions that changed, and a flag where
the time changed beyond noise; as markdown (``HISTORY.md``) and a plot (``history.png``). A pure function of the
entries, like the report.

**The rule.** A cell (backend, case, dtype, mode, world size) has one point per entry that timed it, in the order the
entries were recorded. Two points are compared by the project's one rule for timings from separate windows,
:func:`compare.timing.significance.compare_timing`, unpaired (different runs are never paired by round, even where an
entry's timing is interleaved): slower only beyond the threshold (5%) and the two runs' IQR noise band, with the
middle halves apart and the Mann-Whitney test at p < 0.01. With ``W(i)`` the up to :data:`WINDOW` (3) points before
point ``i``, point ``i`` is *above its level* when it is slower than a strict majority of ``W(i)`` (1 of 1, 2 of 2,
2 of 3). Point ``i`` is flagged **slower** when

1. it is above its level, and
2. it is slower than point ``i-1`` too, or point ``i-1`` was not itself above its own level.

**Between runs.** Each entry is one process, and two processes of one build differ by more than their samples do
(two identical ``run --history`` runs 18 s apart: the XLA backend 34.2 -> 39.4 ms, flagged slower by the rule above
alone). So every comparison ``j`` -> ``i`` also has to be beyond the between-run spread
(``compare.timing.significance.beyond_processes``): where the points before ``i`` hold :data:`~compare.timing.
significance.MIN_RUNS` (3) or more of the build of point ``i-1`` (the same commit, dirty flag and package versions:
:func:`build_of`), the relative range ``max / min - 1`` of the medians of the last :data:`SPREAD_RUNS` of them is the
spread; else it is not measured and nothing at or below ``BETWEEN_FLOOR`` (the A/A between-process spread measured
on the project's 2-core development VM) is flagged, and the table says so.

**Faster** is the mirror image. So a single noisy earlier point neither raises a flag (a fast outlier is one vote of
the window, outvoted) nor hides one (a slow outlier or a wide spread at ``i-1`` is outvoted by the points before it,
and the second clause lets the flag through when ``i-1`` was still at the old level); a step is flagged once, where
it happens (the point after it is at the level of the step, not slower than it), and a step back to the earlier level
after a one-entry excursion is not flagged at all (it is not faster than most of the points before it). The point
after one entry is compared with it alone (as ``diff`` compares two runs); a step whose first point is flagged is
only known to be a step, not an outlier, when the next point stays there. A creep below the threshold from one entry
to the next is flagged when it passes the threshold against most of the window while the point before it did not.

An entry with an A/B verdict on the cell (``paired``: the ``ab`` command's, both builds timed in one window) is
flagged by that verdict instead; the change-point rule still counts its point in the later windows. A result a
resumed sweep carried over from an earlier session (the same samples as the cell's previous point) is shown once, at
the entry that measured it; a sweep row measured on another machine (a Ray node of other hardware) is left out.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compare.backends.registry import BACKENDS
from compare.formats.markdown import case_label, fmt_s, table
from compare.problem.cases import DTYPES, MODES, InputError
from compare.report.cells import changes
from compare.report.plots import colors, figure, spread
from compare.results.document import Result
from compare.results.history import Entry, Machine
from compare.timing.significance import (
    BETWEEN_FLOOR,
    FASTER,
    MIN_RUNS,
    SLOWER,
    TimingVerdict,
    beyond_processes,
    compare_timing,
)
from compare.timing.timer import CONTIGUOUS, Timing

#: Points before a point that make its level (the window of the rule).
WINDOW = 3
#: The most recent runs of one build whose medians' range is the between-run spread (module docstring).
SPREAD_RUNS = 5
#: At most this many commits are named on the plot's x axis (every k-th beyond it).
MAX_TICKS = 16
#: A cell: backend, case, dtype, mode, world size.
CellKey = tuple[str, str, str, str, int]
#: Statuses whose timing is shown (an error's or a skip's has none).
SHOWN: tuple[str, ...] = ("ok", "deviates", "parity-fail", "implausible")


def cell_key(r: Result) -> CellKey:
    return (r.backend, r.case, r.dtype, r.mode, r.world_size)


def unpaired(t: Timing) -> Timing:
    """``t`` as a timing of its own window: two runs' timings are never paired by round (their groups differ in a
    real history; in one built from a single document they would not)."""
    return dataclasses.replace(t, design=CONTIGUOUS, group="", rounds=())


@dataclass(frozen=True)
class Step:
    """What the rule says of one point: its flag (:data:`SLOWER`, :data:`FASTER`, ``""``) and its comparison with
    the point before it (None for the first)."""

    flag: str
    vs_previous: TimingVerdict | None


def build_of(e: Entry) -> tuple[Any, ...]:
    """What makes two entries one build for the between-run spread: the commit, the dirty flag and the package
    versions."""
    return (e.source.commit, e.source.dirty, tuple(sorted(e.versions.items(), key=lambda kv: kv[0])))


def run_spread(timings: Sequence[Timing], builds: Sequence[Any], i: int) -> float | None:
    """The between-run spread that bounds a comparison with point ``i``: the relative range of the medians of the
    last :data:`SPREAD_RUNS` points before ``i`` of point ``i-1``'s build, when there are :data:`MIN_RUNS` or more;
    None (not measured) else."""
    if i < 1:
        return None
    same = [t.median_s for t, b in zip(timings[:i], builds[:i], strict=True) if b == builds[i - 1]][-SPREAD_RUNS:]
    return max(same) / min(same) - 1 if len(same) >= MIN_RUNS and min(same) > 0 else None


def change_points(timings: Sequence[Timing], builds: Sequence[Any] | None = None) -> list[Step]:
    """The rule of the module docstring on one cell's timings, oldest first: one :class:`Step` per timing.
    ``builds``: each point's build (:func:`build_of`; None: every point another's, no spread measured)."""
    ts = [unpaired(t) for t in timings]
    kinds = list(builds) if builds is not None else [object() for _ in ts]
    memo: dict[tuple[int, int], TimingVerdict] = {}

    def vs(j: int, i: int) -> TimingVerdict:
        if (j, i) not in memo:
            memo[(j, i)] = beyond_processes(compare_timing(ts[j], ts[i]), run_spread(timings, kinds, i))
        return memo[(j, i)]

    def above(i: int, way: str) -> bool:  # beyond a strict majority of the window before i
        window = range(max(0, i - WINDOW), i)
        return 2 * sum(vs(j, i).verdict == way for j in window) > len(window) > 0

    steps = [Step("", None)] if ts else []
    for i in range(1, len(ts)):
        flag = next(
            (w for w in (SLOWER, FASTER) if above(i, w) and (vs(i - 1, i).verdict == w or not above(i - 1, w))), ""
        )
        steps.append(Step(flag, vs(i - 1, i)))
    return steps


@dataclass(frozen=True)
class Point:
    """One entry's result of a cell: the entry's index in the machine's time order, the result, the package
    versions and settings changed since the cell's previous point (``torch 2.12.0 -> 2.13.0``, :func:`settings`), its
    comparison with that point,
    its flag and what decided it (``change point`` or ``A/B vs <baseline>``; ``""`` without a flag)."""

    entry: int
    result: Result
    changed: tuple[str, ...]
    vs_previous: TimingVerdict | None
    flag: str
    by: str

    @property
    def timing(self) -> Timing:
        assert self.result.timing is not None  # only timed results become points
        return self.result.timing


@dataclass(frozen=True)
class CellHistory:
    """One cell's points, oldest first."""

    key: CellKey
    points: tuple[Point, ...]

    @property
    def newest(self) -> Point:
        return self.points[-1]

    def title(self) -> str:
        """``torch-eager · geglu 3x37x96->328 · float32 · fwd`` (`` · x2`` for a tensor-parallel world size)."""
        r = self.points[0].result
        ws = f" · x{r.world_size}" if r.world_size > 1 else ""
        return f"{r.backend} · {case_label(r)} · {r.dtype} · {r.mode}{ws}"


@dataclass(frozen=True)
class History:
    """A machine's history: the machine, its entries in time order, every cell's points (in the order of the
    problem: case, dtype, mode, then backend), and the results left out: ``carried`` over from an earlier entry (a
    resumed sweep's), measured ``elsewhere`` (a sweep row of another machine)."""

    machine: Machine
    entries: tuple[Entry, ...]
    cells: tuple[CellHistory, ...]
    carried: int = 0
    elsewhere: int = 0

    @property
    def regressions(self) -> tuple[CellHistory, ...]:
        """The cells whose newest point is flagged slower: what makes ``history`` exit 1."""
        return tuple(c for c in self.cells if c.newest.flag == SLOWER)


def machines(entries: Sequence[Entry]) -> list[tuple[Machine, int]]:
    """Each machine of ``entries`` with its entry count, most entries first (then by key)."""
    counts: dict[str, tuple[Machine, int]] = {}
    for e in entries:
        m, n = counts.get(e.machine.key, (e.machine, 0))
        counts[e.machine.key] = (m, n + 1)
    return sorted(counts.values(), key=lambda mn: (-mn[1], mn[0].key))


def count(n: int, one: str, many: str) -> str:
    """``1 entry``, ``2 entries``."""
    return f"{n} {one if n == 1 else many}"


def listing(found: Sequence[tuple[Machine, int]]) -> str:
    """``1a2b3c4d5e6f (5 entries: Intel ... ; no GPU), ...``."""
    return ", ".join(f"{m.key} ({count(n, 'entry', 'entries')}: {m.label()})" for m, n in found)


def pick(found: Sequence[tuple[Machine, int]], wanted: str | None) -> Machine:
    """The machine ``wanted`` names (its key, or a prefix of one key only), or the one with most entries; an
    unknown or ambiguous one is an :class:`InputError` listing the known ones."""
    if not found:
        raise InputError("no history entries: `python -m compare run --history DIR` appends one per run")
    if wanted is None:
        return found[0][0]
    hits = [m for m, _ in found if m.key.startswith(wanted.lower())] if wanted else []
    if len(hits) != 1:
        what = "matches several machines" if hits else "is not a machine of this history"
        raise InputError(f"--machine {wanted!r} {what}; known machines: {listing(found)}")
    return hits[0]


def settings(e: Entry) -> dict[str, str | None]:
    """What an entry's timings may depend on besides the code: the package versions, the instruction-set caps set
    (``$ATEN_CPU_CAPABILITY``) and the variables its build ran with (an A/B entry's side B: ``--b-env``). Only an
    environment variable told two entries of one commit apart, and the row said "-"."""
    caps = {f"${k}": v for k, v in e.results.environment.isa_caps.items() if v}
    return {**e.versions, **caps, **{f"${k}": v for k, v in e.variables.items()}}


def _index(x: str, known: Sequence[str]) -> int:
    return known.index(x) if x in known else len(known)


def _order(key: CellKey, first: Result) -> tuple[Any, ...]:
    """The problem's order: model, shape, dtype, mode, case, then the backends as registered, then world size."""
    s = first.shape
    dtype, mode = _index(key[2], DTYPES), _index(key[3], MODES)
    return (first.model, s.tokens, s.dim, s.hidden, dtype, mode, key[1], _index(key[0], list(BACKENDS)), key[0], key[4])


def build(entries: Sequence[Entry], machine: Machine) -> History:
    """The :class:`History` of ``machine`` from ``entries`` (any machines', in time order: :func:`compare.results.
    history.read`), judged by the module's rule."""
    mine = tuple(e for e in entries if e.machine.key == machine.key)
    series: dict[CellKey, list[tuple[int, Result]]] = {}
    carried = elsewhere = 0
    for i, e in enumerate(mine):
        for r in e.results.results:
            if r.timing is None or r.status not in SHOWN:
                continue
            if not machine.measured(r.node):
                elsewhere += 1
                continue
            pts = series.setdefault(cell_key(r), [])
            if pts and pts[-1][1].timing == r.timing:  # a resumed sweep's cell of an earlier session
                carried += 1
                continue
            pts.append((i, r))
    cells = []
    for key, pts in series.items():
        steps = change_points([r.timing for _, r in pts if r.timing is not None], [build_of(mine[i]) for i, _ in pts])
        points = []
        for n, ((i, r), step) in enumerate(zip(pts, steps, strict=True)):
            flag, by = step.flag, "change point" if step.flag else ""
            ab = next((v for v in mine[i].paired if (v.backend, v.case, v.mode, v.world_size) == _ab_key(key)), None)
            if ab is not None:
                flag = ab.verdict if ab.verdict in (SLOWER, FASTER) else ""
                by = f"A/B vs {ab.baseline}" if flag else ""
            before = settings(mine[pts[n - 1][0]] if n else mine[i])
            points.append(Point(i, r, changes(before, settings(mine[i])), step.vs_previous, flag, by))
        cells.append(CellHistory(key, tuple(points)))
    cells.sort(key=lambda c: _order(c.key, c.points[0].result))
    return History(machine, mine, tuple(cells), carried, elsewhere)


def _ab_key(key: CellKey) -> tuple[str, str, str, int]:
    return (key[0], key[1], key[3], key[4])


def commit_label(e: Entry) -> str:
    return e.source.short()


def _flag_cell(p: Point) -> str:
    if not p.flag:
        return ""
    return f"**{p.flag}**" + (f" ({p.by})" if p.by and p.by != "change point" else "")


def _vs_cell(p: Point) -> str:
    v = p.vs_previous
    return "-" if v is None else v.said(f"{v.ratio:.2f}x")


def rows(cell: CellHistory, entries: Sequence[Entry]) -> list[list[str]]:
    """The table rows of one cell: one per point (entry), oldest first."""
    out = []
    for p in cell.points:
        e, t = entries[p.entry], p.timing
        out.append(
            [
                f"#{p.entry + 1}",
                e.when().strftime("%Y-%m-%d %H:%M"),
                f"`{commit_label(e)}`",
                ", ".join(p.changed) or "-",
                fmt_s(t.median_s),
                fmt_s(t.iqr_s),
                str(t.n),
                p.result.status,
                _vs_cell(p),
                _flag_cell(p),
            ]
        )
    return out


HEADER = [
    "entry",
    "recorded (UTC)",
    "commit",
    "versions or settings changed",
    "median",
    "IQR",
    "n",
    "status",
    "time vs previous",
    "flag",
]
RULE = (
    "A point is flagged **slower** when it is slower (`compare_timing`, unpaired: beyond 5% and the IQR noise band, "
    "quartiles apart, Mann-Whitney p < 0.01; and beyond the between-run spread: the range of the medians of the last "
    "up to 5 earlier runs of one build where there are 3 or more, else, not measured, beyond "
    f"{BETWEEN_FLOOR:.0%}, the A/A spread between processes measured on a 2-core development VM) than a strict "
    "majority of the up to 3 points before it, and either "
    "slower than the point just before it or that point was not itself above its level; **faster** the same way "
    "down. One noisy point neither raises nor hides a flag; a step is flagged once; a one-entry excursion and the step "
    "back are not a new change."
)


def markdown(
    h: History,
    found: Sequence[tuple[Machine, int]],
    plot: str | None = "history.png",
    skipped: Sequence[str] = (),
) -> str:
    """``HISTORY.md``: the machine, the other machines of the folder, the rule, the cells whose newest point is
    flagged slower, the plot (``plot``, relative to the file; None: none), one table per cell, and the files that
    were skipped (``skipped``: one line each)."""
    es = h.entries
    lines = [f"# History of machine `{h.machine.key}`", "", f"{h.machine.label()}."]
    if es:
        span = f"{es[0].when():%Y-%m-%d %H:%M} to {es[-1].when():%Y-%m-%d %H:%M} UTC"
        lines += ["", f"{count(len(es), 'entry', 'entries')} ({span}), {count(len(h.cells), 'cell', 'cells')}."]
    others = [(m, n) for m, n in found if m.key != h.machine.key]
    if others:
        lines += ["", f"Other machines in this history (`--machine KEY`): {listing(others)}."]
    left = [
        f"{h.carried} results carried over from an earlier entry (a resumed sweep's) shown once" if h.carried else "",
        f"{h.elsewhere} sweep rows measured on other hardware left out" if h.elsewhere else "",
    ]
    if any(left):
        lines += ["", "; ".join(x for x in left if x) + "."]
    lines += ["", f"**The rule.** {RULE}", ""]
    bad = h.regressions
    if bad:
        lines.append("**Newest point flagged slower** (exit status 1):")
        lines += [f"- {c.title()}: {_vs_cell(c.newest)} ({commit_label(es[c.newest.entry])})" for c in bad]
    else:
        lines.append("No cell's newest point is flagged slower.")
    if plot:
        lines += ["", f"![median per call over the entries, IQR bars]({plot})"]
    for c in h.cells:
        lines += ["", f"## {c.title()}", "", table(HEADER, rows(c, es))]
    if skipped:
        lines += ["", "## Skipped files", ""] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def _panels(h: History) -> dict[tuple[str, str], list[CellHistory]]:
    """(case, mode) -> its cells (one per backend and world size), in the history's cell order."""
    out: dict[tuple[str, str], list[CellHistory]] = {}
    for c in h.cells:
        out.setdefault((c.key[1], c.key[3]), []).append(c)
    return out


def plot_png(h: History) -> bytes | None:
    """The PNG of the history: one panel per case, dtype and mode; one line per backend (and world size), its median
    per call at each entry with bars from the first to the third quartile; flagged points marked (slower: a red
    triangle up, faster: a green one down, black-edged over the lines); the entries' commits on the x axis. None
    without a cell."""
    if not h.cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    panels = _panels(h)
    labels = list(dict.fromkeys(c.points[0].result.label for c in h.cells))  # the cells' order: as registered
    color = colors(labels)
    fig, axes = figure(len(panels), f"history of {h.machine.key}: median per call (IQR bars)")
    n = len(h.entries)
    every = max(1, -(-n // MAX_TICKS))
    ticks = list(range(0, n, every))
    marks: dict[str, tuple[str, str]] = {SLOWER: ("^", "red"), FASTER: ("v", "green")}
    for ax, cells in zip(axes, panels.values(), strict=True):
        r0 = cells[0].points[0].result
        for c in cells:
            label = c.points[0].result.label
            q = [spread(p.timing) for p in c.points]
            xs = [p.entry for p in c.points]
            ys = [m for _, m, _ in q]
            err = [[max(m - lo, 0.0) for lo, m, _ in q], [max(hi - m, 0.0) for _, m, hi in q]]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, color=color[label], label=label)
            for way, (marker, col) in marks.items():
                flagged = [(p.entry, y) for p, y in zip(c.points, ys, strict=True) if p.flag == way]
                if flagged:
                    shown = way in ax.get_legend_handles_labels()[1]
                    ax.plot(*zip(*flagged, strict=True), marker, ms=9, mfc=col, mec="black", ls="", zorder=3,
                            label="_" if shown else way)  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(ticks, labels=[f"#{i + 1} {commit_label(h.entries[i])}" for i in ticks], rotation=45, ha="right")
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_title(f"{case_label(r0)} {r0.dtype} {r0.mode}", fontsize="medium")
        ax.set_xlabel("entry (commit)")
        ax.set_ylabel("seconds per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()
