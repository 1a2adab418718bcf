"""What a failing backend computes instead (``compare.gate.near_variants``): a backend computing each near variant of
its model (``tests/near_variant_backend.py``, the variant made by hand) fails or deviates and is named as exactly
that variant; an honest backend gets no variant check; one wrong in a way no variant is ("scaled", "noisy") is
"unexplained"; a variant the gate cannot tell from the model on a draw (gpt-oss's clamp on inputs that never reach
its limit, the erf GELU in bfloat16 on ``tiny``) is never named there, and said so.

What the CPU presets can name: every variant of every model in float32; in bfloat16 all but the erf GELU (on
``tiny`` the two GELU forms are not told apart at bfloat16, as the resolution rows say). gpt-oss's clamp never binds
on its CPU preset's normal draws (gate reaches about 4.3 of the limit 7): a backend without it, or with it at 10,
passes there; on the heavy-tailed draw (Student's t, 3 dof, the ``odd`` preset's distribution) of seed 14, 42 gate or
up values pass 7 and 11 pass 10, and both are named; on seed 0 values pass 7 but none passes 10, so the two are not
told apart from each other and the row says so."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from compare.backends.registry import register, unregister
from compare.cli.main import main
from compare.gate import near_variants, routing
from compare.gate.parity import Parity
from compare.problem.cases import PRESETS, Case
from compare.problem.golden import golden_for
from compare.results.document import read_json
from compare.run import pipeline
from compare.run.cell import plain_reference
from tests import near_variant_backend as vb

pytestmark = pytest.mark.standard

#: A case of each model: ``tiny``'s shape for the GLU models and the GELU MLP, the blog's linear layer, each MoE
#: model's CPU preset.
MODEL_CASES = {
    "geglu": "tiny",
    "swiglu": "tiny",
    "gelu-mlp": "tiny",
    "linear": "blog-linear",
    "moe-qwen3": "qwen3-moe-cpu",
    "moe-mixtral": "mixtral-cpu",
    "moe-gpt-oss": "gpt-oss-20b-cpu",
}
#: (model, dtype, variant) the gate cannot tell from the model on its case's golden draw: a backend computing it
#: passes, and nothing is named
UNSEEN = {
    ("geglu", "bfloat16", "erf-gelu"),
    ("gelu-mlp", "bfloat16", "erf-gelu"),
    *(("moe-gpt-oss", d, v) for d in ("float32", "bfloat16") for v in ("clamp-dropped", "clamp-at-10")),
}


def case_of(model: str, dtype: str, dist: str = "normal", seed: int = 0) -> Case:
    c = PRESETS[MODEL_CASES[model]].case(dtype)
    return dataclasses.replace(c, model=model, dist=dist, seed=seed)


def judged(case: Case, variant: str) -> Parity:
    """The gate's verdict on the first call of ``numpy-variant`` computing ``variant`` (``pipeline.judge_read``, a
    MoE step's routing by its rule), with what it computes instead (``near_variants.explained``), as ``first_calls``
    gives them."""
    g = golden_for(case)
    out = vb.forward(case.model, variant, g.x, g.params, case.dtype)
    ref, plain = {"y": g.ref["y"]}, plain_reference(case, backward=False)
    draw = routing.golden_draw(case, ("y",))
    first = pipeline.judge_read([("cpu", out)], ref, plain, case.dtype, "test", False, draw)
    ((_, parity),) = near_variants.explained(first, [("cpu", out)], case, ref, plain, draw)
    return parity


EVERY = [(m, d, v.name) for m in MODEL_CASES for d in ("float32", "bfloat16") for v in near_variants.VARIANTS[m]]


@pytest.mark.parametrize(("model", "dtype", "variant"), EVERY, ids=["-".join(e) for e in EVERY])
def test_a_backend_computing_a_variant_fails_and_is_named(model: str, dtype: str, variant: str) -> None:
    """Each near variant of each model, on its case's golden draw: the backend fails (or deviates) and is named as
    exactly that variant, by its words, in the reason; where the gate cannot tell the variant from the model
    (:data:`UNSEEN`) the backend passes and no variant is checked."""
    p = judged(case_of(model, dtype), variant)
    if (model, dtype, variant) in UNSEEN:
        assert p.passed and p.variants is None
        return
    (v,) = [v for v in near_variants.VARIANTS[model] if v.name == variant]
    assert p.tier in ("fail", "deviates") and p.variants is not None
    assert p.variants.computes == (v.words,), p.variants
    findings = p.failures() if p.tier == "fail" else p.deviations()
    assert findings[-1] == f"computes {v.words}"


@pytest.mark.parametrize("model", list(MODEL_CASES))
def test_an_honest_backend_is_not_checked_against_variants(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model itself passes, and no variant's golden is computed (the check costs a passing step nothing)."""

    def refuse(*_: object) -> None:
        raise AssertionError("a passing step was checked against its variants")

    monkeypatch.setattr(near_variants, "check", refuse)
    p = judged(case_of(model, "bfloat16"), "honest")
    assert p.passed and p.variants is None


