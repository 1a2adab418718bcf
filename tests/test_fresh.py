"""The fresh draw is judgeable whatever the seed: a heavy-tailed sub-draw that would push a 16-bit output past the
dtype's range is passed over (before any step sees it), so no seed of the run turns a case's cells into errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compare.backends.registry import spec
from compare.formats.codec import from_json, to_json
from compare.gate import fresh
from compare.gate.parity import Plain, UnusableCase, tensor_stats
from compare.problem.cases import PRESETS, Case
from compare.problem.golden import golden_for
from compare.problem.reference import round_to_dtype
from compare.run.harness import run
from compare.run.options import RunOptions
from compare.timing.timer import TimingConfig

pytestmark = pytest.mark.quick

ODD16 = PRESETS["odd"].case("float16", model="swiglu")


def test_rounding_past_the_float16_range_is_inf_without_a_warning() -> None:
    out = round_to_dtype(np.array([1e5, -7e4, 65504.0, 3.0]), "float16")
    assert np.isposinf(out[0]) and np.isneginf(out[1]) and out[2] == 65504.0 and out[3] == 3.0


def test_the_same_seed_gives_the_same_draw() -> None:
    params = golden_for(ODD16).params
    a, b = fresh.draw(ODD16, 99, params), fresh.draw(ODD16, 99, params)
    assert all(np.array_equal(a[k], b[k]) for k in ("x", "dy"))
    assert not np.array_equal(a["x"], fresh.draw(ODD16, 100, params)["x"])
    fwd = fresh.draw(ODD16, 99, params, backward=False)  # screened on the forward alone: the same first sub-draw
    assert all(np.array_equal(a[k], fwd[k]) for k in ("x", "dy"))


@pytest.fixture
def blows_up_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sub-draw of every seed holds one huge input (``x`` scaled by 1e4 in its first element): swiglu's
    float16 outputs overflow on it."""
    calls = {"n": 0}
    real = fresh.case_input

    def case_input(rng: np.random.Generator, case: Case) -> np.ndarray:
        calls["n"] += 1
        x = real(rng, case)
        if calls["n"] == 1:
            x.reshape(-1)[0] = 6e4
        return x

    monkeypatch.setattr(fresh, "case_input", case_input)


@pytest.mark.usefixtures("blows_up_first")
def test_an_out_of_range_sub_draw_is_passed_over_and_the_draw_is_judgeable() -> None:
    params = golden_for(ODD16).params
    inputs = fresh.draw(ODD16, 5, params)
    assert float(np.max(np.abs(inputs["x"]))) < 6e4  # not the first sub-draw
    fresh.reference(ODD16, params, inputs)  # no UnusableCase


