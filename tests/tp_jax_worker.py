"""A worker for ``tests/test_tp_jax.py``: ``python -m tests.tp_jax_worker JOB.json RANK``.

Joins the group of the job's launch through ``jax_impl.tp_runtime`` (first, before anything touches JAX), then for
each cell prepares the backend on the golden problem and records, per process: the gate's verdict on the step's
output, the collectives counted from the compiled HLO, and the gate's verdict on the compute-only twin's output
(process-local partials: rank 0's partial ``y``/``dx`` in place of the sum, which must fail). Process 0 writes every
process's records as JSON to the job's ``out`` file.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()

from compare.tp import Launch  # noqa: E402  (the clock above starts before any import)
from jax_impl import tp_runtime  # noqa: E402

#: The backends' modules (as their registry lines name them).
TARGETS = {"jax-tp": "jax_impl.backends.tp_sharded", "jax-tp-shardmap": "jax_impl.backends.tp_shardmap"}


def _partials(mode: str, out: Any) -> dict[str, Any]:
    """Rank 0's partial ``y`` and ``dx`` from the compute-only twin's ``[world, ...]`` rows."""
    from jax_impl.tp_common import to_host

    if mode == "fwd":
        return {"y": to_host(out)[0]}
    if mode == "bwd":
        return {"dx": to_host(out[1])[0]}
    return {"y": to_host(out[0])[0], "dx": to_host(out[1][1])[0]}


def run_cell(cell: dict[str, Any], group: Any) -> dict[str, Any]:
    from compare.cases import Case, Shape
    from compare.golden import golden_for
    from compare.parity import check_all
    from compare.reference import Arith, compute

    case = Case(cell["model"], Shape(*cell["shape"]), cell["dtype"])
    mode = cell["mode"]
    golden = golden_for(case)
    plain = compute(case.model, golden.x, golden.params, golden.dy, Arith.plain(case.dtype))
    keep = (lambda k: k == "y") if mode == "fwd" else (lambda k: k != "y") if mode == "bwd" else (lambda k: True)
    ref = {k: v for k, v in golden.ref.items() if keep(k)}
    t = time.perf_counter()
    backend = importlib.import_module(TARGETS[cell["backend"]]).BACKEND
    prepared = backend.prepare(golden.problem, mode, group)
    out = prepared.step()
    prepared.sync(out)
    first_s = time.perf_counter() - t
    got = prepared.to_numpy(out)
    parity = check_all(got, ref, plain, case.dtype)
    assert prepared.tp is not None
    twin = _partials(mode, prepared.tp.compute_only())
    wrong = check_all(twin, {k: ref[k] for k in twin}, plain, case.dtype)
    prepared.sync(prepared.tp.comm_only())
    return {
        **cell,
        "rank": group.rank,
        "tensors": sorted(got),
        "shapes_ok": all(got[k].shape == ref[k].shape for k in ref),
        "parity": parity.to_dict(),
        "failed": sorted({t.tensor for t in parity.tensors if not t.passed}),
        "twin_failed": sorted({t.tensor for t in wrong.tensors if not t.passed}),
        "collectives": [c.to_dict() for c in prepared.tp.collectives()],
        "timed": prepared.timed,
        "first_call_s": first_s,
        "layout": prepared.tp.layout,
    }


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    rank = int(argv[1])
    launch = Launch(job["world_size"], job["nproc"], rank, job["how"], port=job["port"], timeout_s=job["timeout_s"])
    group = tp_runtime.init(launch)
    ready_s = time.perf_counter() - T0
    rows = [run_cell(c, group) for c in job["cells"]]
    # the group's own calls, exercised: the slowest start-up, every process's rows on process 0
    slowest = group.max_all([ready_s, float(rank)])
    probe, sync = group.allreduce_probe(1 << 20)
    sync(probe())
    everyone = group.gather({"rank": rank, "rows": rows})
    group.barrier()
    if everyone is not None:
        doc = {"backend": group.backend, "ready_s": slowest[0], "max_rank": slowest[1], "processes": everyone}
        Path(job["out"]).write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
