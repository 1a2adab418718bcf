"""Recompiles are counted by the frameworks' own counters on a 3-shape sweep (dim 64, hidden 128, tokens 1, 8, 33).

What is asserted is what torch 2.13 and jax do (observed, then pinned here):

- ``torch.compile(dynamic=False)``: one compile per new token count (automatic dynamic shapes are off, so the
  second shape does not turn into a dynamic graph);
- ``torch.compile(dynamic=True)``: 1, 1, 0. Dynamo specialises sizes 0 and 1 even when asked for dynamic shapes,
  so one token gets its own static graph; 8 compiles the dynamic graph, and 33 reuses it: no compile per shape;
- ``jax.jit``: one compile per new shape, none for a shape seen before.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from compare.problem.cases import Case, Shape
from compare.problem.shape_cases import case_for_tokens
from compare.report.shapes import shapes_section
from compare.results.document import Results
from compare.timing.compile_sweep import payback_calls, with_payback

pytestmark = pytest.mark.quick

pytest.importorskip("torch")

BASE = Case("geglu", Shape(1, 1, 64, 128), "float32")
TOKENS = [1, 8, 33]
BUDGET = 0.02


def make(tokens: int) -> Case:
    return case_for_tokens(BASE, tokens)


def _backend(name: str) -> Any:
    """A registered backend's object: the sweep is the backend's own (``BackendSpec.sweep``, ``shape_sweep``)."""
    from compare.backends.registry import spec

    return spec(name).load()


def compiles(rows: list[dict[str, Any]]) -> list[int]:
    assert not [r["error"] for r in rows if r["error"]]
    return [r["compiles"] for r in rows]


@functools.cache
def torch_static() -> tuple[list[dict[str, Any]], int]:
    """The dynamic=False sweep, compiled through CompileCounterWithBackend to cross-check Dynamo's counter."""
    from torch._dynamo.testing import CompileCounterWithBackend

    cnt = CompileCounterWithBackend("inductor")
    rows = _backend("torch-compile").shape_sweep(make, TOKENS, dynamic=False, budget_s=BUDGET, compile_backend=cnt)
    return rows, cnt.frame_count


@pytest.mark.standard
@pytest.mark.compile
def test_torch_static_compile_recompiles_once_per_shape() -> None:
    rows, backend_calls = torch_static()
    assert compiles(rows) == [1, 1, 1]
    assert backend_calls == 3  # the compiler backend was invoked once per shape: the counter agrees
    assert all(r["dynamic"] is False and not r["generic"] and r["median_s"] > 0 for r in rows)
    assert all(r["first_call_s"] > r["median_s"] for r in rows)
    assert "unique_graphs" in rows[0]["compile_counter"]


@pytest.mark.standard
@pytest.mark.compile
def test_torch_dynamic_compile_does_not_recompile_per_shape() -> None:
    rows = _backend("torch-compile").shape_sweep(make, TOKENS, dynamic=True, budget_s=BUDGET)
    assert compiles(rows) == [1, 1, 0]  # size 1 is specialised; 8 and 33 share one dynamic graph


@pytest.mark.standard
@pytest.mark.compile
def test_torch_static_past_the_recompile_limit_is_an_error_row() -> None:
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=2):
        rows = _backend("torch-compile").shape_sweep(make, TOKENS, dynamic=False, budget_s=BUDGET)
    assert [r["compiles"] for r in rows[:2]] == [1, 1]
    assert "RecompileLimit" in rows[2]["error"] and "recompile_limit = 2" in rows[2]["error"]
    assert rows[2]["median_s"] is None


def test_shape_generic_torch_backends_compile_nothing() -> None:
    from torch_impl import device as dev

    rows = _backend("torch-eager").shape_sweep(make, TOKENS, budget_s=BUDGET)
    assert compiles(rows) == [0, 0, 0] and all(r["generic"] and r["dynamic"] is None for r in rows)
    ok, _, interpreted = dev.triton_status()
    if ok:
        tri = _backend("torch-triton").shape_sweep(make, TOKENS, budget_s=BUDGET)
        if interpreted:  # the CPU interpreter compiles nothing, and is not timed
            assert compiles(tri) == [0, 0, 0] and all(not r["timed"] and r["median_s"] is None for r in tri)
        else:  # on a GPU the first shape builds the kernel; Triton's hook counts it
            assert compiles(tri)[0] >= 1 and all(r["timed"] for r in tri)


@pytest.mark.standard
@pytest.mark.compile
def test_a_recompile_inside_the_timed_loop_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    from compare.timing import timer

    real = timer.measure

    def measure_that_recompiles(*args: Any, **kw: Any) -> Any:
        counters["stats"]["unique_graphs"] += 1  # what a recompiling sample would do to Dynamo's counter
        return real(*args, **kw)

    monkeypatch.setattr(timer, "measure", measure_that_recompiles)
    with pytest.raises(RuntimeError, match="during the timed samples"):
        _backend("torch-eager").shape_sweep(make, [8], budget_s=BUDGET)


@pytest.mark.standard
@pytest.mark.compile
def test_jax_jit_compiles_once_per_new_shape() -> None:
    pytest.importorskip("jax")
    rows = _backend("jax-xla").shape_sweep(make, [*TOKENS, 8], budget_s=BUDGET)
    assert compiles(rows) == [1, 1, 1, 0]  # 8 again: served from the jitted function's cache
    assert [r["backend_compiles"] for r in rows] == [1, 1, 1, 0]  # jax.monitoring agrees with _cache_size()
    assert all(r["compile_s_reported"] > 0 for r in rows[:3]) and rows[3]["compile_s_reported"] == 0


