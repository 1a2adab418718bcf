"""Record the answers of the hand-written rank tests of ``compare.timing.significance`` before scipy replaces them.

Run from the repository root: ``python tests/data/record_significance.py``. It writes
``tests/data/significance_before_scipy.json``:

- ``records``: timing records by id (``median_s``, ``iqr_s``, ``samples_s`` and, for an interleaved one, ``design``,
  ``group`` and ``rounds``): every record with at least two samples in the committed reports (``reports/**/*.json``
  and ``*.jsonl``, deduplicated), and synthetic ones (seeded; with and without ties, small and large, paired and
  unpaired);
- ``pairs``: ``compare_timing(old, new)`` of pairs of them: its p-values, verdict, design and rounds;
- ``direct``: ``mann_whitney_greater`` and ``signed_rank_greater`` on small hand-made vectors (ties, zeros).
"""

from __future__ import annotations

import glob
import json
import math
import random
import re
from pathlib import Path
from typing import Any

from compare.timing.significance import compare_timing, mann_whitney_greater, signed_rank_greater
from compare.timing.timer import quartiles

OUT = Path("tests/data/significance_before_scipy.json")
KEEP = ("median_s", "iqr_s", "samples_s", "design", "group", "rounds")


def _walk(o: Any, path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    if isinstance(o, dict):
        if "median_s" in o:
            out.append((path, o))
            return
        for k, v in o.items():
            _walk(v, f"{path}/{k}", out)
    elif isinstance(o, list):
        for i, v in enumerate(o):
            _walk(v, f"{path}[{i}]", out)


def _slim(t: dict[str, Any]) -> dict[str, Any]:
    r = {k: t[k] for k in KEEP if k in t}
    if r.get("design") != "interleaved":  # only an interleaved record's group and rounds pair it
        for k in ("design", "group", "rounds"):
            r.pop(k, None)
    return r


def committed() -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """Records with samples in the committed reports, and the pairs the reports could compare: records under the
    same key (``/results[]/timing`` with ``/results[]/timing``, ...) and, per result, its timing against its cold
    timing and its tensor-parallel compute."""
    records: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}  # content -> id
    pairs: list[tuple[str, str]] = []
    files = sorted(glob.glob("reports/**/*.json", recursive=True) + glob.glob("reports/**/*.jsonl", recursive=True))
    for f in files:
        text = Path(f).read_text()
        docs = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if f.endswith(".jsonl")
            else [json.loads(text)]
        )
        found: list[tuple[str, dict[str, Any]]] = []
        for i, doc in enumerate(docs):
            _walk(doc, f"#{i}", found)
        by_path: dict[str, str] = {}
        for path, t in found:
            if len(t.get("samples_s", [])) < 2:
                continue
            slim = _slim(t)
            key = json.dumps(slim, sort_keys=True)
            if key not in ids:
                ids[key] = f"r{len(ids)}"
                records[ids[key]] = slim | {"source": f"{f}:{path}"}
            by_path[path] = ids[key]
        by_key: dict[str, list[str]] = {}
        for path, rid in by_path.items():
            by_key.setdefault(re.sub(r"\[\d+\]", "[]", path), []).append(rid)
        for group in by_key.values():
            pairs += [(a, b) for i, a in enumerate(group) for b in group[i + 1 :]]
        for path, rid in by_path.items():
            if path.endswith("/timing"):
                stem = path[: -len("/timing")]
                pairs += [(rid, by_path[o]) for o in (f"{stem}/cold", f"{stem}/tp/compute") if o in by_path]
    seen: set[tuple[str, str]] = set()
    unique = [p for p in pairs if p[0] != p[1] and not (p in seen or seen.add(p))]
    return records, unique


def _contiguous(samples: list[float]) -> dict[str, Any]:
    """A one-window timing record of ``samples`` (median and IQR as the timer computes them)."""
    q1, med, q3 = quartiles(sorted(samples))
    return {"median_s": med, "iqr_s": q3 - q1, "samples_s": samples}