def test_the_control_without_the_screen_is_unusable(blows_up_first: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with the screen off the first sub-draw is taken, and the gate cannot judge it."""
    monkeypatch.setattr(fresh, "_in_range", lambda *_a: True)
    params = golden_for(ODD16).params
    inputs = fresh.draw(ODD16, 5, params)
    assert float(np.max(np.abs(inputs["x"]))) == 6e4
    with pytest.raises(UnusableCase, match=r"overflows float16|beyond float16"):
        fresh.reference(ODD16, params, inputs)


@pytest.mark.standard
def test_a_case_with_no_judgeable_draw_is_an_error_in_every_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sub-draw out of range: each cell of that case is an error naming the cause; the other case still runs."""
    real = fresh._in_range
    monkeypatch.setattr(fresh, "_in_range", lambda case, *a: case.dtype != "float16" and real(case, *a))
    cases = [PRESETS["tiny"].case("float16"), PRESETS["tiny"].case("float32")]
    doc = run(cases, [spec("torch-eager")], ["fwd"], RunOptions(TimingConfig(warmup=1, min_samples=5, budget_s=0.0)))
    by_dtype = {r.dtype: r for r in doc.results}
    assert by_dtype["float16"].status == "error"
    assert f"none of {fresh.MAX_DRAWS} fresh draws" in by_dtype["float16"].reason
    assert by_dtype["float32"].status == "ok", by_dtype["float32"].reason


#: A forward with more tokens than the fresh check judges (200 > ``FRESH_ROWS``), small enough to be quick.
WIDE = PRESETS["tiny"].case("float32", model="geglu")
WIDE = type(WIDE)(WIDE.model, type(WIDE.shape)(2, 100, 24, 40), "float32", WIDE.dist, 0)


def _draw() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    params = golden_for(WIDE).params
    return params, fresh.draw(WIDE, 7, params)


def test_a_forward_only_reference_is_the_whole_reference_on_rows_drawn_anew_each_time() -> None:
    """The rows' reference is the whole draw's reference restricted to them, to the bit (each token's output depends
    on its own input alone); each call draws other rows; with the backward every token is judged."""
    params, inputs = _draw()
    whole = fresh.reference(WIDE, params, inputs, backward=False, rows=0)
    assert whole.rows is None and whole.ref["y"].shape == (2, 100, 24)
    a = fresh.reference(WIDE, params, inputs, backward=False)
    b = fresh.reference(WIDE, params, inputs, backward=False)
    assert a.rows is not None and b.rows is not None and len(a.rows) == fresh.FRESH_ROWS
    assert a.ref["y"].shape == (1, fresh.FRESH_ROWS, 24) and a.rows_seed != b.rows_seed
    assert not np.array_equal(a.rows, b.rows)
    assert np.array_equal(a.ref["y"][0], whole.ref["y"].reshape(-1, 24)[a.rows])
    assert np.array_equal(a.plain["y"][0], whole.plain["y"].reshape(-1, 24)[a.rows])
    assert np.array_equal(a.take(whole.ref)["y"], a.ref["y"])
    assert fresh.reference(WIDE, params, inputs).rows is None  # with the backward
    with pytest.raises(ValueError, match="judges y alone"):
        a.take({"y": whole.ref["y"], "dx": whole.ref["y"]})


def test_the_drawn_rows_catch_a_step_that_gets_an_eighth_of_its_rows_wrong() -> None:
    """The right answer passes on the drawn rows; one with every eighth token's output zeroed fails, on every draw
    of the rows (it escapes one with probability (7/8)**128, about 4e-8)."""
    from compare.run.pipeline import Call, judge_calls

    params, inputs = _draw()
    order = np.arange(int(np.prod(inputs["x"].shape[:-1])))  # the draw's own order
    right = {"y": round_to_dtype(fresh.reference(WIDE, params, inputs, backward=False, rows=0).ref["y"], "float32")}
    wrong = {"y": right["y"].copy()}
    wrong["y"].reshape(-1, 24)[3::8] = 0.0
    for _ in range(5):
        ref = fresh.reference(WIDE, params, inputs, backward=False)
        ok = judge_calls([Call(order, [("cpu", right)])], 1, ref, "float32", "fwd", 7, "right", False)[0]
        bad = judge_calls([Call(order, [("cpu", wrong)])], 1, ref, "float32", "fwd", 7, "wrong", False)[0]
        assert ok.tier == "pass" and ok.rows == fresh.FRESH_ROWS and ok.rows_seed == ref.rows_seed, ok
        assert bad.tier == "fail" and bad.failures, bad
        assert from_json(fresh.FreshCheck, to_json(bad)) == bad


# --- the harness's inputs (compare.run.pipeline.Feed) ---------------------------------------------------------


def _slots_backend(lazy: bool, cache: bool = False) -> tuple[object, dict[int, np.ndarray]]:
    """A numpy step ``y = 2 x`` over slot buffers written in place (as the torch runner's); ``lazy``: its output is
    a closure computed only when read; ``cache``: a cheat that answers a slot it has seen (its buffer's identity)
    with the output of its first call there."""
    from compare.backends.registry import Prepared

    slots: dict[int, np.ndarray] = {}
    seen: dict[int, np.ndarray] = {}

    def bind(inputs: dict[str, np.ndarray], slot: int):  # type: ignore[no-untyped-def]
        if slot in slots:
            slots[slot][...] = inputs["x"]
        else:
            slots[slot] = inputs["x"].copy()
        buf = slots[slot]
        if cache:
            first = seen.setdefault(slot, 2 * buf)
            return lambda: first
        return (lambda: lambda: 2 * buf) if lazy else (lambda: 2 * buf)

    def read(out):  # type: ignore[no-untyped-def]
        return {"y": np.asarray(out() if lazy else out, dtype=np.float64)}

    p = Prepared(step=lambda: None, sync=lambda _o: None, to_numpy=read, bind=bind)
    return p, slots


#: ``tiny``'s case (``y`` and ``x`` of one width, 111 tokens): the shapes and distribution the feed draws from
CASE = PRESETS["tiny"].case("float32")


def _fed(lazy: bool, blocks: int = 6, calls: int = 3, cache: bool = False):  # type: ignore[no-untyped-def]
    from compare.backends.registry import NUMPY_READER
    from compare.run.pipeline import Feed

    p, slots = _slots_backend(lazy, cache)
    x = fresh.draw(CASE, 1, golden_for(CASE).params, backward=False)
    feed = Feed(p, CASE, "fwd", x, "test", NUMPY_READER)  # type: ignore[arg-type]
    seen = []
    for _ in range(blocks):
        fns = feed.take(calls)
        seen += [s.copy() for s in slots.values()]
        feed.done([f() for f in fns])
    return x["x"], feed, seen


@pytest.mark.quick
def test_every_call_gets_rows_no_call_saw_and_the_draws_call_is_judged_in_its_order() -> None:
    """No row of any call's x equals, bit for bit, a row of an earlier call (18 calls of 111 tokens); exactly one
    call holds the fresh draw's rows (in an order of its own), among the first ``DRAW_CALL_WITHIN``, and its output
    put back in the draw's order is the honest answer on the draw: ``2 x``."""
    from compare.run.pipeline import DRAW_CALL_WITHIN, _in_draw_order

    x, feed, seen = _fed(lazy=False)
    rows = [r.tobytes() for s in seen for r in s.reshape(-1, s.shape[-1])]
    assert feed.calls == 18 and len(set(rows)) == len(rows) == 18 * 111
    drawn = sorted(r.tobytes() for r in x.reshape(-1, x.shape[-1]))
    holds = [i for i, s in enumerate(seen) if sorted(r.tobytes() for r in s.reshape(-1, s.shape[-1])) == drawn]
    assert len(holds) == 1 and holds[0] < DRAW_CALL_WITHIN, holds
    (call,) = feed.judged()
    assert np.array_equal(_in_draw_order(call.copies[0][1], call.order)["y"], 2 * x)


@pytest.mark.quick
def test_the_draws_call_is_placed_uniformly_among_the_first_calls() -> None:
    """Over 300 feeds the draw's call falls on each of the first ``DRAW_CALL_WITHIN`` calls about equally often and
    never later."""
    from compare.run.pipeline import DRAW_CALL_WITHIN

    counts = np.zeros(12)
    for _ in range(300):
        x, _feed, seen = _fed(lazy=False, blocks=4, calls=3)
        first = x.reshape(-1, x.shape[-1])[0].tobytes()
        counts[next(i for i, s in enumerate(seen) if first in {r.tobytes() for r in s.reshape(-1, s.shape[-1])})] += 1
    assert not counts[DRAW_CALL_WITHIN:].any(), counts
    inside = counts[:DRAW_CALL_WITHIN]
    assert inside.min() > 0.5 * inside.mean() and inside.max() < 1.5 * inside.mean(), counts


@pytest.mark.quick
def test_a_lazy_output_is_not_read_and_fails_every_call() -> None:
    """A step whose output is a closure computed only when read is refused at return on every call (no array is
    read from it); the control: the same step returning arrays gives every call's spot rows, ``2 x`` of its rows."""
    _x, feed, _seen = _fed(lazy=True)
    assert len(feed.spots) == 18 and all("not a numpy array" in s.error for s in feed.spots), feed.spots[0]
    _x, feed, _seen = _fed(lazy=False)
    assert all(not s.error and any(np.array_equal(g, 2 * s.x) for g in s.got["y"]) for s in feed.spots)


@pytest.mark.quick
def test_a_cache_keyed_on_its_inputs_identity_is_read_wrong_at_every_call_after_its_first() -> None:
    """A step that answers each slot it has seen from memory (right on its first call there) returns another call's
    answer on every later call: each of those calls' spot rows differs from ``2 x`` of the rows it was given."""
    _x, feed, _seen = _fed(lazy=False, blocks=4, calls=3, cache=True)
    wrong = [not any(np.array_equal(g, 2 * s.x) for g in s.got["y"]) for s in feed.spots]
    assert wrong == [False] * 3 + [True] * 9, wrong


@pytest.mark.standard
def test_the_every_call_check_fails_a_stale_call_and_passes_honest_ones() -> None:
    """``judge_spots`` on ``tiny``: honest spots (the float64 reference's own rows, rounded to the dtype) pass;
    the same with one call's rows swapped for another call's (a stale output) fails that call alone, naming it."""
    from compare.run.pipeline import Spot, judge_spots

    params = golden_for(CASE).params
    rng = np.random.default_rng(5)
    spots = []
    for i in range(5):
        x = rng.standard_normal((2, 96)).astype(np.float32)
        y = fresh.token_reference(CASE, params, x[None], None)["y"][0]
        spots.append(Spot(i, np.array([0, 1]), x, x, {"y": [y.astype(np.float32).astype(np.float64)]}))
    assert judge_spots(spots, CASE, "fwd") == (5, [])
    spots[3] = Spot(3, spots[3].rows, spots[3].x, spots[3].dy, spots[2].got)
    checked, failed = judge_spots(spots, CASE, "fwd")
    assert checked == 5 and len(failed) == 1 and "1 of 5 calls" in failed[0] and "call 4:" in failed[0], failed


@pytest.mark.quick
def test_kept_outputs_are_held_exactly_in_the_narrowest_type() -> None:
    """A step's kept outputs are held in 2 bytes an element when they are 16-bit values (a real layer's gradients
    are hundreds of millions of them), and a value no narrower type holds stays as it was: the gate reads the bits
    the step returned."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000)
    tensors = {k: round_to_dtype(a, k).astype(np.float64) for k in ("bfloat16", "float16", "float32")}
    tensors["float64"] = a
    tensors["with nan"] = np.array([np.nan, 1.0, np.inf])
    tensors["past float16"] = np.array([7e4, 1.0 + 2.0**-10])  # neither 16-bit type holds both
    held = fresh.compact(tensors)
    assert {k: v.dtype.itemsize for k, v in held.items()} == {
        "bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "with nan": 2, "past float16": 4,
    }  # fmt: skip
    for k, v in tensors.items():
        assert np.array_equal(held[k].astype(np.float64), v, equal_nan=True), k


def test_the_plain_statistics_are_computed_once_per_reference() -> None:
    """Every output judged against one reference reuses its plain computation's statistics; another reference
    array (a fresh draw's, or the same values in a new array) gets its own."""
    rng = np.random.default_rng(1)
    ref = {"y": rng.standard_normal((64, 48))}
    plain = Plain({"y": round_to_dtype(ref["y"], "bfloat16")})
    first = tensor_stats(ref, plain, "y")
    assert tensor_stats(ref, plain, "y") is first
    other = {"y": ref["y"] * 2.0}  # a control: the memo must not answer for it
    assert tensor_stats(other, plain, "y").scale == 2.0 * first.scale
    assert tensor_stats(ref, plain, "y") == first and tensor_stats(ref, plain, "y") is not first


@pytest.mark.standard
def test_a_module_case_s_every_call_check_runs_its_module_in_float32() -> None:
    """A module case's spot reference is its torch module in float32 (``user_module.spot_reference``): within
    float32's rounding of the float64 computation's ``y`` and ``dx`` (far below the check's eighth of a row), and
    it catches a stale call as the built-in models' does."""
    import compare
    from compare.problem.golden import compute_of
    from compare.problem.reference import Arith
    from compare.run.pipeline import Spot, judge_spots

    case = compare.module_case("examples/llama_mlp.py", 64, 96, "bfloat16", batch=1, seq=16)
    params = golden_for(case).params
    rng = np.random.default_rng(6)
    x, dy = rng.standard_normal((1, 2, 64)), rng.standard_normal((1, 2, 64))
    got = fresh.token_reference(case, params, x, dy)
    exact = compute_of(case, x, params, dy, Arith(None, gemm=np.matmul), weights=False)
    for k in ("y", "dx"):
        assert np.max(np.abs(got[k] - exact[k])) <= 1e-5 * np.max(np.abs(exact[k])), k
    spots = []
    for i in range(4):
        xi, dyi = rng.standard_normal((2, 64)), rng.standard_normal((2, 64))
        ref = fresh.token_reference(case, params, xi[None], dyi[None])
        spots.append(Spot(i, np.array([0, 1]), xi, dyi, {k: [ref[k][0]] for k in ("y", "dx")}))
    assert judge_spots(spots, case, "fwd+bwd") == (4, [])
    spots[1] = Spot(1, spots[1].rows, spots[1].x, spots[1].dy, spots[0].got)
    checked, failed = judge_spots(spots, case, "fwd+bwd")
    assert checked == 4 and len(failed) == 1 and "call 2:" in failed[0], failed


@pytest.mark.quick
def test_the_fresh_reference_is_float64_for_float32_data() -> None:
    """The fresh draw's reference goes through the machine's BLAS with its operands widened to float64: ``np.matmul``
    of a built-in model's float32 arrays is a float32 product, which on a machine whose BLAS adds in order without FMA
    equals the plain computation bit for bit, and every honest backend then failed. Held to the golden's error-free
    products within float64's rounding."""
    from compare.problem.golden import exact_reference

    case = PRESETS["tiny"].case("float32")
    params = golden_for(case).params
    inputs = fresh.draw(case, 11, params)
    got = fresh.reference(case, params, inputs).ref
    exact = exact_reference(case, inputs["x"], params, inputs["dy"])
    for k, v in exact.items():
        assert np.max(np.abs(np.asarray(got[k]) - v)) <= 1e-12 * np.max(np.abs(v)), k


@pytest.mark.standard
def test_a_module_case_s_fresh_reference_and_screen_run_its_module_in_torch_s_kernels() -> None:
    """A module case's fresh reference is its module in torch's float64 kernels (``user_module.kernels_run``), held
    to the golden's error-free products within float64's rounding, every gradient named as the golden names it; its
    range screen runs the module in float32, within float32's rounding of the same."""
    import compare
    from compare.problem.golden import exact_reference, kernels_run_of

    case = compare.module_case("examples/llama_mlp.py", 64, 96, "bfloat16", batch=1, seq=16)
    params = golden_for(case).params
    inputs = fresh.draw(case, 11, params)
    got = fresh.reference(case, params, inputs).ref
    exact = exact_reference(case, inputs["x"], params, inputs["dy"])
    screen = kernels_run_of(case, inputs["x"], params, inputs["dy"], "float32")
    assert set(got) == set(exact) == set(screen)
    for k, v in exact.items():
        assert np.max(np.abs(np.asarray(got[k]) - v)) <= 1e-12 * np.max(np.abs(v)), k
        assert screen[k].dtype == np.float32 and np.max(np.abs(screen[k] - v)) <= 1e-5 * np.max(np.abs(v)), k


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_golden_s_plain_statistics_from_the_data_cache_judge_as_computed_ones(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cell.golden_stats`` computes the gate's statistics of the plain computation against the golden once, then
    reads them from the data cache: every figure the same bits (a float32 case's fit on the transcendental's
    signature too), and an output judged with either the same verdict and numbers."""
    from compare.gate.parity import check_tensor
    from compare.run.cell import golden_stats, plain_reference

    monkeypatch.setenv("FUSION_COMPARE_CACHE", str(tmp_path))
    case = PRESETS["tiny"].case(dtype)
    base, ref = plain_reference(case), golden_for(case).ref
    made, read = (Plain(dict(base), base.envelope, None, base.signature) for _ in range(2))
    golden_stats(case, made, list(made))
    assert [p.name.split("-")[:2] for p in tmp_path.glob("plain-stats-*.json")] == [["plain", "stats"]]
    golden_stats(case, read, list(read))
    rng = np.random.default_rng(3)
    for k in base:
        (r1, a), (r2, b) = made.stats[k], read.stats[k]
        assert r1 is r2 is ref[k] and a == b and a.small == b.small
        for da, db in ((a.ref_design, b.ref_design), (a.paired_design, b.paired_design)):
            assert da is not None and db is not None
            assert np.array_equal(da.m, db.m) and np.array_equal(da.rows, db.rows)
        y = round_to_dtype(np.asarray(ref[k]) * (1 + 2.0**-9 * rng.standard_normal(ref[k].shape)), dtype)
        got = [check_tensor(k, y, ref[k], base[k], dtype, s) for s in (a, b)]
        assert to_json(got[0]) == to_json(got[1]), k
