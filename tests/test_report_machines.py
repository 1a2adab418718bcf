"""The report on rows from several machines (a sweep on a cluster: every row carries its node): timings grouped by
machine type, never a speedup or a fusion saving across two types, parity said to compare across machines, the
machines listed in the summary; rows of one machine type render as before, with the machines line added. Built on
the committed ``reports/cpu/results.json``, its rows given hand-made nodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compare.formats.codec import from_json, to_json
from compare.report import render
from compare.report.cost import fusion_benefit
from compare.report.summary import speedup_cell
from compare.results.document import Results, read_json
from compare.results.environment import Node, node
from compare.timing.nvml import driver_version
from tests.fake_nvml import FakePynvml

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
A = Node(host="a1", cpu="Xeon A", cpu_isa=("avx2", "fma"), node_id="n-a")
B = Node(host="b1", cpu="EPYC B", cpu_isa=("avx2",), gpu="NVIDIA H200 (CUDA 13.0)", driver="580.1", node_id="n-b")


def _doc() -> Results:
    return read_json(ROOT / "reports" / "cpu" / "results.json")


def _on(doc: Results, on_b: set[str]) -> Results:
    """Every row on node A, those of the backends in ``on_b`` on node B."""
    rows = tuple(dataclasses.replace(r, node=B if r.backend in on_b else A) for r in doc.results)
    return dataclasses.replace(doc, results=rows)


def test_one_machine_type_renders_as_before_with_the_machines_listed() -> None:
    doc = _doc()
    plain, labelled = render.render(doc), render.render(_on(doc, set()))
    line = next(x for x in labelled.splitlines() if x.startswith("Machines: "))
    assert line == f"Machines: 1 machine type: {A.machine_type()} (host a1, 1 Ray node(s); {len(doc.results)} row(s))."
    assert labelled.replace(line + "\n\n", "") == plain
    assert "Machines:" not in plain  # a run's rows name no node: nothing to list


def test_two_machine_types_group_the_timings_and_compare_nothing_across_them() -> None:
    doc = _on(_doc(), {"jax-xla", "jax-unfused"})
    text = "".join(render.files(doc).values())
    assert f"### On {A.machine_type()}" in text and f"### On {B.machine_type()}" in text
    assert "Machines: 2 machine types: " in text and "driver 580.1" in text
    assert "parity is judged against the same float64 golden" in text and "verdicts compare across machines" in text
    by = {(r.backend, r.dtype): r for r in doc.results}
    jax_xla, compile_ = by[("jax-xla", "float32")], by[("torch-compile", "float32")]
    assert speedup_cell(doc.results, jax_xla) == "-"  # its baseline, torch-eager, ran on the other machine type
    assert speedup_cell(doc.results, compile_) not in ("-", "baseline")  # the control: same type, compared
    same = _on(_doc(), set())
    same_xla = next(r for r in same.results if (r.backend, r.dtype) == ("jax-xla", "float32"))
    assert speedup_cell(same.results, same_xla) != "-"  # the control of the control: one machine, compared
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert f"on {A.machine_type()}, " in summary and f"on {B.machine_type()}, " in summary
    # a fusion saving needs its baseline on the same machine type: jax-xla's and jax-unfused's both on B, kept
    xla_rows = [f for f in fusion_benefit(same) if f["backend"] == "jax-xla"]
    assert xla_rows and [f for f in fusion_benefit(doc) if f["backend"] == "jax-xla"] == xla_rows
    mixed = _on(_doc(), {"jax-unfused"})
    assert not [f for f in fusion_benefit(mixed) if f["backend"] == "jax-xla"], "a saving across two machine types"


def test_a_node_record_names_this_machine_and_round_trips() -> None:
    here = node("n-1")
    assert here.host and here.cpu and here.node_id == "n-1" and here.versions["numpy"]
    assert from_json(Node, to_json(here)) == here and from_json(Node, to_json(B)) == B
    assert A.machine_type() != B.machine_type() and A.machine_type() == dataclasses.replace(A, host="a2").machine_type()


def test_the_gpu_driver_version_is_read_through_nvml_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakePynvml(driver="580.95.05").install(monkeypatch)
    assert driver_version() == "580.95.05"
    assert nvml.log == ["nvmlInit", "nvmlSystemGetDriverVersion", "nvmlShutdown"]
    FakePynvml(codes={"nvmlSystemGetDriverVersion": 3}).install(monkeypatch)
    assert driver_version() is None
    FakePynvml(missing=["nvmlSystemGetDriverVersion"]).install(monkeypatch)
    assert driver_version() is None
    FakePynvml(codes={"nvmlInit": 12}).install(monkeypatch)  # NVML_ERROR_LIBRARY_NOT_FOUND: no driver
    assert driver_version() is None
