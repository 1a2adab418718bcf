"""Results as flat rows: one per cell (backend, case, dtype, mode), for spreadsheets and pandas
(``python -m compare export results.json --csv``).

A pure function of a results document, as the report is. Each figure is the one the report shows, in plain units:
seconds, bytes, counts. The speedup against the baseline and its verdict are the summary table's
(:func:`compare.timing.significance.compare_timing` against the same machine's baseline on the same case and mode):
``speedup`` is a number only where the verdict is ``faster`` or ``slower``; within noise, or with no test, it is
empty and the verdict says so. An empty field is a figure that was not measured; the report says why.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from compare.backends.registry import NO_SPEEDUP, baseline_of
from compare.report.machines import same_machine
from compare.report.memory import saved_bytes
from compare.results.document import Result, Results
from compare.timing.significance import FASTER, PAIRED, SLOWER, compare_timing

#: The columns, in order. ``versions`` holds ``name=version`` pairs separated by spaces; ``machine`` is the run's
#: CPU, logical cores and GPU, or a sweep row's own node (its host and machine type).
COLUMNS: tuple[str, ...] = (
    "backend",
    "world_size",
    "case",
    "model",
    "dtype",
    "mode",
    "batch",
    "seq",
    "dim",
    "hidden",
    "status",
    "tier",
    "worst_tensor",
    "worst_ratio",
    "median_s",
    "iqr_s",
    "n",
    "cold_median_s",
    "speedup",
    "speedup_verdict",
    "speedup_test",
    "kernels_per_step",
    "saved_bytes",
    "peak_bytes",
    "weights_sha256",
    "module_sha256",
    "layer",
    "versions",
    "machine",
)


def _speedup(doc: Results, r: Result) -> tuple[str, str, str]:
    """(speedup, verdict, test) of ``r`` against its case's baseline (``baseline_of``: a module case's own), as the
    summary table judges it; a row that fails is not compared."""
    if r.status in NO_SPEEDUP:
        return "", f"not compared ({r.status})", ""
    base = same_machine(doc.results, r, baseline_of(r.model), lambda b: b.timing)
    if base is None or base.timing is None or r.timing is None:
        return "", "not compared", ""
    if base is r:
        return "", "baseline", ""
    v = compare_timing(base.timing, r.timing)
    figure = f"{1 / v.ratio:.6g}" if v.verdict in (FASTER, SLOWER) else ""
    return figure, v.verdict, "paired" if v.design == PAIRED else "unpaired"


def row(doc: Results, r: Result) -> dict[str, Any]:
    """One cell's flat row (:data:`COLUMNS`)."""
    env, p, t = doc.environment, r.parity, r.timing
    speedup, verdict, test = _speedup(doc, r)
    versions = r.node.versions if r.node is not None else env.versions  # a sweep row's own machine's
    if r.node is not None:
        machine = f"{r.node.host}: {r.node.machine_type()}"
    else:
        machine = f"{env.cpu or 'unknown CPU'} ({env.cpu_count} logical cores); {env.gpu or 'no GPU'}"
    peak = r.memory.peak if r.memory is not None else None
    out: dict[str, Any] = {
        "backend": r.backend,
        "world_size": r.world_size,
        "case": r.case,
        "model": r.model,
        "dtype": r.dtype,
        "mode": r.mode,
        "batch": r.shape.batch,
        "seq": r.shape.seq,
        "dim": r.shape.dim,
        "hidden": r.shape.hidden,
        "status": r.status,
        "tier": p.tier if p is not None else "",
        "worst_tensor": p.worst_tensor if p is not None else "",
        "worst_ratio": p.worst_ratio if p is not None else "",
        "median_s": t.median_s if t is not None else "",
        "iqr_s": t.iqr_s if t is not None else "",
        "n": t.n if t is not None else "",
        "cold_median_s": r.cold.median_s if r.cold is not None else "",
        "speedup": speedup,
        "speedup_verdict": verdict,
        "speedup_test": test,
        "kernels_per_step": r.kernels.kernels_per_step if r.kernels is not None else "",
        "saved_bytes": saved_bytes(r) if saved_bytes(r) is not None else "",
        "peak_bytes": peak.bytes if peak is not None else "",
        "weights_sha256": r.weights.sha256 if r.weights is not None else "",
        "module_sha256": r.module.sha256 if r.module is not None else "",
        "layer": r.weights.layer if r.weights is not None and r.weights.layer is not None else "",
        "versions": " ".join(f"{k}={v}" for k, v in sorted(versions.items()) if v),
        "machine": machine,
    }
    return out


def rows(doc: Results) -> list[dict[str, Any]]:
    """Every cell of ``doc``, in its order."""
    return [row(doc, r) for r in doc.results]


def to_csv(doc: Results) -> str:
    """``doc`` as CSV text: a header of :data:`COLUMNS`, then one line per cell."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows(doc))
    return buf.getvalue()
