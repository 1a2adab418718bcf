"""The terminal display: counts, elapsed and time left per cell; quiet shows only problems; a live bar on a tty; the
stages of a run as they begin, and the time left from the work still to do (a fake clock)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compare.problem.cases import PRESETS, Case, Shape, Weights
from compare.run.progress import STAGE_LINE_S, Display, Stage, eta, fmt_duration, run_stages, short

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent


def test_plain_lines_count_cells_and_estimate_the_time_left() -> None:
    out = io.StringIO()
    with Display(4, "normal", stream=out, live=False) as d:
        d.starting("torch-eager tiny fwd")
        d.cell("torch-eager tiny fwd", "ok")
        d.cell("jax-xla tiny fwd", "parity-fail", "y: scale error")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[1/4] torch-eager tiny fwd -> ok  (elapsed ") and "left)" in lines[0]
    assert lines[1].startswith("[2/4] jax-xla tiny fwd -> parity-fail") and lines[1].endswith(": y: scale error")


def test_quiet_shows_only_problems_and_verbose_shows_reasons_and_messages() -> None:
    out = io.StringIO()
    with Display(3, "quiet", stream=out, live=False) as d:
        d.message("measuring ceilings", important=True)
        d.cell("a", "ok", "")
        d.cell("b", "skipped", "needs a GPU")
        d.cell("c", "error", "boom")
    assert out.getvalue().count("\n") == 1 and "-> error" in out.getvalue() and ": boom" in out.getvalue()
    out = io.StringIO()
    with Display(1, "verbose", stream=out, live=False) as d:
        d.message("measuring ceilings")
        d.cell("b", "skipped", "needs a GPU")
    assert "measuring ceilings" in out.getvalue() and ": needs a GPU" in out.getvalue()


def test_live_bar_draws_counts_on_a_terminal() -> None:
    out = io.StringIO()
    with Display(2, "normal", stream=out, live=True, title="run") as d:
        d.cell("a", "ok")
        d.cell("b", "ok")
    assert "2/2" in out.getvalue()


def test_durations_and_eta() -> None:
    assert fmt_duration(12.34) == "12.3s" and fmt_duration(75.2) == "1m15s" and fmt_duration(7300) == "2h01m"
    assert eta(0, 10, 5.0) is None and eta(2, 10, 4.0) == 16.0 and eta(10, 10, 9.0) == 0.0
    with pytest.raises(ValueError, match="unknown progress level 'loud'"):
        Display(1, "loud")


# --- stages: what is being done now, the time left from the work still to do ---------------------------------------


class _Clock:
    """A fake clock: time passes only when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _layers(n: int, dtype: str = "bfloat16") -> list[Case]:
    """``n`` layers of one checkpoint: cases of one shape and dtype, as ``--layers`` makes them."""
    shape = Shape(1, 16, 256, 1024)
    path = "/checkpoints/model.safetensors.index.json"
    return [
        Case("swiglu", shape, dtype, weights=Weights(path, "0" * 64, f"model.layers.{i}.mlp.", layer=i))
        for i in range(n)
    ]


#: what each kind of stage takes on the fake clock (seconds): the truth the estimates are held to
TAKES = {"golden": 30.0, "plain": 8.0, "resolution": 4.0, "first": 45.0, "timing": 25.0, "finish": 1.0,
         "reference": 30.0, "judging": 2.0}  # fmt: skip


def _walk(d: Display, clock: _Clock, stages: list[Stage], seen: dict[int, float | None] | None = None) -> None:
    """Go through ``stages`` as the harness does, each taking its :data:`TAKES` on ``clock`` (a judging stage ends
    with its cell's line); ``seen``: the time left read as each one begins, by its index."""
    for i, s in enumerate(stages):
        d.stage(s.kind, s.case, s.mode, s.backend)
        if seen is not None:
            seen[i] = d.left()
        clock.t += TAKES[s.kind]
        if s.kind == "judging":
            d.cell(f"{s.backend} {s.case} {s.mode}", "ok")


