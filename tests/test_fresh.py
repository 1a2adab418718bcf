"""The fresh draw is judgeable whatever the seed: a heavy-tailed sub-draw that would push a 16-bit output past the
dtype's range is passed over (before any step sees it), so no seed of the run turns a case's cells into errors."""

from __future__ import annotations

import numpy as np
import pytest

from compare.backends.registry import spec
from compare.formats.codec import from_json, to_json
from compare.gate import fresh
from compare.gate.parity import Plain, UnusableCase, tensor_stats
from compare.problem.cases import PRESETS
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
    real = fresh.draw_input

    def draw_input(rng: np.random.Generator, shape: tuple[int, ...], dist: str) -> np.ndarray:
        calls["n"] += 1
        x = real(rng, shape, dist)
        if calls["n"] == 1:
            x.reshape(-1)[0] = 6e4
        return x

    monkeypatch.setattr(fresh, "draw_input", draw_input)


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


def _fed(lazy: bool, blocks: int = 6, calls: int = 3, cache: bool = False, tokens: int = 8):  # type: ignore[no-untyped-def]
    from compare.run.pipeline import Feed

    p, slots = _slots_backend(lazy, cache)
    x = np.arange(tokens * 2, dtype=np.float32).reshape(1, tokens, 2)
    feed = Feed(p, {"x": x, "dy": x}, "test", keep=2)  # type: ignore[arg-type]
    seen = []
    for _ in range(blocks):
        fns = feed.take(calls)
        seen += [s.copy() for s in slots.values()]
        feed.done([f() for f in fns])
    return x, feed, seen


@pytest.mark.quick
def test_a_feed_of_few_orders_binds_each_once_before_it_repeats_one() -> None:
    """3 tokens have 6 orders: 18 calls bind all 6 in their first 6, then repeat them (and do not hang)."""
    _, feed, seen = _fed(lazy=False, tokens=3)
    assert feed.calls == 18 and len({s.tobytes() for s in seen[:6]}) == 6 == len({s.tobytes() for s in seen})


@pytest.mark.quick
def test_the_feed_never_repeats_an_input_and_judges_outputs_in_the_draws_order() -> None:
    """Every call's x is the draw's tokens in an order of its own (18 calls: no two alike; the same multiset of
    rows), and a kept output put back in the draw's order is the honest answer on the draw: ``2 x``."""
    from compare.run.pipeline import _in_draw_order

    x, feed, seen = _fed(lazy=False)
    assert feed.calls == 18 and len({s.tobytes() for s in seen}) == len(seen)
    assert all(sorted(map(tuple, s.reshape(-1, 2))) == sorted(map(tuple, x.reshape(-1, 2))) for s in seen)
    calls = feed.judged()
    assert len(calls) == 3  # two over every call, one over the calls on a slot bound before
    for c in calls:
        assert np.array_equal(_in_draw_order(c.copies[0][1], c.order)["y"], 2 * x)


@pytest.mark.quick
def test_a_lazy_output_is_read_only_after_its_inputs_were_overwritten() -> None:
    """A step that computes only when its output is read reads the slot's next values and is judged wrong; the
    control: the same lazy outputs read right after their block (before the slot is bound again) look right."""
    from compare.run.pipeline import _in_draw_order

    x, feed, _seen = _fed(lazy=True)
    wrong = [not np.array_equal(_in_draw_order(c.copies[0][1], c.order)["y"], 2 * x) for c in feed.judged()]
    assert all(wrong), wrong
    # the control: read at once, a lazy output computes on the values it was called with
    p, _slots = _slots_backend(lazy=True)
    from compare.run.pipeline import Feed

    early = Feed(p, {"x": x, "dy": x}, "test", keep=1)  # type: ignore[arg-type]
    fns = early.take(1)
    (out,) = [f() for f in fns]
    order = early._block[0]
    assert np.array_equal(_in_draw_order(p.to_numpy(out), order)["y"], 2 * x)


@pytest.mark.quick
def test_the_kept_calls_are_spread_over_all_calls() -> None:
    """Reservoir sampling: over many feeds, every call of 12 is kept about as often (each with probability 2/12) by
    the two uniform picks (``judged()``'s first two); a feed that kept the first two (the control a cache warmed in
    warm-up would pass) would keep only calls 0, 1."""
    counts = np.zeros(12)
    for _ in range(600):
        _x, feed, seen = _fed(lazy=False, blocks=4, calls=3)
        for c in feed.judged()[:2]:
            orders = [s.reshape(-1, 2)[:, 0] // 2 for s in seen]
            counts[next(i for i, o in enumerate(orders) if np.array_equal(o, c.order))] += 1
    assert counts.min() > 0.5 * counts.mean() and counts.max() < 1.5 * counts.mean(), counts


@pytest.mark.quick
def test_a_cache_keyed_on_its_inputs_identity_never_escapes() -> None:
    """A step that answers each slot it has seen from memory (right on its first call there: 3 honest calls of 6) is
    judged wrong in every feed, by the pick among the calls on a slot bound before; the control: the two uniform
    picks alone let it escape in about a quarter of the feeds ((3/6) ** 2)."""
    from compare.run.pipeline import _in_draw_order

    escaped, caught = 0, 0
    for _ in range(200):
        x, feed, _seen = _fed(lazy=False, blocks=2, calls=3, cache=True)
        wrong = [not np.array_equal(_in_draw_order(c.copies[0][1], c.order)["y"], 2 * x) for c in feed.judged()]
        caught += any(wrong)
        escaped += not any(wrong[:2])
    assert caught == 200
    assert 20 < escaped < 80, escaped


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
