"""The report's tensor-parallel sections, a pure function of the typed results (``Result.tp``).

- **Tensor parallel**: per TP cell, how its ranks ran, the parity verdict on every rank, the step, its collectives
  alone and its compute alone (all through the shared timer), and the share of the step spent communicating.
- **Collectives**: what each step issued (counted by the backend from its framework), against the communication
  model (``compare.cost.comm``): kinds, calls and bytes; the all-reduce bandwidth measured by the collectives alone,
  the time the model predicts from it, and the time the step actually spent beyond its compute.
- **Scaling**: world size ``p`` against world size 1 of the same backend at the same total thread count, and only
  that pair is called fair; ranks that outnumber the CPUs measure time-slicing and say so.
- **Set-up**: launch to ready, forming the group, distributing the weights, the first call (compile), apart from
  the steady state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compare.formats.markdown import case_label, fmt_s, table
from compare.results.document import Result
from compare.results.tp import TPInfo
from compare.timing.significance import FASTER, compare_timing, speedup
from compare.timing.timer import Timing

SECTION = "## Tensor parallel"


def _tp_rows(results: Sequence[Result]) -> list[tuple[Result, TPInfo]]:
    return [(r, r.tp) for r in results if r.tp is not None]


def _label(r: Result) -> str:
    return f"{case_label(r)} {r.dtype}"


def _launch(tp: TPInfo) -> str:
    return f"{tp.nproc} proc x {tp.threads_per_process} thr ({tp.launch})"


def _t(t: Timing | None) -> str:
    return "-" if t is None else f"{fmt_s(t.median_s)} ± {fmt_s(t.iqr_s / 2)} (n={t.n})"


def comm_fraction(r: Result, tp: TPInfo) -> float | None:
    """The share of the step its collectives take when run alone at the same sizes: comm alone / step."""
    if r.timing is None or tp.comm is None:
        return None
    return tp.comm.median_s / r.timing.median_s


def in_step_comm(r: Result, tp: TPInfo) -> str:
    """What the step spent beyond its compute alone (communication, waiting and the overlap lost): step - compute,
    a number only where the step is significantly slower than its compute alone (``compare.timing.significance``)."""
    if r.timing is None or tp.compute is None:
        return "-"
    v = compare_timing(tp.compute, r.timing)
    if not v.significant:
        return v.said("")
    if v.verdict == FASTER:
        return "none: the step beat its compute alone"
    return fmt_s(r.timing.median_s - tp.compute.median_s)


def _collectives(tp: TPInfo) -> str:
    if not tp.collectives:
        return "none"
    return "; ".join(f"{c.count} {c.kind}, {c.bytes:,} B ({c.source})" for c in tp.collectives)


def issued(tp: TPInfo) -> dict[str, tuple[int, int]]:
    """The collectives one step issued, per kind: ``(calls, payload bytes)``; a kind it did not call is left out."""
    out: dict[str, tuple[int, int]] = {}
    for c in tp.collectives:
        if c.count or c.bytes:
            n, b = out.get(c.kind, (0, 0))
            out[c.kind] = (n + c.count, b + c.bytes)
    return out


def modelled(comm_model: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The collectives the communication model plans for the step (``compare.cost.comm.CommCost``'s dict), in the
    form of :func:`issued`: its ``ops`` calls of its ``kind`` (all-reduce where an older record names none)."""
    ops, payload = int(comm_model["ops"]), int(comm_model["payload_bytes"])
    return {str(comm_model.get("kind", "all-reduce")): (ops, payload)} if ops or payload else {}


def _spell(kinds: dict[str, tuple[int, int]]) -> str:
    return " + ".join(f"{n} {kind} ({b:,} B)" for kind, (n, b) in kinds.items()) or "none"


def model_check(tp: TPInfo) -> str:
    """``= model`` when the step issued what the communication model plans (``compare.cost.comm``): the same kinds of
    collective, each called as many times and moving as many bytes. Else both, spelled out, and what differs
    (``kinds``, ``counts``, ``bytes``): the same total bytes in other kinds or other calls is not the model."""
    if tp.comm_model is None:
        return "not modelled"
    got, want = issued(tp), modelled(tp.comm_model)
    if got == want:
        return "= model"
    common = set(got) & set(want)
    differ = [
        what
        for what, yes in (
            ("kinds", set(got) != set(want)),
            ("counts", any(got[k][0] != want[k][0] for k in common)),
            ("bytes", any(got[k][1] != want[k][1] for k in common)),
        )
        if yes
    ]
    return f"**{_spell(got)} != model {_spell(want)}** (differs in {', '.join(differ)})"