@pytest.mark.parametrize("wrong", ["scaled", "noisy"])
@pytest.mark.parametrize("model", ["geglu", "gelu-mlp", "moe-qwen3", "moe-gpt-oss"])
def test_a_backend_wrong_in_an_unlisted_way_is_unexplained(model: str, wrong: str) -> None:
    """Its output times 1.01, or with noise of 1% of its rms: it fails, every variant was tried and none is named."""
    p = judged(case_of(model, "float32"), wrong)
    assert p.tier == "fail" and p.variants is not None
    assert p.variants.computes == () and p.variants.tried == tuple(v.name for v in near_variants.VARIANTS[model])
    assert p.failures()[-1].startswith("unexplained (none of its ") and p.variants.short == "unexplained"


def test_the_clamp_is_named_only_where_it_binds() -> None:
    """gpt-oss's clamp variants on heavy-tailed draws: seed 14 (values past 7 and past 10) names each exactly, in
    both dtypes; seed 0 (past 7, none past 10) names the clamp dropped and says the clamp at 10 was not told apart;
    on the normal draw, where the clamp never binds, a failure of another kind lists both as unseen."""
    for dtype in ("float32", "bfloat16"):
        for name, words in (
            ("clamp-dropped", "SwiGLU without the clamp"),
            ("clamp-at-10", "SwiGLU with the clamp at 10 instead of 7"),
        ):
            p = judged(case_of("moe-gpt-oss", dtype, "student_t", 14), name)
            assert p.tier == "fail" and p.variants is not None and p.variants.computes == (words,), (dtype, name)
    p = judged(case_of("moe-gpt-oss", "float32", "student_t", 0), "clamp-at-10")
    assert p.variants is not None and p.failures()[-1] == (
        "computes SwiGLU without the clamp (or SwiGLU with the clamp at 10 instead of 7: not told apart here)"
    )
    p = judged(case_of("moe-gpt-oss", "float32"), "scaled")
    assert p.variants is not None and p.variants.unseen == ("clamp-dropped", "clamp-at-10")
    assert "not told apart from the model on these inputs: clamp-dropped, clamp-at-10" in p.failures()[-1]


def test_a_step_whose_y_passes_is_not_explained_by_its_y() -> None:
    """A verdict that fails on a gradient alone (its ``y`` passes): the variants, told apart on ``y``, are not
    tried."""
    case = case_of("swiglu", "float32")
    g = golden_for(case)
    ref, plain = {"y": g.ref["y"]}, plain_reference(case, backward=False)
    out = vb.forward(case.model, "honest", g.x, g.params, case.dtype)
    p = pipeline.judge_read([("cpu", out)], ref, plain, case.dtype, "test", False)[0][1]
    failing = dataclasses.replace(p, tensors=(*p.tensors, dataclasses.replace(p.tensors[0], tensor="dx", tier="fail")))
    check = near_variants.check(case, failing, out, ref, plain)
    assert check is not None and check.computes == () and check.short == "unexplained"
    assert check.words == "unexplained (its y passes; the variants are told apart on y alone)"


FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet", "--mode", "fwd", "--backend", vb.NAME]


@pytest.fixture
def registered() -> Iterator[None]:
    register(vb.SPEC)
    yield
    unregister(vb.NAME)


