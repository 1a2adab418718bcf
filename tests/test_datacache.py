"""The data cache's size bound (``compare.problem.datacache``): trimming removes the least recently used entries first
and never one the running command uses or wrote, a hit counts as a use, what a crash left is removed, the bound is
read with units (a bad one is refused naming its variable or option, exit 2), ``cache`` shows the cache and
``cache --clear`` empties it, and a run states what it added (its line, its document, its report)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from compare.cli.main import main
from compare.problem import datacache
from compare.problem.cases import InputError

pytestmark = pytest.mark.quick

#: A time well before any command of a test began (an hour ago).
LONG_AGO = time.time() - 3600


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of this test's own; no bound set, no entry counted as this process's, the command begun now."""
    d = tmp_path / "cache"
    monkeypatch.setenv(datacache.ENV, str(d))
    monkeypatch.delenv(datacache.MAX_ENV, raising=False)
    monkeypatch.setenv(datacache.SINCE_ENV, repr(time.time()))
    monkeypatch.setattr(datacache, "_USED", set())
    return d


def _entry(d: Path, name: str, nbytes: int, used: float) -> Path:
    """An entry of ``nbytes`` bytes of data, last used at ``used``, as an earlier command left it."""
    datacache.save(name, {"y": np.zeros(nbytes // 8, dtype=np.float64)})
    datacache._USED.discard(f"{name}.safetensors")  # an earlier command's, not this one's
    path = d / f"{name}.safetensors"
    os.utime(path, (used, used))
    return path


def test_trimming_removes_the_least_recently_used_first(cache: Path) -> None:
    paths = [_entry(cache, f"plain-{i:032x}", 8000, LONG_AGO + i) for i in range(4)]
    size = paths[0].stat().st_size
    t = datacache.trim(2 * size)
    assert (t.removed, t.freed, t.size, t.kept) == (2, 2 * size, 2 * size, 0)
    assert [p.exists() for p in paths] == [False, False, True, True]  # the two oldest uses went
    assert datacache.trim(10 * size).removed == 0  # within the bound: nothing


def test_trimming_keeps_what_the_running_command_wrote_or_uses(cache: Path) -> None:
    """Over the bound, an entry this process wrote and one used since the command began (by a worker process of it:
    its modification time) are kept, and the bytes kept over the bound are said; an earlier command's go."""
    old = _entry(cache, f"plain-{1:032x}", 8000, LONG_AGO)
    datacache.save(f"reference-{2:032x}", {"y": np.zeros(1000)})  # written by this process, now
    worker = _entry(cache, f"reference-{3:032x}", 8000, time.time())  # a worker process's, since the command began
    mine = cache / f"reference-{2:032x}.safetensors"
    os.utime(mine, (LONG_AGO, LONG_AGO))  # old on disk, but this process wrote it
    t = datacache.trim(0)
    assert not old.exists() and mine.exists() and worker.exists()
    assert t.removed == 1 and t.size == t.kept == mine.stat().st_size + worker.stat().st_size


def test_a_hit_refreshes_an_entry(cache: Path) -> None:
    """Reading an entry (whole, lazily, or a JSON one) is a use: its modification time is now, and the entry read
    stays while the one not read goes."""
    read, unread = (_entry(cache, f"plain-{i:032x}", 8000, LONG_AGO) for i in (1, 2))
    datacache.save_json(f"resolution-{3:032x}", [1, 2])
    rows = cache / f"resolution-{3:032x}.json"
    os.utime(rows, (LONG_AGO, LONG_AGO))
    datacache._USED.clear()
    assert datacache.load(f"plain-{1:032x}") is not None and datacache.load_json(f"resolution-{3:032x}") == [1, 2]
    assert read.stat().st_mtime > LONG_AGO + 60 and rows.stat().st_mtime > LONG_AGO + 60
    assert unread.stat().st_mtime == pytest.approx(LONG_AGO)
    datacache._USED.clear()  # the modification time alone keeps it
    datacache.trim(0)
    assert read.exists() and rows.exists() and not unread.exists()
    lazy = _entry(cache, f"plain-{4:032x}", 8000, LONG_AGO)
    assert datacache.load(f"plain-{4:032x}", lazy=True) is not None
    assert lazy.stat().st_mtime > LONG_AGO + 60


def _dead_pid() -> int:
    """A process id no process has: above the kernel's largest."""
    pid_max = Path("/proc/sys/kernel/pid_max")
    return int(pid_max.read_text()) + 1 if pid_max.is_file() else 2**22 + 1


def test_a_crash_s_leftovers_are_removed(cache: Path) -> None:
    """A spill file of a process that is gone and a temporary file untouched for an hour go; a live process's spill
    file, a fresh temporary file and the entries stay (within the bound)."""
    entry = _entry(cache, f"plain-{1:032x}", 8000, LONG_AGO)
    dead = cache / f"spill-{_dead_pid()}-0.safetensors"
    live = cache / f"spill-{os.getpid()}-7.safetensors"
    old_tmp, new_tmp = cache / ".plain-x.safetensors.ab12.tmp", cache / ".plain-y.safetensors.cd34.tmp"
    for p in (dead, live, old_tmp, new_tmp):
        p.write_bytes(b"x" * 100)
    os.utime(old_tmp, (LONG_AGO - 60, LONG_AGO - 60))
    assert sorted(p.name for p in datacache.stale(cache)) == sorted([dead.name, old_tmp.name])
    t = datacache.trim()
    assert (t.stale, t.stale_bytes, t.removed) == (2, 200, 0)
    assert not dead.exists() and not old_tmp.exists() and live.exists() and new_tmp.exists() and entry.exists()
    assert [e.file for e in datacache.entries(cache)] == [entry.name]  # spill and temporary files are no entries


@pytest.mark.parametrize(
    ("text", "value"),
    [("20GB", 20 * 10**9), ("10G", 10 << 30), ("512MiB", 512 << 20), ("1.5kB", 1500), ("0", 0), (" 7 b ", 7)],
)
def test_the_bound_is_read_with_units(text: str, value: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert datacache.parse_bound(text, "x") == value
    monkeypatch.setenv(datacache.MAX_ENV, text)
    assert datacache.bound() == value
    monkeypatch.delenv(datacache.MAX_ENV)
    assert datacache.bound() == datacache.DEFAULT_MAX


@pytest.mark.parametrize("text", ["abc", "-1G", "10X", "G", "1e9", "2 GB extra"])
def test_a_bad_bound_is_refused_naming_where_it_came_from(
    text: str, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(datacache.MAX_ENV, text)
    with pytest.raises(InputError, match=datacache.MAX_ENV):
        datacache.bound()
    assert main(["cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {datacache.MAX_ENV}: {text!r} is not a size") and "20GB" in err, err
    monkeypatch.delenv(datacache.MAX_ENV)
    assert main(["cache", f"--data-cache-max={text}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --data-cache-max: {text!r} is not a size")
    out = cache.parent / "out"
    assert (
        main(["run", "--preset", "tiny", "--backend", "torch-eager", "--out", str(out), f"--data-cache-max={text}"])
        == 2
    )
    assert not out.exists() and not cache.exists()  # refused at the door: nothing measured or written
    assert os.environ.get(datacache.MAX_ENV) is None  # the option's value did not outlive the command


def test_a_write_past_the_bound_trims(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``save`` and ``save_json`` trim to the bound after they write: an earlier command's entries go, the new one
    stays; a bad bound leaves the cache as it is and says so once."""
    old = _entry(cache, f"plain-{1:032x}", 8000, LONG_AGO)
    monkeypatch.setenv(datacache.MAX_ENV, "1")
    datacache.save_json(f"resolution-{2:032x}", [1])
    assert not old.exists() and (cache / f"resolution-{2:032x}.json").exists()
    old = _entry(cache, f"plain-{3:032x}", 8000, LONG_AGO)
    monkeypatch.setenv(datacache.MAX_ENV, "lots")
    datacache.save_json(f"resolution-{4:032x}", [1])
    assert old.exists()


def test_a_command_s_use_is_measured_against_the_cache_it_began_with(cache: Path) -> None:
    """:func:`run_use`: the bytes the command added, the older bytes gone, the size at the end against the bound; the
    command's own entries kept over the bound."""
    old = _entry(cache, f"plain-{1:032x}", 8000, LONG_AGO)
    with datacache.run_scope():
        assert os.environ[datacache.SINCE_ENV] != ""
        datacache.save(f"reference-{2:032x}", {"y": np.zeros(2000)})
        os.environ[datacache.MAX_ENV] = "10"
        try:
            use = datacache.run_use()
        finally:
            del os.environ[datacache.MAX_ENV]
    assert use is not None and use.folder == cache
    new = (cache / f"reference-{2:032x}.safetensors").stat().st_size
    assert (use.added, use.size, use.bound) == (new, new, 10) and use.removed > 8000 and not old.exists()
    assert datacache.run_use() is None  # outside a command


def test_cache_shows_the_cache_and_clear_empties_it(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``cache``: the folder, its size against the bound, the entries by kind, the largest; ``--clear`` removes every
    entry, leftover and the GPU build's folder, says what it freed, and leaves a file of another name."""
    assert main(["cache"]) == 0
    assert "(not made yet)" in capsys.readouterr().out
    _entry(cache, f"reference-{1:032x}", 80000, LONG_AGO)
    _entry(cache, f"plain-fwd-{2:032x}", 8000, LONG_AGO)
    datacache.save_json(f"interpreted-parity-torch-triton-{3:032x}", {"result": {}})
    (cache / f"spill-{os.getpid()}-0.safetensors").write_bytes(b"x" * 10)
    records = cache / "gpu-build" / "records"
    records.mkdir(parents=True)
    (records / "k.json").write_text("{}")
    (cache / "notes.txt").write_text("mine")
    total = sum(e.size for e in datacache.entries(cache))
    assert main(["cache", "--data-cache-max", "1MB"]) == 0
    out = capsys.readouterr().out
    assert f"data cache: {cache}\n" in out and "of its 1 MB bound" in out
    assert "entries: 3: reference 1 (" in out and "plain-fwd 1 (" in out and "interpreted-parity 1 (" in out
    assert out.index(f"reference-{1:032x}") < out.index(f"plain-fwd-{2:032x}")  # the largest first
    assert "gpu-build: 2 B" in out
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    freed = total + 10 + 2
    assert out.startswith(f"cleared {cache}: removed 5 files, {freed / 1000:.3g} kB freed\n"), out
    assert "entries: 0" in out
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]


def test_cache_trim_and_an_off_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _entry(cache, f"plain-{1:032x}", 8000, LONG_AGO)
    keep = _entry(cache, f"plain-{2:032x}", 8000, LONG_AGO + 1)
    assert main(["cache", "--trim", "--data-cache-max", "9000B"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"trimmed {cache} to its 9 kB bound: removed 1 entries (8.") and keep.exists()
    monkeypatch.setenv(datacache.ENV, "off")
    assert main(["cache"]) == 0
    assert "off" in capsys.readouterr().out
    for flag in ("--clear", "--trim"):
        assert main(["cache", flag]) == 2
        assert "the data cache is off" in capsys.readouterr().err


@pytest.mark.standard
def test_a_run_states_what_it_added_to_the_data_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real run: its line, its document's environment and its report say the bytes it added and the cache's size
    against its bound; a second run adds nothing, and its own entries stay though the bound is 0 (said); once it is
    over, they are trimmed like any other."""
    from compare.problem import golden
    from compare.run import cell

    args = ["run", "--preset", "tiny", "--backend", "torch-eager", "--dtype", "float32", "--mode", "fwd"]
    args += ["--budget", "0.02", "--no-plots", "--no-ceilings"]
    out = cache.parent / "a"
    golden.golden_for.cache_clear()  # as a new process: an earlier test's data in this one's memory is not written
    cell.plain_reference.cache_clear()
    assert main([*args, "--out", str(out)]) == 0
    added = sum(e.size for e in datacache.entries(cache))
    assert added > 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("data cache: "))
    doc = json.loads((out / "results.json").read_text())
    assert doc["environment"]["data_cache"] == {
        "added": added,
        "removed": 0,
        "size": added,
        "bound": datacache.DEFAULT_MAX,
        "off": False,
    }
    from compare.formats.markdown import si

    said = f"+{si(added, 'B')} this run, {si(added, 'B')} of its 20 GB bound"
    assert line == f"data cache: {said} ({cache})"
    assert f"\nData cache: {said}.\n" in (out / "REPORT.md").read_text()
    assert f"| data cache | {said} |" in (out / "DETAILS.md").read_text()

    golden.golden_for.cache_clear()  # as a new process: read from the cache, not from this one's memory
    cell.plain_reference.cache_clear()
    assert main([*args, "--out", str(cache.parent / "b"), "--data-cache-max", "0"]) == 0
    doc = json.loads((cache.parent / "b" / "results.json").read_text())
    assert doc["environment"]["data_cache"]["added"] == 0 and doc["environment"]["data_cache"]["size"] == added
    report = (cache.parent / "b" / "REPORT.md").read_text()
    assert (
        "Data cache: nothing added this run" in report and "over the bound: this run's own entries are kept" in report
    )
    for e in datacache.entries(cache):  # later: no command uses them now
        os.utime(cache / e.file, (LONG_AGO, LONG_AGO))
    capsys.readouterr()
    assert main(["cache", "--trim", "--data-cache-max", "0"]) == 0
    assert datacache.entries(cache) == []