def tp_section(results: Sequence[Result]) -> str:
    rows = _tp_rows(results)
    if not rows:
        return ""
    body = [
        [
            r.backend,
            _label(r),
            r.mode,
            str(tp.world_size),
            _launch(tp),
            r.status + (f" ({tp.ranks_checked} device copies checked)" if r.parity is not None else ""),
            _t(r.timing),
            _t(tp.comm),
            _t(tp.compute),
            "-" if (share := comm_fraction(r, tp)) is None else f"{100 * share:.1f}%",
        ]
        for r, tp in rows
    ]
    header = ["backend", "case", "mode", "p", "launch", "parity", "step", "collectives alone", "compute alone"]
    parts = [
        SECTION,
        "Megatron layout: gate/up (fc1) split by columns, down (fc2) by rows, one all-reduce of `[tokens, dim]` "
        "per forward and one per backward. Every rank's output and gradients are checked against the same float64 "
        "golden with the same gate, every device's copy of them when one process holds several devices (*parity* "
        "counts the copies checked); each timing sample is the slowest rank's (every block ends with a barrier). "
        "*comm share* = the step's collectives alone / the step.",
        table([*header, "comm share"], body),
        "### Collectives per step",
        "Counted by each backend from its framework (`CommDebugMode` or compiled graphs for torch, the compiled HLO "
        "for JAX) and checked against the communication model (`compare/cost/comm.py`; *check* says whether the "
        "step issued the model's collectives: the same kinds, each as many calls moving as many bytes). Ring "
        "traffic per rank is `2 (p-1)/p x payload`; "
        "*bandwidth* is that traffic over the time of a 16 MiB all-reduce in the same group (the transport's "
        "bus bandwidth); *predicted* is the step's modelled ring traffic at that bandwidth (no latency term: "
        "small payloads take longer); *alone* is the step's collectives run alone at their sizes; *in step* is "
        "the step minus its compute alone.",
        table(
            ["backend", "case", "mode", "p", "issued", "model", "check", "bandwidth", "predicted", "alone", "in step"],
            [_comm_row(r, tp) for r, tp in rows],
        ),
    ]
    return "\n\n".join(x for x in (*parts, scaling_section(results), setup_section(rows)) if x)


def probe_rate(tp: TPInfo) -> float | None:
    """The group's all-reduce bus bandwidth (ring bytes per rank per second) from its 16 MiB probe, or None."""
    b = tp.bandwidth
    if not b or "bus_bytes_per_s" not in b:
        return None
    return float(b["bus_bytes_per_s"])


def _comm_row(r: Result, tp: TPInfo) -> list[str]:
    m = tp.comm_model
    model = "-" if m is None else f"{m['ops']} {m.get('kind', 'all-reduce')}, {int(m['payload_bytes']):,} B"
    rate = probe_rate(tp)
    bw = "-" if rate is None else f"{rate / 1e9:.2f} GB/s"
    if tp.bandwidth and "error" in tp.bandwidth:
        bw = f"probe failed: {tp.bandwidth['error']}"
    predicted = "-" if m is None or rate is None else fmt_s(m["ring_bytes_per_rank"] / rate)
    return [
        r.backend,
        _label(r),
        r.mode,
        str(tp.world_size),
        _collectives(tp),
        model,
        model_check(tp),
        bw,
        predicted,
        "-" if tp.comm is None else fmt_s(tp.comm.median_s),
        in_step_comm(r, tp),
    ]


def scaling_section(results: Sequence[Result]) -> str:
    """World size p against world size 1 of the same backend, case, dtype and mode."""
    by_key: dict[tuple[str, str, str], dict[int, tuple[Result, TPInfo]]] = {}
    for r, tp in _tp_rows(results):
        if r.timing is not None:
            by_key.setdefault((r.backend, r.case, r.mode), {})[tp.world_size] = (r, tp)
    body = []
    for (backend, _, mode), sizes in by_key.items():
        if 1 not in sizes:
            continue
        base, base_tp = sizes[1]
        assert base.timing is not None
        for p, (r, tp) in sorted(sizes.items()):
            if p == 1:
                continue
            assert r.timing is not None
            ratio, v = speedup(base.timing, r.timing)
            total1 = base_tp.nproc * base_tp.threads_per_process
            totalp = tp.nproc * tp.threads_per_process
            fair = "fair: same total threads" if total1 == totalp else f"unfair: {total1} vs {totalp} threads"
            if tp.nproc > totalp:
                fair = "time-slicing: more ranks than CPUs"
            figure = v.said(f"{ratio:.2f}x")
            body.append([backend, _label(r), mode, f"1 ({_launch(base_tp)})", f"{p} ({_launch(tp)})", figure, fair])
    if not body:
        return ""
    return "\n\n".join(
        [
            "### Scaling",
            "World size p against 1 of the same backend at the same total thread count (speed-up = time at 1 / "
            "time at p, significance as everywhere in this report). On a machine with fewer CPUs than ranks x "
            "threads this measures time-slicing, not scaling.",
            table(["backend", "case", "mode", "world size 1", "world size p", "speed-up", "pair"], body),
        ]
    )


def setup_section(rows: Sequence[tuple[Result, TPInfo]]) -> str:
    keys = list(dict.fromkeys(k for _, tp in rows for k in tp.setup_s))
    body = [
        [r.backend, _label(r), r.mode, str(tp.world_size)]
        + [fmt_s(tp.setup_s.get(k)) for k in keys]
        + [fmt_s(r.timing.first_call_s) if r.timing else "-"]
        for r, tp in rows
    ]
    return "\n\n".join(
        [
            "### Set-up, apart from the steady state",
            "*launch_to_ready*: process start to every rank in the group (imports, rendezvous; shared by the cells "
            "of one group); *init*: importing the runtime and forming the group; *first call*: the first step "
            "(compile for compiled backends).",
            table(["backend", "case", "mode", "p", *keys, "first call"], body),
        ]
    )
