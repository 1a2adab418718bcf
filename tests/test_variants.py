"""Where the gate's fail lines sit: honest implementation differences (``tests/variants.py``) never fail, in every
dtype and mode, and the standard errors of its bias tests hold on heavy-tailed inputs, checked against the spread
over seeds. The negative controls that must fail are in ``tests/test_controls.py``."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compare.gate.parity import Z_SCORE, check_all, slope_fit, tensor_stats
from compare.problem.cases import MODES, PRESETS, Case, committed_cases
from compare.problem.golden import golden_for
from compare.run.cell import MODE_TENSORS, plain_reference
from tests.variants import VARIANTS, Variant, variant_outputs

pytestmark = pytest.mark.quick

MLP_CASES = [c for c in committed_cases() if c.model != "linear"]
PAIRS = [(v, c) for v in VARIANTS for c in MLP_CASES if c.dtype in v.dtypes]


@pytest.mark.isa
@pytest.mark.parametrize(("variant", "case"), PAIRS, ids=[f"{v.name}-{c.name}" for v, c in PAIRS])
def test_an_honest_variant_never_fails(variant: Variant, case: Case) -> None:
    """Every tensor of every mode is in the pass or deviates tier."""
    out = variant_outputs(variant.name, case)
    plain = plain_reference(case)
    ref = golden_for(case).ref
    for mode in MODES:
        want = MODE_TENSORS[mode]
        p = check_all({k: v for k, v in out.items() if want(k)}, ref, plain, case.dtype)
        failing = {t.tensor: t.why for t in p.tensors if t.tier == "fail"}
        assert not failing, f"{variant.name} ({variant.what}) fails on {case.name} {mode}: {failing}"


def _changes(variant: Variant, case: Case) -> bool:
    out, plain = variant_outputs(variant.name, case), plain_reference(case)
    return any(not np.array_equal(out[k], plain[k]) for k in out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_every_variant_changes_the_bits_in_each_dtype_it_is_run_in(dtype: str) -> None:
    """A variant that computes the plain computation's very bits is no control: each changes some output on some
    committed case of every dtype it claims. (On a given case it may not: blocks of 256 on a sum of at most 200
    terms are one block; a float32 exp 4 ulp off vanishes in bf16 rounding.)"""
    for v in VARIANTS:
        if dtype in v.dtypes:
            assert any(_changes(v, c) for c in MLP_CASES if c.dtype == dtype), f"{v.name} changes nothing in {dtype}"


def test_a_biased_float32_transcendental_deviates_never_fails_and_its_bias_is_measured() -> None:
    """Not every variant passes: a float32 tanh / exp 4 ulp off all one way is a real, measured difference (deviates)
    on some float32 tensors, so the pass tier means something; in 16-bit dtypes it vanishes. It never fails, and on
    ``y`` of every float32 case with an activation the scale check's fit finds it: the fitted bias is within an ulp
    of the variant's (+4 or -4), many standard errors from zero, while the pure scale beside it stays within a fifth
    of a unit roundoff (measured:
    3.55 to 4.40 ulp, standard errors 0.08 to 0.64; scale 0.14 u at most). Without the fit, the bias moved y's scale
    by up to 2.3 unit roundoffs, more than a wrong scale of 1.5 (tests/test_calibration.py). Every deviating tensor's
    cause names the fitted bias as measured, within an ulp of the variant's."""
    for name, want in (("transcendental+4ulp", 4.0), ("transcendental-4ulp-low", -4.0)):
        tiers: dict[str, set[str]] = {}
        for v, c in PAIRS:
            if v.name != name:
                continue
            got, ref, plain = variant_outputs(name, c), golden_for(c).ref, plain_reference(c)
            tensors = check_all(got, ref, plain, c.dtype).tensors
            tiers.setdefault(c.dtype, set()).update(t.tier for t in tensors)
            for t in tensors:  # a deviation names the fitted bias as what it is: measured, with its size
                if t.tier == "deviates":
                    m = re.match(r"measured: the fitted shape of a float32 tanh / exp ([+-][0-9.]+) ulp off", t.cause)
                    assert m is not None and abs(float(m.group(1)) - want) < 1.0, (c.name, t.tensor, t.cause)
            if c.dtype == "float32":
                stats = tensor_stats(ref, plain, "y")
                b, _, fitted = slope_fit(got["y"] - plain["y"], ref["y"], stats.directions)
                assert fitted is not None, c.name
                ulps, se = fitted
                assert abs(ulps - want) < 1.0 and abs(ulps) > Z_SCORE * se and abs(b) < 0.2 * 2.0**-24, (c.name, fitted)
        assert tiers == {"float32": {"pass", "deviates"}, "bfloat16": {"pass"}, "float16": {"pass"}}, (name, tiers)


#: Unbiased honest variants: their bias against the plain computation is rounding noise, so its z-score over seeds
#: (the data drawn anew each time) must look like a standard normal's if the standard errors are right.
UNBIASED = ("reversed", "pairwise")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["geglu", "gelu-mlp"])
def test_bias_standard_errors_hold_on_heavy_tailed_inputs(model: str) -> None:
    """On the heavy-tailed ``odd`` case (Student t, 3 degrees of freedom) in float32, over 10 seeds, the z-scores of
    the shift and scale differences of unbiased variants have a spread near one (at most 1.3) and stay well inside
    the pass line: the cluster-robust (two-way) standard errors hold where the old estimator's spread was 2x."""
    zs: dict[str, list[float]] = {"shift": [], "scale": []}
    for seed in range(10):
        case = PRESETS["odd"].case("float32", model=model, seed=seed)
        ref, plain = golden_for(case).ref, plain_reference(case)
        for name in UNBIASED:
            for t in check_all(variant_outputs(name, case), ref, plain, case.dtype).tensors:
                zs["shift"].append((t.mean_err - t.mean_plain) / (t.mean_bound / Z_SCORE))
                zs["scale"].append((t.scale_err - t.scale_plain) / (t.scale_bound / Z_SCORE))
    for check, z in zs.items():
        arr = np.array(z)
        assert arr.std() <= 1.3, (check, arr.std())
        assert np.abs(arr).max() < Z_SCORE, (check, np.abs(arr).max())