def test_the_stages_are_planned_in_the_harness_order_and_named_for_a_reader() -> None:
    cells = [(c, "fwd+bwd", b) for c in _layers(3) for b in ("torch-eager", "torch-compile")]
    stages = run_stages(cells, timing_s=2.0)
    kinds = [s.kind for s in stages[: len(stages) // 3]]
    assert kinds == [
        "golden", "plain", "resolution", "first", "first", "timing", "finish", "finish", "reference", "judging",
        "judging",
    ]  # fmt: skip
    assert [s.text for s in stages if s.kind == "golden"] == [f"layer {i} of 3: golden reference" for i in range(3)]
    first = [s for s in stages if s.kind == "first"]
    assert first[1].text == "layer 0 of 3 fwd+bwd: torch-compile: prepare and first calls"
    assert first[1].prior_s > first[0].prior_s  # a compiling backend's first calls are expected to take longer
    assert next(s for s in stages if s.kind == "timing").text == "layer 0 of 3 fwd+bwd: timing 2 backends"
    # every layer's stage of one kind and backend is alike (its estimate is the first layer's time)...
    assert len({s.key for s in stages if s.kind == "golden"}) == 1 and len({s.key for s in first}) == 2
    # ...and two dtypes are not, nor a lone case named by its place
    tiny = PRESETS["tiny"]
    two = run_stages([(c, "fwd", "jax-xla") for c in (tiny.case("float32"), tiny.case("bfloat16"))])
    assert len({s.key for s in two if s.kind == "judging"}) == 2
    assert [s.text for s in two if s.kind == "golden"] == [f"case {k} of 2: golden reference" for k in (1, 2)]
    assert run_stages([(PRESETS["tiny"].case("float32"), "fwd", "jax-xla")])[0].text == "golden reference"


def test_the_time_left_after_the_first_of_two_equal_cases_is_the_second_ones() -> None:
    """Two layers of one shape on a fake clock: once the first is done, the time left is what the second takes, at
    every stage of it (and from its first cell's line on, the rest of the first one too); the control: the mean pace
    per cell a quarter of the way in."""
    clock = _Clock()
    cells = [(c, "fwd+bwd", b) for c in _layers(2) for b in ("torch-eager", "torch-compile")]
    stages = run_stages(cells, timing_s=2.0)
    out = io.StringIO()
    seen: dict[int, float | None] = {}
    with Display(4, stream=out, live=False, clock=clock, tick_s=None) as d:
        d.expect(stages, 4)
        assert d.left() is None  # nothing measured yet
        _walk(d, clock, stages, seen)
    half = len(stages) // 2
    truth = [sum(TAKES[s.kind] for s in stages[i:]) for i in range(len(stages))]
    for i in range(half, len(stages)):
        left = seen[i]
        assert left is not None and left == pytest.approx(truth[i], rel=0.01), (stages[i].text, left, truth[i])
    # the second cell's line (the first layer done) says the second layer's time, not the pace per cell's
    line = out.getvalue().splitlines()[1]
    assert line.startswith("[2/4] torch-compile ") and f"about {fmt_duration(truth[half])} left" in line, line
    # the control: the first cell's line, where the pace per cell (a run's four cells settle in two groups) says
    # three times what the first cell took, the stages what is left of the first layer and all of the second
    first = out.getvalue().splitlines()[0]
    at = half - 1  # the first layer's last stage: its first cell is done
    elapsed = sum(TAKES[s.kind] for s in stages[:at])
    m, sec = re.search(r"about (\d+)m(\d+)s left", first).groups()  # type: ignore[union-attr]
    assert int(m) * 60 + int(sec) == pytest.approx(truth[at], rel=0.05), first  # judging's own time still a guess
    assert eta(1, 4, elapsed) > 2 * truth[at]  # type: ignore[operator]
    assert seen[0] is None  # nothing measured before the first stage ends


def test_the_time_left_is_bounded_by_the_budget_and_counts_what_follows() -> None:
    clock = _Clock()
    stages = run_stages([(c, "fwd", "jax-xla") for c in _layers(2)])
    with Display(2, stream=io.StringIO(), live=False, clock=clock, tick_s=None, deadline=clock.t + 50.0) as d:
        d.expect(stages, 2)
        d.after(lambda: 7.0)
        _walk(d, clock, stages[: len(stages) // 2])
        d.stage("golden", stages[len(stages) // 2].case)
        second = sum(TAKES[s.kind] for s in stages[len(stages) // 2 :])
        assert clock.t - 1000.0 > 50.0 and d.left() == pytest.approx(second + 7.0)  # past the deadline: the work
        d.deadline = clock.t + 20.0
        assert d.left() == pytest.approx(20.0)  # the budget's end comes first


def test_a_plain_log_gets_a_line_for_a_long_stage_only_and_quiet_none() -> None:
    clock = _Clock()
    stages = run_stages([(_layers(1)[0], "fwd", "jax-xla")])
    out = io.StringIO()
    with Display(1, stream=out, live=False, clock=clock, tick_s=None) as d:
        d.expect(stages, 1)
        d.stage("golden", stages[0].case)
        clock.t += 1.0
        d.tick()
        assert out.getvalue() == ""  # a second in: no line yet
        clock.t += STAGE_LINE_S
        d.tick()
        d.tick()
        assert out.getvalue().splitlines() == ["... layer 0 of 1: golden reference  (elapsed 3.0s)"]  # once
        for s in stages[1:]:  # quick stages: no line, but the cell's
            d.stage(s.kind, s.case, s.mode, s.backend)
            clock.t += 0.1
            d.tick()
        d.cell("jax-xla l0 fwd", "ok")
    assert len(out.getvalue().splitlines()) == 2
    for level, lines in (("quiet", 0), ("verbose", len(stages))):
        out = io.StringIO()
        with Display(1, level, stream=out, live=False, clock=clock, tick_s=None) as d:
            d.expect(stages, 1)
            for s in stages:
                d.stage(s.kind, s.case, s.mode, s.backend)
                clock.t += 10.0
                d.tick()
        assert len(out.getvalue().splitlines()) == lines, out.getvalue()
        assert level == "quiet" or out.getvalue().splitlines()[3].startswith("... layer 0 of 1 fwd: jax-xla: prepare")


def test_a_long_reason_is_cut_to_one_short_line() -> None:
    out = io.StringIO()
    reason = "RuntimeError: " + "x" * 3000 + "\n  File 'compiled.py', line 3\n" + "y" * 2000
    with Display(1, stream=out, live=False, tick_s=None) as d:
        d.cell("torch-compile tiny fwd", "error", reason)
    (line,) = out.getvalue().splitlines()
    assert len(line) < 320 and line.endswith("…") and ": RuntimeError: xxx" in line
    assert short("a\n  b\tc") == "a b c" and short("abcdef", 4) == "abc…" and short("abcd", 4) == "abcd"


def test_the_live_bar_names_the_stage_and_moves_with_the_clock() -> None:
    clock = _Clock()
    stages = run_stages([(c, "fwd", "jax-xla") for c in _layers(2)])
    out = io.StringIO()
    with Display(2, stream=out, live=True, title="run", clock=clock, tick_s=None) as d:
        d.expect(stages, 2)
        _walk(d, clock, stages[: len(stages) // 2])
        d.stage("golden", stages[len(stages) // 2].case)
        before = d.fraction()
        clock.t += 10.0
        d.tick()
        assert before is not None and d.fraction() is not None and d.fraction() > before  # type: ignore[operator]
        task = d._rich.tasks[0]
        assert task.description == "run: layer 1 of 2: golden reference" and task.fields["cells"] == "1/2"
        assert task.fields["left"].startswith("about ")


@pytest.mark.standard
def test_a_piped_run_says_each_stage_in_order_and_each_cell_before_the_next_case(tmp_path: Path) -> None:
    """A real run of two cases (two dtypes) into a pipe, verbose: every stage's line in the harness's order, and each
    cell's line right after its own judging, before the next cell is judged and before the next case's golden
    reference begins."""
    p = subprocess.run(
        [
            sys.executable, "-m", "compare", "run", "--preset", "tiny", "--backend", "torch-eager", "jax-xla",
            "--mode", "fwd+bwd", "--dtype", "float32", "bfloat16", "--budget", "0.02", "--no-ceilings", "--no-plots",
            "--gpu-build", "", "--verbose", "--out", str(tmp_path / "out"),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith(("... ", "["))]
    want = []
    for k, dtype in ((1, "float32"), (2, "bfloat16")):
        at, mode = f"case {k} of 2", f"case {k} of 2 fwd+bwd"
        cell = f"geglu-3x37x96-328-{dtype}-normal-s0 fwd+bwd -> "
        want += [f"... {at}: golden reference", f"... {at}: plain computation", f"... {at}: resolution rows"]
        want += [f"... {mode}: {b}: prepare and first calls" for b in ("torch-eager", "jax-xla")]
        want += [f"... {mode}: timing 2 backends", *(f"... {mode}: finishing {b}" for b in ("torch-eager", "jax-xla"))]
        want += [f"... {at}: reference of the fresh inputs"]
        for i, b in enumerate(("torch-eager", "jax-xla"), 2 * k - 1):
            want += [f"... {mode}: judging {b}", f"[{i}/4] {b} {cell}"]
    assert len(said) == len(want), "\n".join(said)
    for line, start in zip(said, want, strict=True):
        assert line.startswith(start), (line, start)
