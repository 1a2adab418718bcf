"""REPORT.md is one page and DETAILS.md holds the rest: every link from REPORT.md into DETAILS.md points at a heading
that is there (by GitHub's anchor rule), every section of DETAILS.md is linked, and a broken link is caught."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from compare.formats.codec import from_json
from compare.report.render import DETAILS, REPORT, anchors, files, slug
from compare.results.document import Results

pytestmark = pytest.mark.quick

CPU = Path(__file__).resolve().parents[1] / "reports" / "cpu"


def _broken(report: str, details: str) -> list[str]:
    there = anchors(details)
    return [a for a in re.findall(rf"\]\({re.escape(DETAILS)}#([^)]+)\)", report) if a not in there]


def test_slug_is_githubs_anchor() -> None:
    assert slug("What a pass means: the gate's resolution") == "what-a-pass-means-the-gates-resolution"
    assert slug("Skipped, failed and implausible") == "skipped-failed-and-implausible"
    assert slug("### sm_90: H100/H200 (Hopper)".lstrip("# ")) == "sm_90-h100h200-hopper"
    assert anchors("## A\n\n## A\n") == {"a", "a-1"}


def test_every_link_resolves_and_every_section_is_linked_and_the_page_is_short() -> None:
    doc = from_json(Results, json.loads((CPU / "results.json").read_text(encoding="utf-8")))
    out = files(doc)
    report, details = out[REPORT], out[DETAILS]
    assert len(report.splitlines()) < 150 and len(report.encode()) < 15_000
    assert re.findall(rf"\]\({re.escape(DETAILS)}#", report) and _broken(report, details) == []
    linked = set(re.findall(rf"\]\({re.escape(DETAILS)}#([^)]+)\)", report))
    assert {slug(x[3:]) for x in details.splitlines() if x.startswith("## ")} <= linked
    assert "GPU build (compiled" not in details  # a CPU run's report holds no GPU build table
    # a planted broken link is caught
    assert _broken(report + f"\n[x]({DETAILS}#no-such-section)\n", details) == ["no-such-section"]


def test_a_machine_whose_core_count_is_unknown_shows_the_cpu_alone() -> None:
    """``os.cpu_count()`` may return None: the machine line then names the CPU without "(None logical cores)"."""
    doc = from_json(Results, json.loads((CPU / "results.json").read_text(encoding="utf-8")))
    known = files(doc)[REPORT]
    assert f"({doc.environment.cpu_count} logical cores)" in known  # the control: a known count is shown
    unknown = replace(doc, environment=replace(doc.environment, cpu_count=None))
    text = "\n".join(files(unknown).values())
    assert "None logical cores" not in text and doc.environment.cpu in text
