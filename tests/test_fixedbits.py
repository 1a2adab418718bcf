"""Arithmetic with bits fixed by the data (``compare.problem.fixedbits``), and golden data and gate bounds that do not
move
with the machine: the same bytes under every OpenBLAS kernel this CPU can run, checked in fresh processes."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from compare.problem import fixedbits
from compare.problem.cases import PRESETS
from compare.problem.golden import GOLDEN_DIR, MANIFEST
from compare.problem.reference import round_to_dtype

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
#: OpenBLAS kernels every x86-64 CPU can run (each sums a float64 or float32 GEMM in its own order).
CORETYPES = ("Haswell", "Sandybridge", "Nehalem")


def _exact_product(a: np.ndarray, b: np.ndarray, i: int, j: int) -> Fraction:
    return sum((Fraction(float(a[i, p])) * Fraction(float(b[p, j])) for p in range(a.shape[1])), Fraction(0))


def test_matmul64_is_the_exact_product_rounded_on_float32_inputs_with_a_wide_range() -> None:
    """Heavy-tailed float32 inputs spanning many binades (x 2**±20): every checked entry equals the exact product of
    the inputs (Python fractions) rounded once to float64; plain float64 BLAS differs from it in the last bits."""
    rng = np.random.default_rng(7)
    a = (rng.standard_t(2, (9, 517)) * 2.0 ** rng.integers(-20, 20, (9, 517))).astype(np.float32).astype(np.float64)
    b = rng.standard_normal((517, 13)).astype(np.float32).astype(np.float64)
    c = fixedbits.matmul64(a, b)
    for i in range(9):
        for j in range(13):
            assert c[i, j] == float(_exact_product(a, b, i, j)), (i, j)


def test_matmul64_on_float64_inputs_is_within_its_stated_error() -> None:
    """On float64 inputs (the reference's hidden activations are not float32 values) the truncated slices cost at
    most about ``k 2**-(3 beta)`` of ``max|a_i| max|b_j|``: checked against the exact product."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 300)), rng.standard_normal((300, 4))
    c = fixedbits.matmul64(a, b)
    beta = fixedbits._beta(300)
    for i in range(5):
        for j in range(4):
            scale = np.max(np.abs(a[i])) * np.max(np.abs(b[:, j]))
            err = abs(Fraction(float(c[i, j])) - _exact_product(a, b, i, j))
            assert float(err) <= 300 * 2.0 ** -(fixedbits.SLICES * beta) * scale + 2 * np.spacing(abs(c[i, j]))


def test_matmul64_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="needs \\[m, k\\] @ \\[k, n\\]"):
        fixedbits.matmul64(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="finite"):
        fixedbits.matmul64(np.array([[np.nan]]), np.ones((1, 1)))