@pytest.mark.standard
@pytest.mark.compile
def test_jax_compile_event_inside_the_timed_loop_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    jax = pytest.importorskip("jax")
    from compare.timing import timer
    from jax_impl import recompiles

    real = timer.measure

    def measure_that_compiles(*args: Any, **kw: Any) -> Any:
        jax.monitoring.record_event_duration_secs(recompiles.BACKEND_COMPILE_EVENT, 0.0)  # as a compile reports it
        return real(*args, **kw)

    monkeypatch.setattr(timer, "measure", measure_that_compiles)
    with pytest.raises(RuntimeError, match="during the timed samples"):
        _backend("jax-xla").shape_sweep(make, [8], budget_s=BUDGET)


class _FakeCounter:
    """A compile counter over ``box[0]``, which the fake steps below raise when they "compile"."""

    description = "box[0] (a fake compiler's builds)"

    def __init__(self, box: list[int]) -> None:
        self.box = box

    def start(self) -> None:
        pass

    def count(self) -> int:
        return self.box[0]

    def first_call_fields(self) -> dict[str, Any]:
        return {"builds_so_far": self.box[0]}

    def moved(self, since: int) -> str:
        return f"{self.box[0] - since} more build(s)" if self.box[0] > since else ""


def _fake_steps(box: list[int], *, every_call: bool = False, fail_at: int | None = None) -> Any:
    """``step_for`` of a fake backend: each shape's step builds once (``every_call``: on every call), and raises at
    ``fail_at`` tokens."""

    def step_for(g: Any) -> tuple[Any, Any]:
        built = [False]

        def step() -> int:
            if g.case.shape.tokens == fail_at:
                raise ValueError("cannot build\nsecond line")
            if every_call or not built[0]:
                box[0] += 1
                built[0] = True
            return 0

        return step, lambda out: None

    return step_for


def test_the_framework_neutral_loop() -> None:
    """``compare.timing.compile_sweep.run`` on a fake framework: compiles per shape from the counter, its extra
    fields after ``compile_counter``, a kept first-call error, an untimed sweep, and a build while timed raising."""
    from compare.timing import compile_sweep

    goldens = compile_sweep.goldens(make, TOKENS, "fwd")
    common: dict[str, Any] = dict(
        backend="fake", framework="none", device="cpu", mode="fwd", budget_s=BUDGET, dynamic=None, generic=True
    )
    box = [0]
    rows = compile_sweep.run(
        goldens, step_for=_fake_steps(box, fail_at=8), counter=_FakeCounter(box), keep_errors=True,
        error_note=" (a note)", **common,
    )  # fmt: skip
    assert [r["compiles"] for r in rows] == [1, None, 1] and [r["tokens"] for r in rows] == TOKENS
    assert rows[1]["error"] == "ValueError: cannot build (a note)" and rows[1]["median_s"] is None
    assert rows[0]["median_s"] > 0 and rows[0]["builds_so_far"] == 1 and "builds_so_far" not in rows[1]
    assert list(rows[0]) == [
        "backend", "framework", "dynamic", "tokens", "model", "dim", "hidden", "dtype", "mode", "device",
        "compiles", "compile_counter", "builds_so_far", "first_call_s", "median_s", "iqr_s",
        "timed", "generic", "note", "error",
    ]  # fmt: skip
    untimed = compile_sweep.run(
        goldens, step_for=_fake_steps(box), counter=_FakeCounter(box), **{**common, "timed": False}
    )
    assert [(r["compiles"], r["first_call_s"], r["timed"]) for r in untimed] == [(1, None, False)] * 3
    with pytest.raises(ValueError, match="cannot build"):  # without keep_errors a first call's error propagates
        compile_sweep.run(goldens, step_for=_fake_steps(box, fail_at=8), counter=_FakeCounter(box), **common)
    with pytest.raises(RuntimeError, match=r"during the timed samples at 1 tokens \(\d+ more build"):
        compile_sweep.run(goldens, step_for=_fake_steps(box, every_call=True), counter=_FakeCounter(box), **common)
    with pytest.raises(ValueError, match="mode"):
        compile_sweep.goldens(make, TOKENS, "bwd")


def test_payback_arithmetic() -> None:
    assert payback_calls(1.0, 1e-3, 2e-3) == pytest.approx(1000.0)  # saves 1 ms a call
    assert payback_calls(1.0, 2e-3, 1e-3) is None  # slower: never pays back
    assert payback_calls(0.0, 2e-3, 1e-3) == 0.0  # nothing to pay back
    rows = [
        {
            "backend": "torch-eager",
            "tokens": 8,
            "compiles": 0,
            "first_call_s": 0.01,
            "median_s": 2e-3,
            "generic": True,
            "dynamic": None,
            "framework": "torch",
            "compile_counter": "c",
        },
        {
            "backend": "torch-compile",
            "tokens": 8,
            "compiles": 1,
            "first_call_s": 1.001,
            "median_s": 1e-3,
            "generic": False,
            "dynamic": False,
            "framework": "torch",
            "compile_counter": "c",
        },
    ]
    out = with_payback(rows)
    assert out[0]["payback_calls"] is None and out[1]["compile_s"] == pytest.approx(1.0)
    assert out[1]["payback_calls"] == pytest.approx(1000.0) and out[1]["baseline"] == "torch-eager"
    text = shapes_section(Results(shape_sweep=tuple(rows)))
    assert "1,000 calls vs torch-eager" in text and text == shapes_section(Results(shape_sweep=tuple(rows)))
    assert shapes_section(Results()) == ""


@pytest.mark.standard
def test_sweep_rows_render() -> None:
    rows, _ = torch_static()
    text = shapes_section(Results(shape_sweep=tuple(rows)))
    assert "## Compile cost and shape generality" in text and "torch-compile (dynamic=False): 3 compile(s)" in text
