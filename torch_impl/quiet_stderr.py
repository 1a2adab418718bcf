"""Keep the profiler's C++ chatter off the terminal, and everything else on it.

``torch.profiler`` (Kineto) writes lines such as ``...SyncActivityProfilerHandler.cpp:52] profiler_start`` straight
to the process's stderr file descriptor, below Python. :func:`filtered_stderr` points file descriptor 2 at a
temporary file while the profiler runs, then writes back every line that is not such chatter, so a real warning
or error from inside the profiled step still reaches the terminal (and is never swallowed).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

#: Kineto's own notices (``USDT:...`` lines, its profiler classes' log lines, start/stop) and blank lines.
CHATTER = re.compile(
    r"\s*|USDT:.*|.*\b(\w*ActivityProfiler\w*|CuptiActivityApi|ChromeTraceLogger|Kineto)\b.*|"
    r".*\bprofiler_(start|stop)\b.*"
)


@contextlib.contextmanager
def filtered_stderr(pattern: re.Pattern[str] = CHATTER) -> Iterator[None]:
    """While inside, fd 2 goes to a temporary file; on the way out, lines not matching ``pattern`` go to stderr."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2 (an embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines() if not pattern.fullmatch(ln)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)