def test_matmul32_is_sequential_float32_accumulation() -> None:
    """Odd shapes, more rows than a block: each output is ``acc = fl32(acc + fl32(a b))`` over k in order, checked
    against that loop written out in scalar numpy float32 for a few entries, and it differs from float64."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 65)).astype(np.float32)
    b = rng.standard_normal((65, 3)).astype(np.float32)
    c = fixedbits.matmul32(a, b)
    assert c.dtype == np.float32
    for i, j in ((0, 0), (36, 2), (17, 1)):
        acc = np.float32(0)
        for p in range(65):
            acc = np.float32(acc + np.float32(a[i, p] * b[p, j]))
        assert c[i, j] == acc
    assert not np.array_equal(c, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))


def test_transcendentals_are_accurate_to_a_few_ulp() -> None:
    x = np.linspace(-30, 30, 100_001)
    ulps = np.abs(fixedbits.tanh(x) - np.tanh(x)) / np.spacing(np.maximum(np.abs(np.tanh(x)), 1e-300))
    assert ulps.max() <= 4
    x = np.linspace(-700, 700, 100_001)
    assert np.max(np.abs(fixedbits.exp(x) / np.exp(x) - 1)) < 1e-15
    x = np.concatenate([np.linspace(-1, 1, 100_000), np.geomspace(1e-300, 1e-3, 1000)])
    nz = np.expm1(x) != 0
    assert np.max(np.abs(fixedbits.expm1(x)[nz] / np.expm1(x)[nz] - 1)) < 1e-15
    assert fixedbits.tanh(np.array([0.0, -0.0, np.inf, -np.inf])).tolist() == [0.0, -0.0, 1.0, -1.0]


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.maximum(np.abs(want), 1e-300))


def test_erf_and_log1p_are_accurate_to_a_few_ulp() -> None:
    """Against 40-digit values (mpmath) on arguments where each branch works, and against libm's erf (itself within
    an ulp) over a wide range; the special values."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-2, 2, 2000), rng.uniform(1.5, 2.5, 1000), rng.uniform(2, 6.5, 500)])
    want = np.array([float(mpmath.erf(mpmath.mpf(float(v)))) for v in x])
    assert _ulps(fixedbits.erf(x), want).max() <= 5
    wide = np.concatenate([np.linspace(-40, 40, 200_001), np.geomspace(1e-300, 1e-2, 1000)])
    assert _ulps(fixedbits.erf(wide), np.array([math.erf(v) for v in wide])).max() <= 6
    edges = [0.0, -0.0, np.inf, -np.inf, 7.0, -6.0]
    assert fixedbits.erf(np.array(edges)).tolist() == [0.0, -0.0, 1.0, -1.0, 1.0, -1.0]
    assert np.signbit(fixedbits.erf(np.array([-0.0]))).all() and np.isnan(fixedbits.erf(np.array([np.nan]))).all()
    y = np.concatenate([rng.uniform(-0.99, 3, 2000), np.exp(rng.uniform(-700, 700, 1000))])
    y = np.concatenate([y, -np.geomspace(1e-300, 0.999, 200)])
    want = np.array([float(mpmath.log1p(mpmath.mpf(float(v)))) for v in y])
    assert _ulps(fixedbits.log1p(y), want).max() <= 2
    with np.errstate(invalid="ignore", divide="ignore"):
        assert _ulps(fixedbits.log1p(y), np.log1p(y)).max() <= 3
    special = fixedbits.log1p(np.array([0.0, -0.0, 1e-310, -1.0, np.inf, -2.0, -np.inf, np.nan]))
    assert special[:5].tolist() == [0.0, -0.0, 1e-310, -np.inf, np.inf] and np.signbit(special[1])
    assert np.isnan(special[5:]).all()


# The same formulas written again for one Python float at a time (IEEE float64 arithmetic, round-half-even ``round``,
# ``math.frexp``/``math.ldexp``): every vectorised result must be these bits, so nothing in numpy's array code (a SIMD
# kernel, a fused multiply-add, another order) enters the values.


def _py_poly(r: float, coeffs: list[float]) -> float:
    p = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        p = p * r + c
    return p


def _py_exp(x: float) -> float:
    xc = min(max(x, -746.0), 710.0)
    n = float(round(xc * fixedbits._INV_LN2))
    r = (xc - n * fixedbits._LN2_HI) - n * fixedbits._LN2_LO
    return math.ldexp(_py_poly(r, fixedbits._TAYLOR), int(n))


def _py_erf(x: float) -> float:
    a = abs(x)
    if a >= fixedbits.ERF_ONE:
        out = 1.0
    elif a >= fixedbits.ERF_SPLIT:
        k = a
        for n in range(fixedbits.ERF_FRACTION_TERMS, 0, -1):
            k = a + (0.5 * n) / k
        out = 1.0 - fixedbits._ONE_OVER_SQRT_PI * _py_exp(-(a * a)) / k
    else:
        t = a * a
        out = (fixedbits._TWO_OVER_SQRT_PI * a) * _py_exp(-t) * _py_poly(2.0 * t, fixedbits._ERF_SERIES)
    return math.copysign(out, x)


def _py_log1p(y: float) -> float:
    if abs(y) < 2.0**-54:
        return y
    u = 1.0 + y
    m, e = math.frexp(u)
    if m < fixedbits._SQRT_HALF:
        m, e = 2.0 * m, e - 1
    s, corr = (y / (2.0 + y), 0.0) if e == 0 else ((m - 1.0) / (m + 1.0), (y - (u - 1.0)) / u)
    z = s * s
    series = 2.0 * s + (2.0 * s) * (z * _py_poly(z, fixedbits._ATANH[1:]))
    return e * fixedbits._LN2_HI + (series + (e * fixedbits._LN2_LO + corr))


