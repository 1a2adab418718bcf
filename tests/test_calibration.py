"""The gate's calibration table, on the output ``y`` of every committed case in every dtype: the honest variants
(``tests/variants.py``) never fail; two controls made on the plain computation's own output must fail:

- ``zeroed-tenth``: the smallest tenth of the outputs (by magnitude) set to zero;
- ``scale-1.5u``: the output 1.5 unit roundoffs of the dtype too large, ``y * (1 + 1.5 u)``, made before the last
  rounding to the dtype (as a backend makes it: ``compare.gate.resolution`` injects its scale errors the same way).

What this cannot see: the gradients (``tests/test_controls.py`` judges controls on every tensor), cases and seeds
other than the committed ones (the scale control's margin depends on the plain computation's own scale error, which
is noise: on odd's float32 SwiGLU it is 0.83 unit roundoffs low and leaves the control 1.2x its fail line; on another
seed it may deviate only), and a scale error on top of another accumulation order, whose own noise widens the
paired check's lines.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from compare.formats.codec import from_json, to_json
from compare.gate.parity import WHERE_FAIL, WHERE_MIN, PlainStats, TensorParity, check_tensor, tensor_stats
from compare.problem.cases import Case, committed_cases
from compare.problem.golden import golden_for
from compare.problem.reference import SIGNIFICAND_BITS, round_to_dtype
from compare.run.cell import plain_reference
from tests.variants import VARIANTS, variant_outputs

pytestmark = [pytest.mark.quick, pytest.mark.isa]

CASES = committed_cases()


def zeroed_tenth(y: np.ndarray) -> np.ndarray:
    """``y`` with its ``ceil(n / 10)`` smallest elements by magnitude set to zero (ties by position)."""
    out = np.array(y, dtype=np.float64)
    k = -(-out.size // 10)
    out.reshape(-1)[np.argsort(np.abs(out).ravel(), kind="stable")[:k]] = 0.0
    return out


def _stats(case: Case) -> PlainStats:
    """The gate's statistics of the plain computation of ``y`` on ``case``, with its twins, as ``check_all`` uses."""
    return tensor_stats(golden_for(case).ref, plain_reference(case), "y")


@functools.cache
def _judge(case: Case, what: str) -> TensorParity:
    """The gate's verdict on ``y`` of ``case`` for a control (``zeroed-tenth``, ``scale-1.5u``) or an honest variant
    (``var:<name>``)."""
    plain, ref = plain_reference(case), golden_for(case).ref["y"]
    stats = _stats(case)
    if what == "zeroed-tenth":
        y = zeroed_tenth(plain["y"])
    elif what == "scale-1.5u":
        assert plain.unrounded is not None
        u = 2.0 ** -SIGNIFICAND_BITS[case.dtype]
        y = round_to_dtype(plain.unrounded["y"] * (1.0 + 1.5 * u), case.dtype)
    else:
        y = variant_outputs(what.removeprefix("var:"), case)["y"]
    return check_tensor("y", y, ref, plain["y"], case.dtype, stats)


HONEST = [(f"var:{v.name}", c) for c in CASES if c.model != "linear" for v in VARIANTS if c.dtype in v.dtypes]


@pytest.mark.parametrize(("what", "case"), HONEST, ids=[f"{w}-{c.name}" for w, c in HONEST])
def test_an_honest_variant_never_fails_on_the_output(what: str, case: Case) -> None:
    t = _judge(case, what)
    assert t.tier != "fail", t.why


CONTROL_ROWS = [(w, c) for w in ("zeroed-tenth", "scale-1.5u") for c in CASES]


@pytest.mark.parametrize(("what", "case"), CONTROL_ROWS, ids=[f"{w}-{c.name}" for w, c in CONTROL_ROWS])
def test_a_control_on_the_output_fails(what: str, case: Case) -> None:
    t = _judge(case, what)
    assert t.tier == "fail", t.why


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_controls_change_the_output(case: Case) -> None:
    """A control that leaves the plain computation's bits is no control: each moves ``y`` on every case."""
    plain = plain_reference(case)["y"]
    u = 2.0 ** -SIGNIFICAND_BITS[case.dtype]
    unrounded = plain_reference(case).unrounded
    assert unrounded is not None
    assert np.count_nonzero(zeroed_tenth(plain) != plain) > plain.size // 20
    scaled = round_to_dtype(unrounded["y"] * (1.0 + 1.5 * u), case.dtype)
    assert np.count_nonzero(scaled != plain) > plain.size // 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_where_check_catches_a_zeroed_tenth_in_every_dtype(case: Case) -> None:
    """The ``where`` check fails a zeroed smallest tenth on every case; in bfloat16 it is the only check that does
    (the rms stays below its fail line there: ``NOT_YET``'s old row), so without it those rows would not fail."""
    t = _judge(case, "zeroed-tenth")
    assert "where" in t.failed and t.where_ratio is not None and t.where_ratio > WHERE_FAIL, t.why
    if case.dtype == "bfloat16":
        assert t.failed == ["where"], t.why


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_where_check_is_silent_while_the_rms_error_passes(case: Case) -> None:
    """An error gathered on the smallest outputs but small enough that the rms check passes is not judged by where
    it sits: the zeroed tenth's error scaled to 1.5 x the plain rms error, added to the plain output (its ratio is
    past the ``where`` fail line, its rms below the rms pass line of 2.5 x the plain's)."""
    plain, ref = plain_reference(case), golden_for(case).ref["y"]
    stats = _stats(case)
    bump = zeroed_tenth(plain["y"]) - plain["y"]
    bump *= 1.5 * stats.rms_plain / float(np.sqrt(np.mean(bump**2)))
    y = round_to_dtype(np.asarray(plain["y"], dtype=np.float64) + bump, case.dtype)
    t = check_tensor("y", y, ref, plain["y"], case.dtype, stats)
    assert t.where_ratio is not None and t.where_ratio > WHERE_FAIL, t
    assert t.rms_err <= t.rms_bound and "where" not in t.failed, t.why


def test_a_parity_document_from_before_the_where_check_reads_back() -> None:
    """``where_ratio`` is optional: a stored tensor verdict without it reads as None and writes back without it."""
    d = to_json(_judge(CASES[0], "zeroed-tenth"))
    assert isinstance(d.pop("where_ratio"), float)
    old = from_json(TensorParity, d)
    assert old.where_ratio is None and to_json(old) == d


@pytest.mark.parametrize(("n", "judged"), [(96, False), (10 * WHERE_MIN - 10, False), (10 * WHERE_MIN - 9, True)])
def test_the_where_check_needs_enough_small_elements(n: int, judged: bool) -> None:
    """The same gathered error (four times the rest's on the smallest tenth, the rms past its pass line) fails the
    ``where`` check only where that tenth holds :data:`WHERE_MIN` elements or more: over fewer, one element decides
    the ratio (a 96-element bias gradient summed in float16 reached 2.17 on one fresh draw)."""
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(n) * 10.0
    plain = round_to_dtype(ref, "float16")
    e = rng.standard_normal(n) * 0.05  # past the rms pass line: the where check is active
    e[np.argsort(np.abs(ref))[: -(-n // 10)]] *= 4.0
    y = round_to_dtype(ref + e, "float16")
    t = check_tensor("db2", y, ref, plain, "float16")
    assert t.rms_err > t.rms_bound and t.where_ratio is not None and t.where_ratio > WHERE_FAIL, t
    assert ("where" in t.failed) is judged, t.why