@pytest.mark.parametrize(
    ("args", "variant", "words"),
    [
        (["--preset", "tiny"], "erf-gelu", "GeGLU with the erf GELU instead of the tanh form"),
        (["--preset", "gpt-oss-20b-cpu", "--dtype", "bfloat16"], "plus-one-dropped", "SwiGLU without the + 1 on up"),
        (["--preset", "mixtral-cpu"], "scaled", ""),
    ],
    ids=["geglu-erf", "gpt-oss-plus-one", "mixtral-scaled"],
)
def test_the_row_says_what_the_backend_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registered: None, args: list[str], variant: str, words: str
) -> None:
    """Through ``python -m compare run``: the row stays ``parity-fail``; its reason, its stored parity
    (``results.json``, read back) and its REPORT.md parity cell say what it computes, or "unexplained"."""
    monkeypatch.setenv(vb.ENV, variant)
    out = tmp_path / "out"
    assert main(["run", *args, *FAST, "--out", str(out)]) == 1
    (r,) = read_json(out / "results.json").results
    assert r.status == "parity-fail" and r.parity is not None and r.parity.variants is not None
    said = f"computes {words}" if words else "unexplained"
    assert r.parity.variants.short == said
    assert f"; {said}" in r.reason
    assert f"; {said}" in (out / "REPORT.md").read_text()


def test_a_passing_row_stores_no_variant_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registered: None
) -> None:
    """An honest row's ``results.json`` has no ``variants`` key (the field is left out at its default: older
    documents read the same)."""
    monkeypatch.setenv(vb.ENV, "honest")
    out = tmp_path / "out"
    assert main(["run", "--preset", "qwen3-moe-cpu", *FAST, "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["results"][0]["status"] == "ok" and "variants" not in doc["results"][0]["parity"]
    (r,) = read_json(out / "results.json").results
    assert r.parity is not None and r.parity.variants is None
    assert np.isfinite(r.parity.worst_ratio)


#: (variant, MoeSpec changes, dist, seed) of gpt-oss's block run through the torch ops' own options
TORCH = [
    ("concatenated", {"layout": "concat"}, "normal", 0),
    ("plus-one-dropped", {"offset": 0.0}, "normal", 0),
    ("softmax-before-top-k", {"order": "softmax-topk", "renormalize": False}, "normal", 0),
    ("clamp-dropped", {"limit": float("inf")}, "student_t", 14),
    ("clamp-at-10", {"limit": 10.0}, "student_t", 14),
]


@pytest.mark.parametrize(("variant", "change", "dist", "seed"), TORCH, ids=[t[0] for t in TORCH])
def test_the_torch_ops_computing_a_variant_are_named(
    variant: str, change: dict[str, object], dist: str, seed: int
) -> None:
    """``torch_impl.moe_ops.moe_loop`` in bfloat16 with gpt-oss's spec changed by its own options (the layout, the
    ``+ 1``, the router order, the clamp) on the case's golden inputs: named as that variant."""
    import torch

    from torch_impl import moe_ops

    case = case_of("moe-gpt-oss", "bfloat16", dist, seed)
    g = golden_for(case)
    spec = dataclasses.replace(moe_ops.MOE_SPECS[case.model], **change)  # type: ignore[arg-type]
    params = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in g.params.items()}
    with torch.no_grad():
        y, experts = moe_ops.moe_loop(torch.from_numpy(g.x.reshape(24, 64)).to(torch.bfloat16), params, spec)
    out = {"y": y.double().numpy().reshape(g.x.shape), "routing": experts.numpy().astype(np.float64)}
    ref, plain = {"y": g.ref["y"]}, plain_reference(case, backward=False)
    draw = routing.golden_draw(case, ("y",))
    first = pipeline.judge_read([("cpu", out)], ref, plain, case.dtype, "test", False, draw)
    ((_, p),) = near_variants.explained(first, [("cpu", out)], case, ref, plain, draw)
    (v,) = [v for v in near_variants.VARIANTS[case.model] if v.name == variant]
    assert p.tier in ("fail", "deviates") and p.variants is not None and p.variants.computes == (v.words,), p