def synthetic() -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """Seeded sample sets around 1 ms: unpaired (contiguous) pairs of sizes on both sides of the exact limit, with
    and without ties (rounded to 10 us), and interleaved pairs of 7 to 100 rounds with drift, with and without ties
    among the log differences (samples drawn from a few values: tied |d| and zero d)."""
    rng = random.Random(20240611)
    records: dict[str, dict[str, Any]] = {}
    pairs: list[tuple[str, str]] = []

    def draw(n: int, scale: float, tie: bool) -> list[float]:
        while True:  # to the ns (short in JSON); without ties, distinct values
            xs = [round(1e-3 * scale * math.exp(rng.gauss(0.0, 0.02)), 5 if tie else 9) for _ in range(n)]
            if tie or len(set(xs)) == n:
                return xs

    for m, n in ((5, 5), (5, 8), (8, 12), (12, 12), (20, 20), (20, 21), (10, 30), (40, 40), (100, 100)):
        for effect in (0.8, 1.0, 1.02, 1.25) if n <= 30 else (1.0, 1.02):  # large: one formula, fewer cases
            for tie in (False, True):
                a = f"u{m}x{n}*{effect}{'t' if tie else ''}"
                records[a + "/old"] = _contiguous(draw(m, 1.0, tie))
                records[a + "/new"] = _contiguous(draw(n, effect, tie))
                pairs.append((a + "/old", a + "/new"))
    records["u-equal/old"] = _contiguous([1e-3] * 6)
    records["u-equal/new"] = _contiguous([1e-3] * 7)
    pairs.append(("u-equal/old", "u-equal/new"))

    for n in (7, 8, 10, 16, 22, 40, 100):
        for effect in (0.9, 1.0, 1.02, 1.1) if n <= 40 else (1.0, 1.02):
            for tie in (False, True):
                a = f"p{n}*{effect}{'t' if tie else ''}"
                drift = [1 + 0.1 * r / n for r in range(n)]  # the load slows both sides alike over the rounds
                if tie:  # a few values: many tied |d| and some d = 0
                    old = [round(1e-3 * rng.choice((1.0, 1.01, 1.02)), 9) for _ in range(n)]
                    new = [round(x * rng.choice((1.0, effect, effect * 1.01)), 9) for x in old]
                else:
                    old = [round(1e-3 * w * math.exp(rng.gauss(0.0, 0.02)), 9) for w in drift]
                    new = [round(x * effect * math.exp(rng.gauss(0.0, 0.02)), 9) for x in old]
                for side, xs in (("old", old), ("new", new)):
                    rec = _contiguous(xs)
                    rec.update(design="interleaved", group=a, rounds=list(range(n)))
                    records[f"{a}/{side}"] = rec
                pairs.append((a + "/old", a + "/new"))
    return records, pairs


DIRECT_SIGNED = (
    [1.0] * 8,
    [-1.0] * 8,
    [0.1, 0.2, 0.3, -0.4],
    [0.0, 0.0],
    [1, 1, 2, 2, 2, -3, 4, 4, 0, 5],
    [1, -1, 2, 2, 3, 3, 3, -4, 5, 5, 6, 0, 0, 7, 7, 8, -8, 9, 9, 10],
    [((i * 7) % 11) - 3 for i in range(30)],
    [((i * 5) % 13) - 4 + 0.5 for i in range(60)],
)
DIRECT_MW = (
    ([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]),
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]),
    ([1, 2, 2, 3, 4], [2, 3, 3, 4, 5, 5]),
    ([3, 3, 3, 3, 3], [3, 3, 3, 3, 3]),
    ([((i * 7) % 11) for i in range(25)], [((i * 5) % 13) for i in range(25)]),
)


def main() -> None:
    records, pairs = committed()
    syn_records, syn_pairs = synthetic()
    records.update(syn_records)
    out_pairs = []
    for a, b in pairs + syn_pairs:
        v = compare_timing(records[a], records[b])
        out_pairs.append(
            {"old": a, "new": b, "p_slower": v.p_slower, "p_faster": v.p_faster, "verdict": v.verdict}
            | {"design": v.design, "pairs": v.pairs}
        )
    direct = [
        {"test": "signed_rank", "d": d, "w": w, "p": p} for d in DIRECT_SIGNED for w, p in [signed_rank_greater(d)]
    ]
    direct += [
        {"test": "mann_whitney", "x": x, "y": y, "u": u, "p": p}
        for x, y in DIRECT_MW
        for u, p in [mann_whitney_greater(x, y)]
    ]
    # one record, pair or vector a line: a reviewable diff
    lines = ["{", '"records": {']
    lines += [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in records.items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["},", '"pairs": [']
    lines += [json.dumps(p) + "," for p in out_pairs]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["],", '"direct": [']
    lines += [json.dumps(d) + "," for d in direct]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["]", "}"]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{OUT}: {len(records)} records, {len(out_pairs)} pairs, {len(direct)} direct")


if __name__ == "__main__":
    main()
