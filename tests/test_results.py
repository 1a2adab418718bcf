"""The typed results document: every record reads back what it wrote (``from_json(type(x), to_json(x))``) on a real
run's ``results.json``, the committed report rebuilds from it unchanged, and a broken file is refused naming the file
and the field's path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compare.backends.tp import Collective
from compare.cost.records import Achieved, Ceiling, Ceilings, CeilingTimings, Cost, CostTensor
from compare.formats.codec import from_json, to_json
from compare.gate.parity import TensorParity
from compare.gate.parity_record import LastTimed, ParityRecord, ProcessVerdict
from compare.gate.resolution import ResolutionRow
from compare.kernels.summary import KernelEntry, Kernels, MetadataOp
from compare.problem.cases import InputError
from compare.report import render
from compare.results.document import SCHEMA_VERSION, Config, Progress, Result, Results, read_json
from compare.results.environment import Environment
from compare.results.tp import TPInfo
from compare.timing.timer import Timing, TimingConfig

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "reports" / "cpu"


def _json(x: Any) -> str:
    """Canonical text of JSON data (NaN-safe equality: NaN != NaN as a float, "NaN" == "NaN" as text)."""
    return json.dumps(x, sort_keys=True, allow_nan=True)


def _raw() -> dict[str, Any]:
    return json.loads((CPU / "results.json").read_text(encoding="utf-8"))


def test_the_committed_run_reads_back_exactly() -> None:
    raw = _raw()
    doc = read_json(CPU / "results.json")
    assert isinstance(doc, Results) and doc.schema_version == SCHEMA_VERSION
    assert json.dumps(to_json(doc), allow_nan=True) == json.dumps(raw, allow_nan=True)  # same keys, same order
    assert from_json(Results, to_json(doc)) == doc


def _round_trips(cls: type, items: list[Any]) -> None:
    assert items, "nothing of this type in the document"
    for x in items:
        again = from_json(cls, to_json(x))
        assert type(again) is type(x) and _json(to_json(again)) == _json(to_json(x)), x


def test_every_record_of_a_real_run_round_trips() -> None:
    doc = read_json(CPU / "results.json")
    rs = doc.results
    parities = [r.parity for r in rs if r.parity is not None]
    kernels = [r.kernels for r in rs if r.kernels is not None]
    costs = [r.cost for r in rs if r.cost is not None]
    assert doc.ceilings is not None
    ceilings = list(doc.ceilings.by_dtype.values())
    cases: list[tuple[type, list[Any]]] = [
        (Result, list(rs)),
        (Timing, [r.timing for r in rs if r.timing is not None]),
        (ParityRecord, parities),
        (TensorParity, [t for p in parities for t in p.tensors]),
        # an older document's verdict on the last timed call (no run writes it now)
        (LastTimed, [LastTimed(False, ("y: max abs error 3 at [0, 0, 0]",), "fail")]),
        (Kernels, kernels),
        (KernelEntry, [k for s in kernels for k in s.kernels]),
        (MetadataOp, [m for s in kernels for m in s.metadata_ops]),
        (Cost, costs),
        (CostTensor, [t for c in costs for t in c.tensors]),
        (Achieved, [c.achieved for c in costs if c.achieved is not None]),
        (Ceilings, [doc.ceilings]),
        (Ceiling, ceilings),
        (CeilingTimings, [c.timing for c in ceilings if c.timing is not None]),
        (ResolutionRow, list(doc.resolution)),
        (Environment, [doc.environment]),
        (Config, [doc.config]),
        (TimingConfig, [doc.config.timing]),
        (Results, [doc]),
    ]
    for cls, items in cases:
        _round_trips(cls, items)
    # the raw JSON of each part is what its record writes, so nothing is dropped or invented on the way
    raw = _raw()
    for r, d in zip(rs, raw["results"], strict=True):
        assert _json(to_json(r)) == _json(d)
        if r.timing is not None:
            assert r.timing.noisy == d["timing"]["noisy"]  # derived, and agrees with what was written


def test_the_committed_report_rebuilds_unchanged() -> None:
    doc = read_json(CPU / "results.json")
    for name, text in render.files(doc).items():
        assert text == (CPU / name).read_text(encoding="utf-8"), name


def _tp_result() -> Result:
    base = read_json(CPU / "results.json").results[0]
    assert base.timing is not None
    tp = TPInfo(
        world_size=2,
        nproc=2,
        launch="processes",
        threads_per_process=1,
        transport="gloo",
        layout="megatron: gate/up by columns, down by rows",
        collectives=(Collective("all-reduce", 1, 4096, "CommDebugMode", "y"),),
        comm=base.timing,
        compute=base.timing,
        setup_s={"launch_to_ready": 1.5, "weights": 0.25},
        ranks_checked=2,
    )
    parity = base.parity
    assert parity is not None
    parity = from_json(ParityRecord, {**to_json(parity), "processes": [{"rank": 0, "passed": True, "tier": "pass"}]})
    return from_json(Result, {**to_json(base), "world_size": 2, "tp": to_json(tp), "parity": to_json(parity)})


def test_tensor_parallel_fields_round_trip_and_stay_optional() -> None:
    r = _tp_result()
    assert r.world_size == 2 and r.tp is not None and r.tp.collectives[0].kind == "all-reduce"
    assert r.parity is not None and r.parity.processes == (ProcessVerdict(0, True),)
    _round_trips(Result, [r])
    _round_trips(TPInfo, [r.tp])
    _round_trips(ProcessVerdict, list(r.parity.processes))
    c = r.tp.collectives[0]
    assert from_json(Collective, to_json(c)) == c
    single = to_json(read_json(CPU / "results.json").results[0])
    assert not {"world_size", "tp"} & set(single) and "processes" not in single["parity"]  # layout of version 2


def test_a_sweep_config_round_trips() -> None:
    config = Config(
        command="python -m compare sweep --preset tiny",
        preset="tiny",
        backends=("torch-eager",),
        dtypes=("float32",),
        modes=("fwd",),
        timing=TimingConfig(budget_s=0.02),
        grid={"model": "geglu", "dim": 96, "hidden": 328, "seq": 1, "tokens": [1, 2], "dist": "normal", "seed": 0},
        progress=Progress(cells=2, done=1, sessions=1),
        world_sizes=(1, 2),
    )
    _round_trips(Config, [config])
    _round_trips(Progress, [config.progress])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r["timing"].update(n="11"), "results[0].timing.n: is a str, not an integer"),
        (
            lambda r: r["parity"]["tensors"][0].pop("why"),
            "results[0].parity.tensors[0].why: is missing",
        ),
        (
            lambda r: r["kernels"].update(kernels={}),
            "results[0].kernels.kernels: is a dict, not a list",
        ),
        (lambda r: r["cost"].pop("flops"), "results[0].cost.flops: is missing"),
        (lambda r: r["cost"]["achieved"].update(bound=1), "results[0].cost.achieved.bound: is an int, not a string"),
        (lambda r: r.update(extras=[]), "results[0].extras: is a list, not an object"),
    ],
)
def test_a_foreign_field_is_refused_naming_file_row_and_field(edit: Any, message: str, tmp_path: Path) -> None:
    raw = _raw()
    edit(raw["results"][0])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_json(path)
    assert str(e.value).startswith(f"results file {path}: ") and message in str(e.value), str(e.value)


def test_a_foreign_document_part_is_refused(tmp_path: Path) -> None:
    for key, value, message in (
        ("resolution", [{"case": "c"}], "resolution[0].model: is missing"),
        ("ceilings", {"device": "cpu", "float32": [1]}, "ceilings.float32: is a list, not an object"),
        ("config", {"backends": "torch-eager"}, "config.backends: is a str, not a list"),
        ("environment", {"versions": {}, "cpu_count": "2"}, "environment.cpu_count: is a str, not an integer"),
    ):
        raw = copy.deepcopy(_raw())
        raw[key] = value
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(raw), encoding="utf-8")
        with pytest.raises(InputError, match=f"results file {path}: ") as e:
            read_json(path)
        assert message in str(e.value), str(e.value)


def test_an_old_file_is_refused_not_a_key_error(tmp_path: Path) -> None:
    raw = _raw()
    raw.pop("schema_version")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(InputError, match="no schema_version \\(an older fusion-compare wrote it\\)"):
        read_json(path)
