"""The machines of a run: each row's node (``compare.results.environment.Node``, set on a sweep's rows) and its
machine type (CPU model, instruction sets, GPU). Timings compare within one machine type only: the report groups
them by it and never computes a speedup across two. Parity compares across machines (the same float64 golden and
the same machine-independent bounds everywhere). A document whose timed rows come from one machine type, or carry
no node, renders as before."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compare.results.document import Result, Results


def machine_of(r: Result) -> str | None:
    """The machine type of the row's node; None where the row names none (a run's rows, a lost worker's)."""
    return r.node.machine_type() if r.node is not None else None


def timed_machine_types(results: Sequence[Result]) -> list[str | None]:
    """The machine types of the timed rows, in order of first appearance (None: rows without a node)."""
    return list(dict.fromkeys(machine_of(r) for r in results if r.timing is not None))


def same_machine(
    results: Sequence[Result], r: Result, backend: str, measured: Callable[[Result], object]
) -> Result | None:
    """The first row of ``backend`` on ``r``'s case and mode with a ``measured`` figure (its cost, its timing), on
    ``r``'s machine type: a speedup or a saving is never measured across two machine types."""
    for b in results:
        same = b.backend == backend and (b.case, b.mode) == (r.case, r.mode)
        if same and measured(b) is not None and machine_of(b) == machine_of(r):
            return b
    return None


def several(results: Sequence[Result]) -> bool:
    """True when the timed rows come from more than one machine type: the report then groups timings by it."""
    return len(timed_machine_types(results)) > 1


def machines_line(doc: Results) -> str:
    """``Machines: ...``: every machine type of the run's rows, with its hosts, Ray nodes, GPU driver and rows;
    ``""`` when no row names its node."""
    types: dict[str, list[Result]] = {}
    for r in doc.results:
        m = machine_of(r)
        if m is not None:
            types.setdefault(m, []).append(r)
    if not types:
        return ""
    parts = []
    for m, rows in types.items():
        nodes = [r.node for r in rows if r.node is not None]
        hosts = sorted({n.host for n in nodes if n.host})
        ids = sorted({n.node_id for n in nodes if n.node_id})
        drivers = sorted({n.driver for n in nodes if n.driver})
        where = f"host {', '.join(hosts) or 'unknown'}" + (f", {len(ids)} Ray node(s)" if ids else "")
        driver = f", driver {', '.join(drivers)}" if drivers else ""
        parts.append(f"{m} ({where}{driver}; {len(rows)} row(s))")
    kinds = f"{len(types)} machine type" + ("s" if len(types) > 1 else "")
    rule = (
        "; timings are grouped by machine type and never compared across two, parity compares across them"
        if len(types) > 1
        else ""
    )
    return f"Machines: {kinds}: " + "; ".join(parts) + rule + "."
