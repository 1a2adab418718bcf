"""The rank tests of ``compare.timing.significance`` are scipy's; they answer as the hand-written ones they replaced.

``tests/data/significance_before_scipy.json`` holds what the hand-written exact distributions and normal
approximation answered, recorded before the change by a script committed with the fixture and removed with them
(rerun now, it would record scipy's answers): ``compare_timing`` on every pair of comparable timing records with
samples in the committed reports and on seeded synthetic pairs (paired and unpaired, with and without ties, 5 to 100
samples a side), and the two tests on hand-made vectors. Verdicts, designs and rounds must be equal; p-values equal
to a relative 1e-9, except:

- far tails: scipy's exact signed-rank tail above the mean is one minus the sum of the rest, so a p below about
  1e-14 agrees only to an absolute 1e-14 (the hand-written one summed integer counts). No verdict is near there;
- tied ``|d|`` with both signs (the paired test): the hand-written test used the exact distribution of the sign
  flips of the mid-ranks; ``scipy.stats.wilcoxon(method="exact")`` uses the tie-free distribution with W+ rounded
  down. By design those p-values differ; in the recorded cases scipy's is larger by at most 25%.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compare.formats.codec import from_json
from compare.timing.significance import (
    EXACT_MAX,
    FASTER,
    NOT_TESTED,
    PAIRED,
    SLOWER,
    UNPAIRED,
    WITHIN_NOISE,
    compare_timing,
    mann_whitney_greater,
    paired_differences,
    signed_rank_greater,
)
from compare.timing.timer import Timing

pytestmark = pytest.mark.standard

FIXTURE = Path(__file__).parent / "data" / "significance_before_scipy.json"
REL, ABS = 1e-9, 1e-14


def _fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _tied_mixed(d: list[float]) -> bool:
    """Tied ``|d|`` among the non-zero differences, of both signs: where scipy's exact test differs by design."""
    nz = [x for x in d if x != 0]
    return len({abs(x) for x in nz}) < len(nz) and min(nz) < 0 < max(nz)


def _same_p(got: float | None, want: float | None, d: list[float] | None = None) -> bool:
    if got is None or want is None:
        return got is want
    if d is not None and _tied_mixed(d):
        return want <= got <= 1.25 * want
    return got == pytest.approx(want, rel=REL, abs=ABS)


#: Verdicts the paired band changed since the record: it was the two sides' spreads, now the IQR of the rounds' log
#: ratios. On these two synthetic pairs of quantized samples (ratios 0.909 and 1.095, 40 rounds) that IQR is one
#: quantum, 10.5%, where the sides' spreads made 10% and 9.4%: both calls were within a hair of the band and are now
#: inside it. Their p-values are still the recorded ones.
BAND_CHANGED = {"p40*0.9t/old": WITHIN_NOISE, "p40*1.1t/old": WITHIN_NOISE}


def test_verdicts_and_p_values_are_the_hand_written_ones() -> None:
    doc = _fixture()
    records, wrong = doc["records"], []
    for p in doc["pairs"]:
        old, new = records[p["old"]], records[p["new"]]
        v = compare_timing(old, new)
        d = paired_differences(from_json(Timing, old), from_json(Timing, new))
        got = (v.verdict, v.design, v.pairs)
        if got != (BAND_CHANGED.get(p["old"], p["verdict"]), p["design"], p["pairs"]):
            wrong.append(f"{p['old']} -> {p['new']}: {got}, was {p['verdict'], p['design'], p['pairs']}")
        for side in ("p_slower", "p_faster"):
            if not _same_p(getattr(v, side), p[side], d):
                wrong.append(f"{p['old']} -> {p['new']}: {side} {getattr(v, side)}, was {p[side]}")
    assert not wrong, "\n".join(wrong[:20])


def test_the_rank_tests_on_hand_made_vectors() -> None:
    wrong, by_design = [], 0
    for e in _fixture()["direct"]:
        if e["test"] == "signed_rank":
            (stat, p), want = signed_rank_greater(e["d"]), (e["w"], e["p"])
            by_design += _tied_mixed(e["d"])
            ok = _same_p(p, want[1], e["d"])
        else:
            (stat, p), want = mann_whitney_greater(e["x"], e["y"]), (e["u"], e["p"])
            ok = _same_p(p, want[1])
        if stat != want[0] or not ok:
            wrong.append(f"{e}: got {stat}, {p}")
    assert not wrong, "\n".join(wrong)
    assert by_design == 4  # tied with mixed signs: p up to 25% larger by design (one comes out equal); others exact


def test_the_fixture_covers_every_verdict_design_and_method() -> None:
    doc = _fixture()
    records, pairs = doc["records"], doc["pairs"]
    assert {(p["design"], p["verdict"]) for p in pairs} >= {
        *((d, v) for d in (PAIRED, UNPAIRED) for v in (SLOWER, FASTER, WITHIN_NOISE)),
        (PAIRED, NOT_TESTED),
    }
    unpaired = [(records[p["old"]]["samples_s"], records[p["new"]]["samples_s"]) for p in pairs if p["pairs"] is None]
    small = [max(len(a), len(b)) <= EXACT_MAX for a, b in unpaired]
    tied = [len({*a, *b}) < len(a) + len(b) for a, b in unpaired]
    # Mann-Whitney's exact branch (small, tie-free) and asymptotic one (large, or ties), both on report records too
    assert any(s and not t for s, t in zip(small, tied, strict=True)) and not all(small) and any(tied)
    assert sum(p["old"].startswith("r") for p in pairs) > 400  # the committed reports' pairs
