"""The machine-load record (``compare.results.load``): the sampler's arithmetic on a fake ``/proc``, its fields
None with the reason without one, a real CPU-burning process counted as another's, the record's round trip and an
older document without it; and where it shows: the report's Environment row, the timing note and the summary's
busy sentence. What it cannot see: a GPU another process keeps busy, and a load that came and went inside the
window (the share is an average)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compare.formats.codec import from_json, to_json
from compare.report import render
from compare.report.summary import summary_section
from compare.results.document import Results
from compare.results.load import BUSY_SHARE, Load, LoadSampler, busier
from tests.test_diff import _doc, _result, _samples

pytestmark = pytest.mark.quick

HZ = os.sysconf("SC_CLK_TCK")


def _stat(busy_ticks: int, steal: int | None, cores: int = 2) -> str:
    """A ``/proc/stat`` text whose aggregate line has ``busy_ticks`` in ``user`` (``steal`` as given, the column
    left out when None), ``cores`` per-CPU lines and idle time that must not count."""
    cols = [busy_ticks, 0, 0, 10_000, 5, 0, 0] + ([] if steal is None else [steal, 0, 0])
    lines = ["cpu  " + " ".join(map(str, cols))] + [f"cpu{i} 0 0 0 0 0 0 0" for i in range(cores)]
    return "\n".join([*lines, "intr 1 2", "ctxt 3"]) + "\n"


class _Fake:
    """A fake ``/proc`` (``stat`` and ``loadavg``), wall clock and own-CPU clock, moved by hand."""

    def __init__(self, tmp: Path) -> None:
        self.proc, self.t, self.own = tmp, 0.0, 0.0

    def write(self, busy: int, steal: int | None, loadavg: str = "3.50 2.00 1.00 4/300 999") -> None:
        (self.proc / "stat").write_text(_stat(busy, steal))
        (self.proc / "loadavg").write_text(loadavg)

    def sampler(self) -> LoadSampler:
        return LoadSampler(self.proc, own=lambda: self.own, clock=lambda: self.t)


def test_others_are_the_machines_busy_time_less_this_process(tmp_path: Path) -> None:
    """2 cores, 10 s: the machine was busy 15 CPU s, this process used 5 of them, steal 1 s: others 10 s, a share
    of (10 + 1) / 20 = 55%: busy, so it explains any slowdown (a parallel step loses more than its share)."""
    f = _Fake(tmp_path)
    f.write(1000 * HZ, 7 * HZ)
    s = f.sampler().start()
    f.t, f.own = 10.0, 5.0
    f.write(1000 * HZ + 15 * HZ, 8 * HZ)
    got = s.stop()
    assert (got.window_s, got.cores, got.loadavg_1m) == (10.0, 2, 3.5)
    assert got.others_cpu_s == pytest.approx(10.0) and got.steal_s == pytest.approx(1.0)
    assert got.taken_share == pytest.approx(0.55) and got.busy
    assert got.explained_ratio() == math.inf
    assert "55% of 2 cores over 10.0 s" in got.describe() and "busy" in got.describe()


def test_a_machine_this_process_had_alone_is_quiet(tmp_path: Path) -> None:
    """Negative control: every busy tick was this process's own: others 0, not busy, nothing explained (1x)."""
    f = _Fake(tmp_path)
    f.write(500, 0)
    s = f.sampler().start()
    f.t, f.own = 4.0, 8.0
    f.write(500 + 8 * HZ, 0)
    got = s.stop()
    assert got.others_cpu_s == pytest.approx(0.0) and got.steal_s == 0.0
    assert not got.busy and got.explained_ratio() == 1.0 and "busy" not in got.describe()


