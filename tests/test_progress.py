"""The terminal display: counts, elapsed and time left per cell; quiet shows only problems; a live bar on a tty."""

from __future__ import annotations

import io

import pytest

from compare.run.progress import Display, eta, fmt_duration

pytestmark = pytest.mark.quick


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
