"""Shared fixtures: parity results are cached per (backend, case, mode) so each compile happens once a session."""

from __future__ import annotations

import functools

from compare.cases import Case
from compare.harness import TimingConfig, plain_reference, run_one
from compare.registry import spec
from compare.results import Result


@functools.cache
def parity_result(backend: str, case: Case, mode: str) -> Result:
    """Parity-only run of a registered backend (no timing), cached for the session."""
    return run_one(spec(backend), case, mode, plain_reference(case), TimingConfig(), {}, time_it=False)


def explain(r: Result) -> str:
    """A failure message with the numbers: status, reason and each tensor's error against its bound."""
    lines = [f"{r.backend} {r.case} {r.mode}: {r.status} {r.reason}"]
    for t in (r.parity or {}).get("tensors", []):
        lines.append(f"  {t['tensor']}: max abs err {t['max_abs_err']:.3g} bound {t['bound']:.3g} "
                     f"ratio {t['ratio']:.2f} at {t['worst_index']}")
    if r.extras.get("traceback"):
        lines.append(r.extras["traceback"])
    return "\n".join(lines)