def test_steal_alone_can_make_a_machine_busy(tmp_path: Path) -> None:
    """No other process, but the hypervisor took 3 of 2 x 10 core-seconds (15% > BUSY_SHARE); a kernel without the
    steal column gives None there, not 0."""
    f = _Fake(tmp_path)
    f.write(0, 0)
    s = f.sampler().start()
    f.t = 10.0
    f.write(0, 3 * HZ)
    got = s.stop()
    assert got.steal_s == pytest.approx(3.0) and got.taken_share == pytest.approx(0.15) and got.busy
    assert BUSY_SHARE < 0.15
    f.write(0, None)
    s = f.sampler().start()
    f.t = 20.0
    assert s.stop().steal_s is None


def test_without_proc_every_figure_is_none_with_the_reason(tmp_path: Path) -> None:
    got = LoadSampler(tmp_path / "no-proc").start().stop()
    assert got.others_cpu_s is None and got.cores is None and got.steal_s is None
    assert "no CPU accounting" in got.reason and got.taken_share is None and not got.busy
    assert got.explained_ratio() == 1.0 and got.describe().startswith("not measured (no CPU accounting")
    (tmp_path / "stat").write_text("intr 1\n")  # a /proc/stat without the aggregate line
    assert "no aggregate 'cpu' line" in LoadSampler(tmp_path).start().stop().reason


@pytest.mark.standard
@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux's /proc/stat")
def test_a_real_cpu_burning_process_counts_as_another(tmp_path: Path) -> None:
    """A child that burns CPU and is not waited for is another process: the real sampler counts at least its CPU
    time (the other engineers' load on this machine can only add to it)."""
    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\nprint('done', flush=True)\n"
    s = LoadSampler().start()
    with subprocess.Popen([sys.executable, "-c", burn + "time.sleep(60)"], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "done"
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            child_s = (int(fields[11]) + int(fields[12])) / HZ  # utime + stime, after the state field
            time.sleep(0.05)
            got = s.stop()
        finally:
            child.kill()
    assert child_s >= 0.5
    assert got.others_cpu_s is not None and got.others_cpu_s >= child_s - 0.05, (got, child_s)
    assert got.cores == os.cpu_count() and got.window_s is not None and got.window_s >= 0.5


def _busy() -> Load:
    return Load(window_s=10.0, cores=2, loadavg_1m=4.0, others_cpu_s=12.0, steal_s=0.0)


def _quiet() -> Load:
    return Load(window_s=10.0, cores=2, loadavg_1m=0.5, others_cpu_s=0.4, steal_s=0.0)


def test_the_record_round_trips_and_an_older_document_loads_without_it() -> None:
    doc = from_json(Results, {**_doc([_result("jax-xla", "float32", _samples(1e-3, 0.05))]), "load": to_json(_busy())})
    again = from_json(Results, json.loads(json.dumps(to_json(doc))))
    assert again.load == _busy() and again == doc
    older = from_json(Results, _doc([]))
    assert older.load is None and "load" not in to_json(older) and "run_id" not in to_json(older)
    assert busier(None, _quiet(), _busy()) == _busy() and busier(None, Load(reason="x")) is None


def test_the_report_shows_the_load_and_says_when_the_machine_was_busy() -> None:
    rows = [_result(b, "float32", _samples(1e-3, 0.05)) for b in ("torch-eager", "jax-xla")]
    busy = from_json(Results, {**_doc(rows), "load": to_json(_busy())})
    md = render.files(busy)["DETAILS.md"]
    assert "| machine load | other processes and steal took 60% of 2 cores" in md
    timing = md.split("## Timing", 1)[1]
    assert "Machine load over the measurements: other processes" in timing
    assert "Busy (others took more than 10%" in timing
    assert "The machine was busy while this run measured" in summary_section(busy)
    # negative controls: a quiet run shows its load and says nothing of busy; an older run shows no load at all
    quiet = from_json(Results, {**_doc(rows), "load": to_json(_quiet())})
    assert "| machine load | other processes and steal took 2%" in render.files(quiet)["DETAILS.md"]
    assert "busy" not in summary_section(quiet).lower() and "Busy (" not in render.files(quiet)["DETAILS.md"]
    older = "".join(render.files(from_json(Results, _doc(rows))).values())
    assert "machine load" not in older.lower() and "Busy (" not in older and "was busy" not in older
