"""The gate's streaming statistics (``compare.gate.stream``) against numpy's whole-array forms, and the gate's verdict
on many blocks against its verdict on one: the same numbers to float64 rounding, the same tiers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from compare.gate import stream
from compare.gate.parity import check_tensor, plain_stats, slope_fit
from compare.gate.stream import Clustered, Spread, kth_smallest_abs
from compare.problem import datacache
from compare.problem.reference import round_to_dtype

pytestmark = pytest.mark.quick


def _var(sums: np.ndarray) -> float:
    g = sums.size
    d = sums - sums.mean()
    return g / (g - 1) * float(d @ d) if g >= 2 else 0.0


def _clustered(m: np.ndarray) -> float:
    """The whole-array two-way clustered variance the gate used before it streamed."""
    v_el, v_rows, v_cols = _var(m.ravel()), _var(m.sum(axis=1)), _var(m.sum(axis=0))
    return max(v_el, v_rows, v_cols, v_rows + v_cols - v_el)


def test_spread_and_clustered_match_the_whole_array_forms_over_uneven_blocks() -> None:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((37, 11)) * 1e-3 + 5.0  # a large mean: the pairwise update keeps its precision
    s, c = Spread(), Clustered(11)
    for i0, i1 in ((0, 1), (1, 9), (9, 30), (30, 37)):
        s.add(m[i0:i1].ravel())
        c.add(m[i0:i1])
    assert math.isclose(s.var(), _var(m.ravel()), rel_tol=1e-10)
    assert math.isclose(c.var(), _clustered(m), rel_tol=1e-10)
    assert math.isclose(c.total, float(m.sum()), rel_tol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_kth_smallest_abs_is_numpys_partition(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, 3))
    a[0, :] = 0.0  # ties, and a signed zero
    a[-1, 0] = -0.0
    for k in {1, (3 * n + 9) // 10, 3 * n}:
        t, below = kth_smallest_abs(a, k)
        assert t == np.partition(np.abs(a).ravel(), k - 1)[k - 1]
        assert below == int(np.count_nonzero(np.abs(a) < t))


def test_slope_fit_matches_the_pseudo_inverse_on_the_whole_array() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 48))
    dirs = rng.standard_normal((2, 64, 48)) * 1e-7
    t = 1e-3 * ref + 3e5 * (dirs[1] - dirs[0]) * 1e-3 + rng.standard_normal(ref.shape) * 1e-4
    x = np.stack([ref.ravel(), dirs[0].ravel(), dirs[1].ravel()], axis=1)
    coef, *_ = np.linalg.lstsq(x, t.ravel(), rcond=None)
    b, se, extra = slope_fit(t, ref, dirs)
    assert math.isclose(b, coef[0], rel_tol=1e-8)
    assert se > 0 and extra is not None
    b1, _, none = slope_fit(t, ref)
    assert none is None and math.isclose(b1, float(ref.ravel() @ t.ravel()) / float(ref.ravel() @ ref.ravel()))


def _case(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((150, 40))
    plain = round_to_dtype(ref, dtype)
    return ref, plain, rng.standard_normal(ref.shape)


def _narrower(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to the significand of the type below ``dtype`` (``compare.gate.parity.NARROWER_BITS``)."""
    m, e = np.frexp(a)
    bits = {"float32": 11, "float16": 8, "bfloat16": 4}[dtype]
    return round_to_dtype(np.ldexp(np.round(m * 2.0**bits) / 2.0**bits, e), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("error", ["honest", "scale", "narrow", "nan"])
def test_a_verdict_over_many_blocks_is_the_verdict_over_one(
    dtype: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, plain, noise = _case(dtype)
    u = 2.0 ** -{"float32": 24, "bfloat16": 8, "float16": 11}[dtype]
    y = {
        "honest": round_to_dtype(ref + 0.3 * u * noise * np.abs(ref), dtype),
        "scale": round_to_dtype(ref * (1 + 4 * u), dtype),
        "narrow": _narrower(ref, dtype),
        "nan": np.where(np.arange(ref.size).reshape(ref.shape) == 77, np.nan, plain),
    }[error]
    held = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    whole = check_tensor("y", y, ref, plain, dtype, plain_stats(ref, plain))
    expected = {"honest": [], "scale": ["scale"], "narrow": ["dtype"], "nan": ["finite"]}[error]
    assert [c for c in expected if c not in whole.failed] == [] and (whole.tier == "pass") == (not expected)
    monkeypatch.setattr(stream, "BLOCK_ELEMENTS", 120)  # 3 rows a block: 50 blocks
    for got in (y, np.asarray(y, dtype=held)):  # float64 values, and held in the dtype's own type
        many = check_tensor("y", got, ref, plain, dtype, plain_stats(ref, plain))
        assert (many.tier, many.failed, many.deviated) == (whole.tier, whole.failed, whole.deviated)
        for f in dataclasses.fields(whole):
            a, b = getattr(whole, f.name), getattr(many, f.name)
            if isinstance(a, float) and math.isfinite(a):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300), f.name
            elif f.name not in ("why", "cause"):
                assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), f.name


def test_a_cache_entry_read_from_disk_a_block_at_a_time_is_judged_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``datacache.load(lazy=True)`` and ``datacache.spill`` leave a tensor on disk (``Stored``); the gate reads it
    a block of rows at a time with the same verdict, and a spilled file leaves nothing behind in the folder."""
    monkeypatch.setenv(datacache.ENV, str(tmp_path))
    monkeypatch.setattr(datacache, "LAZY_BYTES", 0)
    monkeypatch.setattr(stream, "BLOCK_ELEMENTS", 200)
    ref, plain, _ = _case("bfloat16")
    y = round_to_dtype(ref * (1 + 2.0**-6), "bfloat16")  # a scale error: fails
    datacache.save("entry", {"ref": ref, "plain": plain})
    lazy = datacache.load("entry", lazy=True)
    assert lazy is not None and isinstance(lazy["ref"], datacache.Stored)
    spilled = datacache.spill({"ref": ref})
    assert isinstance(spilled["ref"], datacache.Stored) and [p.name for p in tmp_path.iterdir()] == [
        "entry.safetensors"
    ]
    want = check_tensor("y", y, ref, plain, "bfloat16")
    for r, p in ((lazy["ref"], lazy["plain"]), (spilled["ref"], plain)):
        got = check_tensor("y", y, r, p, "bfloat16")
        assert (got.tier, got.failed, got.max_abs_err, got.scale_err) == (
            want.tier,
            want.failed,
            want.max_abs_err,
            want.scale_err,
        )
        assert np.array_equal(np.asarray(r), ref)
    assert want.tier == "fail" and "scale" in want.failed
