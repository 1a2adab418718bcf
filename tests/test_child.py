"""compare.run.child: a worker's whole process group ends with it, and its stderr tail is kept."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from compare.run import child

pytestmark = pytest.mark.quick

# A child that starts a grandchild (its own pid printed to stderr) and then waits for ever.
_SPAWNER = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('grandchild', g.pid, file=sys.stderr, flush=True)\n"
    "time.sleep(600)\n"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has ended all the same
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc (Linux)")
def test_ending_a_child_ends_what_it_started():
    c = child.start([sys.executable, "-c", _SPAWNER])
    try:
        deadline = time.monotonic() + 30
        while "grandchild" not in c.tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(c.tail().split()[-1])
        assert _alive(grandchild)
        rc = c.end(grace_s=0.5)
        assert rc == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the grandchild outlived its group's end"
    finally:
        c.close()


def test_the_tail_keeps_the_last_lines_and_the_exit_is_described():
    code = "import sys\nfor i in range(50): print('line', i, file=sys.stderr)\nsys.exit(3)"
    c = child.start([sys.executable, "-c", code])
    try:
        assert c.wait(30) == 3
        assert c.tail(2) == "line 48\nline 49"
        assert child.describe_exit(3) == "exited with status 3"
        assert "SIGKILL" in child.describe_exit(-signal.SIGKILL) and "OOM" in child.describe_exit(-signal.SIGKILL)
    finally:
        c.close()


def test_a_wait_past_its_bound_returns_none_and_leaves_the_child_running():
    c = child.start([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert c.wait(0.2) is None and c.poll() is None
    finally:
        c.close()
    assert c.poll() is not None
