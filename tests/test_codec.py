"""The records' JSON codec (``compare.formats.codec``): what it writes, what it reads back, what older documents may
lack, and the path and the types a bad value is refused with; every committed results document and run store reads
back and writes the same bytes, and a bad field planted in one is refused naming its path."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from compare.cost.records import Ceilings
from compare.formats.codec import INLINE, LATER, FieldError, Setting, from_json, later, to_json
from compare.gate.resolution import ResolutionRow
from compare.problem.cases import Case, InputError
from compare.results.document import Config, Result, read_json, write_json
from compare.results.environment import Environment
from compare.results.load import Load
from compare.run.store import read_store

pytestmark = pytest.mark.quick


@dataclass(frozen=True)
class Size:
    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.rows <= 0:
            raise ValueError(f"rows must be positive, got {self.rows}")


@dataclass(frozen=True)
class Leaf:
    name: str
    value: float
    flags: tuple[bool, ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class Tree:
    title: str
    size: Size = field(metadata=INLINE)
    leaves: tuple[Leaf, ...]
    pair: tuple[str, int] = ("a", 1)
    by_name: dict[str, Leaf] = field(default_factory=dict)
    settings: dict[str, Setting] = field(default_factory=dict)
    kind: Literal["oak", "elm"] = "oak"
    extra: dict[str, Any] | None = None
    added: int = field(default=0, metadata=LATER)
    added_with: str = field(default="", metadata=later("added"))

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("count",)

    @property
    def count(self) -> int:
        return len(self.leaves)


@dataclass(frozen=True)
class Forest:
    device: str
    trees: dict[str, Tree] = field(default_factory=dict, metadata=INLINE)


@dataclass(frozen=True)
class Partial:
    median: float
    low: float

    @staticmethod
    def json_fill(d: Any) -> dict[str, Any]:
        return {"low": d.get("median")}


TREE = Tree(
    "t",
    Size(2, 3),
    (Leaf("a", 1, (True,)), Leaf("b", math.nan, note="n")),
    by_name={"c": Leaf("c", math.inf)},
    settings={"threads": 2, "tf32": False, "mode": "x", "none": None, "f": 0.5},
    extra={"free": [1, {"x": None}]},
)


def _text(x: Any) -> str:
    return json.dumps(x, allow_nan=True)


def test_a_record_is_written_in_field_order_and_reads_back() -> None:
    d = to_json(TREE)
    assert list(d) == [
        *("title", "rows", "cols", "leaves", "pair", "by_name", "settings", "kind", "extra"),
        "count",  # derived, after the fields; ``added`` holds its default, so it and ``added_with`` are left out
    ]
    assert d["leaves"][0] == {"name": "a", "value": 1, "flags": [True], "note": None}  # an int stays an int
    assert _text(d["leaves"][1]["value"]) == "NaN" and _text(d["by_name"]["c"]["value"]) == "Infinity"
    back = from_json(Tree, json.loads(_text(d)))
    assert _text(to_json(back)) == _text(d) and back.leaves[0].flags == (True,) and back.pair == ("a", 1)
    assert list(to_json(Tree("t", Size(1, 1), (), added=3)))[-3:] == ["added", "added_with", "count"]


def test_an_inline_dict_takes_the_keys_no_field_names() -> None:
    forest = Forest("cpu", {"oak": TREE})
    d = json.loads(_text(to_json(forest)))
    assert list(d) == ["device", "oak"]
    assert _text(to_json(from_json(Forest, d))) == _text(d)
    with pytest.raises(FieldError, match=r"^elm\.leaves\[0\]\.value: is a str, not a number$"):
        from_json(Forest, {**d, "elm": {**d["oak"], "leaves": [{"name": "x", "value": "1"}]}})


def test_what_an_older_document_lacks_takes_its_default() -> None:
    t = from_json(Tree, {"title": "t", "rows": 1, "cols": 1, "leaves": [{"name": "a", "value": 2.5}]})
    assert t == Tree("t", Size(1, 1), (Leaf("a", 2.5),))
    # a collection without a default reads as empty, null for a field with a default as the default
    assert from_json(Tree, {"title": "t", "rows": 1, "cols": 1, "settings": None}).leaves == ()
    assert from_json(Partial, {"median": 2}) == Partial(2, 2)  # a value that follows from the others


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("title"), "title: is missing"),
        (lambda d: d.update(title=None), "title: is null, not a string"),
        (lambda d: d.update(rows=2.0), "rows: is a float, not an integer"),
        (lambda d: d.update(rows=True), "rows: is a bool, not an integer"),
        (lambda d: d.update(rows=0), "rows must be positive, got 0"),  # the record's own check, at its path
        (lambda d: d["leaves"][1].update(value=False), r"leaves\[1\]\.value: is a bool, not a number"),
        (lambda d: d["leaves"][0].update(flags=[1]), r"leaves\[0\]\.flags\[0\]: is an int, not a boolean"),
        (lambda d: d["leaves"][0].update(note=3), r"leaves\[0\]\.note: is an int, not a string"),
        (lambda d: d.update(leaves={}), "leaves: is a dict, not a list"),
        (lambda d: d.update(pair=["a"]), "pair: has 1 items, not 2"),
        (lambda d: d.update(by_name=[]), "by_name: is a list, not an object"),
        (lambda d: d["by_name"].update(c=1), r"by_name\.c: is an int, not an object"),
        (lambda d: d["settings"].update(bad=[]), r"settings\.bad: is a list, not a string or an integer or a number"),
        (lambda d: d.update(kind="ash"), "kind: is 'ash', not one of 'oak', 'elm'"),
        (lambda d: d.update(count=5), r"count: is 5, not 2 \(it follows from the other fields\)"),
    ],
)
def test_a_bad_value_is_refused_naming_its_path(edit: Any, message: str) -> None:
    d = json.loads(_text(to_json(TREE)))
    edit(d)
    with pytest.raises(FieldError, match=message):
        from_json(Tree, d)


def test_a_strict_read_refuses_an_unknown_key_and_the_top_must_be_an_object() -> None:
    d = {"name": "a", "value": 1.0, "colour": "red"}
    assert from_json(Leaf, d) == Leaf("a", 1.0)
    with pytest.raises(FieldError, match=r"has unknown fields \['colour'\]"):
        from_json(Leaf, d, strict=True)
    with pytest.raises(FieldError, match=r"^is a list, not an object$"):
        from_json(Leaf, [])


# --- the committed documents ---------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted(ROOT.glob("reports/**/results.json"))
STORES = sorted(ROOT.glob("reports/**/*.jsonl"))
#: The records in a run store's lines (``compare.run.store``), by line type and key (a list: each item one).
STORE_PARTS: dict[str, dict[str, type]] = {
    "header": {"config": Config, "environment": Environment},
    "ceilings": {"ceilings": Ceilings},
    "cell": {"result": Result},
    "resolution": {"rows": ResolutionRow},
    "load": {"load": Load},
}


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_there_are_committed_documents() -> None:
    assert DOCUMENTS and STORES


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_a_committed_results_document_writes_back_byte_for_byte(path: Path, tmp_path: Path) -> None:
    doc = read_json(path)
    write_json(tmp_path / "again.json", doc)
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("path", STORES, ids=_name)
def test_every_record_of_a_committed_store_writes_back_as_stored(path: Path) -> None:
    seen = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        record = json.loads(line)
        for key, cls in STORE_PARTS.get(record["type"], {}).items():
            for data in record[key] if isinstance(record[key], list) else [record[key]]:
                # the header keeps the run's config as the command line made it, before the run chose its timing
                want = {**data, "timing": None} if cls is Config and "timing" not in data else data
                assert _text(to_json(from_json(cls, data))) == _text(want), f"line {n}: {key}"
                seen.add(cls)
    assert seen >= {Config, Environment, Ceilings, Result, ResolutionRow}  # and Load, in a store that recorded it


def _planted(rows: list[dict[str, Any]]) -> tuple[int, str]:
    """Plant a string as the last tensor verdict's ``max_abs_err`` of the last row with one; its index and path."""
    i = max(k for k, r in enumerate(rows) if (r.get("parity") or {}).get("tensors"))
    j = len(rows[i]["parity"]["tensors"]) - 1
    rows[i]["parity"]["tensors"][j]["max_abs_err"] = "0.5"
    return i, f"parity.tensors[{j}].max_abs_err: is a str, not a number"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_a_bad_field_planted_in_a_committed_document_is_named_by_its_path(path: Path, tmp_path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    i, where = _planted(raw["results"])
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps(raw, allow_nan=True), encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_json(bad)
    assert str(e.value) == f"results file {bad}: results[{i}].{where}", str(e.value)


@pytest.mark.parametrize("path", STORES, ids=_name)
def test_a_bad_field_planted_in_a_committed_store_is_named_by_its_path(path: Path, tmp_path: Path) -> None:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    cells = [r["result"] for r in lines if r["type"] == "cell"]
    i, where = _planted(cells)
    bad = tmp_path / "cells.jsonl"
    bad.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(f": results[{i}].{where}")):
        read_store(bad)


def test_every_case_of_the_golden_manifest_reads_back() -> None:
    files = json.loads((ROOT / "golden" / "MANIFEST.json").read_text(encoding="utf-8"))["files"]
    for name, entry in files.items():
        case = from_json(Case, entry["case"])
        assert to_json(case) == entry["case"] and name == f"{case.name}.safetensors"