def test_erf_and_log1p_are_the_bits_of_their_formulas_one_python_float_at_a_time() -> None:
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.standard_normal(3000) * 2.5, rng.uniform(-6.5, 6.5, 1000), [2.0, -2.0, 6.0, 1e-300]])
    assert fixedbits.erf(x).tolist() == [_py_erf(float(v)) for v in x]
    edges = [0.5, 2.0**-60, -(2.0**-54), 1e-310, 1e300]
    y = np.concatenate([np.exp(rng.uniform(-60, 60, 3000)), rng.uniform(-0.99, 1, 1000), edges])
    assert fixedbits.log1p(y).tolist() == [_py_log1p(float(v)) for v in y]
    assert fixedbits.exp(-np.abs(x)).tolist() == [_py_exp(-abs(float(v))) for v in x]


#: Writes the committed golden files into a folder, and hashes the plain computation (and its envelope twin) of the
#: cases the tests and the default report judge against: what the gate's every bound comes from.
_SCRIPT = """
import hashlib, sys
from pathlib import Path
from compare.problem.golden import write_all
from compare.problem.cases import PRESETS
from compare.run.cell import plain_reference
write_all(Path(sys.argv[1]))
h = hashlib.sha256()
for preset, dtype, model in (("tiny", "float32", "geglu"), ("odd", "bfloat16", "gelu-mlp"),
                             ("odd", "float32", "swiglu"), ("tiny", "float16", "linear")):
    p = plain_reference(PRESETS[preset].case(dtype, model=model))
    for k in sorted(p):
        h.update(k.encode()); h.update(p[k].tobytes())
        if p.envelope is not None:
            h.update(p.envelope[k].tobytes())
print(h.hexdigest())
"""


@pytest.mark.isa
@pytest.mark.slow
def test_golden_and_plain_are_the_same_bytes_under_every_blas_kernel(tmp_path: Path) -> None:
    """``make golden`` under each OpenBLAS kernel (and whatever instruction sets the process was started with: CI
    reruns this with them capped) writes exactly the committed files, and the plain computation the gate's bounds
    come from hashes the same: a verdict cannot move with the machine's BLAS."""
    hashes = set()
    for core in CORETYPES:
        out = tmp_path / core
        # the disk cache off: every value computed afresh under this kernel, none read from an earlier process
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "PYTHONPATH": str(ROOT), "FUSION_COMPARE_CACHE": "off"}
        run = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stderr[-2000:]
        hashes.add(run.stdout.strip())
        for f in sorted(GOLDEN_DIR.iterdir()):
            if f.suffix == ".safetensors" or f.name == MANIFEST:
                assert (out / f.name).read_bytes() == f.read_bytes(), f"{f.name} differs under {core}"
    assert len(hashes) == 1, hashes


def test_plain_reference_carries_its_twins() -> None:
    """The plain computation of a float32 case of a model with an activation has an envelope twin (transcendentals a
    few ulp off) that differs from it, and every plain tensor equals its unrounded twin rounded to the dtype."""
    from compare.problem.reference import round_to_dtype
    from compare.run.cell import plain_reference

    p = plain_reference(PRESETS["tiny"].case("float32"))
    assert p.envelope is not None and any(not np.array_equal(p[k], p.envelope[k]) for k in p)
    b = plain_reference(PRESETS["tiny"].case("bfloat16"))
    assert b.envelope is None and b.unrounded is not None
    assert all(np.array_equal(b[k], round_to_dtype(b.unrounded[k], "bfloat16")) for k in b)
    assert any(not np.array_equal(b[k], b.unrounded[k]) for k in b)
    digest = hashlib.sha256(b["y"].tobytes()).hexdigest()
    assert digest == hashlib.sha256(plain_reference(PRESETS["tiny"].case("bfloat16"))["y"].tobytes()).hexdigest()


@pytest.mark.standard
def test_the_disk_cache_returns_the_same_bits_and_recovers_from_a_bad_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generated case (``odd`` at seed 5, not committed) and its plain computation: computed, cached, read back
    bit for bit; a truncated entry is a miss, computed and written again; ``off`` writes nothing."""
    from compare.problem import datacache, golden
    from compare.run.cell import plain_reference

    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))
    case = PRESETS["odd"].case("float32", model="gelu-mlp", seed=5)
    first, p1 = golden._generated(case), plain_reference.__wrapped__(case)
    entries = sorted((tmp_path / "cache").iterdir())
    assert [e.name.split("-")[0] for e in entries] == ["plain", "reference"]
    ref_entry = entries[1]
    again, p2 = golden._generated(case), plain_reference.__wrapped__(case)
    for k in first.ref:
        assert np.array_equal(first.ref[k], again.ref[k]) and np.array_equal(p1[k], p2[k])
        assert p1.envelope is not None and p2.envelope is not None
        assert np.array_equal(p1.envelope[k], p2.envelope[k])
    ref_entry.write_bytes(ref_entry.read_bytes()[:100])  # truncated
    assert datacache.load(ref_entry.name.removesuffix(".safetensors")) is None
    fresh = golden._generated(case)
    assert all(np.array_equal(fresh.ref[k], first.ref[k]) for k in first.ref)
    assert datacache.load(ref_entry.name.removesuffix(".safetensors")) is not None
    monkeypatch.setenv(datacache.ENV, "off")
    assert datacache.folder() is None and datacache.load(ref_entry.name.removesuffix(".safetensors")) is None


@pytest.mark.standard
def test_a_generated_reference_is_computed_as_read_and_equals_the_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generated case's reference (``compare.problem.golden.LazyReference``): its keys cost nothing, reading ``y``
    computes the forward alone, a gradient the whole; every value is :func:`make_golden`'s, bit for bit, for every
    model. The control: counting ``compute``'s calls sees the forward-only call and the whole one."""
    from compare.problem import datacache, golden

    monkeypatch.setenv(datacache.ENV, str(tmp_path / "cache"))
    calls: list[bool] = []
    real = golden.compute

    def counted(model, x, params, dy, ar, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(dy is not None)
        return real(model, x, params, dy, ar, *a, **k)

    for model in ("linear", "geglu", "swiglu", "gelu-mlp"):
        case = PRESETS["odd"].case("bfloat16", model=model, seed=7)
        whole = golden.make_golden(case)
        monkeypatch.setattr(golden, "compute", counted)
        calls.clear()
        lazy = golden._generated(case)
        assert sorted(lazy.ref) == sorted(whole.ref) and calls == []  # the names, nothing computed
        assert "dx" in lazy.ref and "dnope" not in lazy.ref and calls == []  # so is membership
        assert np.array_equal(lazy.ref["y"], whole.ref["y"]) and calls == [False]  # the forward alone
        assert all(np.array_equal(lazy.ref[k], whole.ref[k]) for k in whole.ref) and calls == [False, True]
        assert np.array_equal(golden._generated(case).ref["dx"], whole.ref["dx"]) and calls == [False, True]  # cached
        with pytest.raises(KeyError):
            lazy.ref["dnope"]
        monkeypatch.setattr(golden, "compute", real)


def _matmul64_unshortened(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul64 as defined (module docstring), without its shortcuts: every slice product of every row and column,
    ``ldexp`` for every scaling. The shortcuts must leave every bit of it."""
    k = a.shape[1]
    beta = fixedbits._beta(k)

    def split(m: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        rest, e, out = m.copy(), fixedbits._row_exponents(m) - beta, []
        for _ in range(fixedbits.SLICES):
            ints = np.rint(np.ldexp(rest, -e[:, None]))
            rest = rest - np.ldexp(ints, e[:, None])
            out.append((ints, e.copy()))
            e = e - beta
        return out

    sa, sb = split(a), split(np.ascontiguousarray(b.T))
    out = np.zeros((a.shape[0], b.shape[1]))
    for level in range(fixedbits.SLICES + 1, 1, -1):
        for s in range(max(1, level - fixedbits.SLICES), level):
            (ia, ea), (ib, eb) = sa[s - 1], sb[level - s - 1]
            out += np.ldexp(ia @ ib.T, ea[:, None] + eb[None, :])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_matmul64_shortcuts_keep_every_bit(seed: int) -> None:
    """Rows of zeros, 16-bit values (most rows need one slice), exponents far apart, tiny values near the subnormal
    range, and more columns than one block: the same bits as the form without shortcuts."""
    rng = np.random.default_rng(seed)
    m, k, n = int(rng.integers(1, 40)), int(rng.integers(1, 300)), int(rng.integers(1, 90))
    a = rng.standard_normal((m, k)) * np.exp(rng.uniform(-30, 30, (m, 1)))
    b = rng.standard_normal((k, n)) * np.exp(rng.uniform(-30, 30, (1, n)))
    if seed % 3 == 0:
        a = round_to_dtype(a, "bfloat16").astype(np.float64)
    if seed % 4 == 0:
        a[rng.random(a.shape) < 0.3] = 0.0
        b[:, rng.random(n) < 0.2] = 0.0
    if seed % 5 == 0:
        a *= 1e-300
    want = _matmul64_unshortened(a, b)
    assert np.array_equal(fixedbits.matmul64(a, b).view(np.int64), want.view(np.int64))


def test_bfloat16_rounding_is_round_to_nearest_even_on_the_bit_pattern() -> None:
    """``round_to_dtype(., "bfloat16")`` (``ml_dtypes``' cast) against its definition on the bits: add ``0x7FFF``
    plus the lowest kept bit, clear the low 16 bits; on random float32 bit patterns of every exponent, the largest
    finite values (which round to infinity), subnormals and signed zeros; a NaN keeps its own bits."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 3.4e38, -3.4e38, 1e-45, 9.2e-41], dtype=np.float32)
    a = np.concatenate([bits.view(np.float32), edges])
    wide = a.view(np.uint32).astype(np.uint64)
    want = ((wide + 0x7FFF + ((wide >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    want = np.where(np.isnan(a), a, want)
    assert np.array_equal(round_to_dtype(a, "bfloat16").view(np.uint32), want.view(np.uint32))


#: A mixture-of-experts golden's bytes (``compare.problem.moe``, no committed files: CPU-sized MoE cases are
#: computed when asked): x, every parameter and every reference tensor of each CPU preset in float32 (uniform
#: routing) and bfloat16 (``hot``, the steered draws), hashed in name order.
_MOE_SCRIPT = """
import dataclasses, hashlib
from compare.problem.cases import PRESETS
from compare.problem.golden import make_golden
h = hashlib.sha256()
for preset in ("qwen3-moe-cpu", "mixtral-cpu", "gpt-oss-20b-cpu"):
    for dtype, routing in (("float32", None), ("bfloat16", "hot")):
        g = make_golden(dataclasses.replace(PRESETS[preset].case(dtype), routing=routing))
        for name, a in sorted({"x": g.x, **g.params, **{"ref." + k: v for k, v in g.ref.items()}}.items()):
            h.update(name.encode()); h.update(a.tobytes())
print(h.hexdigest())
"""
#: What :data:`_MOE_SCRIPT` prints on every machine (computed on an AVX-512 Xeon with OpenBLAS's own kernel; a
#: change of the generation recipe or of ``compare.problem.moe`` changes it, and then this line with it).
MOE_GOLDEN_SHA256 = "635be1c42aebb6c4b270148c1fbee81d3fc4d696799c7d8d52a01977da96ef05"


@pytest.mark.isa
@pytest.mark.slow
def test_the_moe_golden_is_the_same_bytes_under_every_blas_kernel() -> None:
    """The MoE goldens (three CPU presets, a steered routing among them) have the bytes recorded here under each
    OpenBLAS kernel and whatever instruction sets the process started with (CI reruns it with them capped): the
    error-free GEMMs and correctly rounded steering keep the MoE golden portable, as the dense one."""
    for core in CORETYPES:
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "PYTHONPATH": str(ROOT), "FUSION_COMPARE_CACHE": "off"}
        run = subprocess.run([sys.executable, "-c", _MOE_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == MOE_GOLDEN_SHA256, core
