"""Mixture-of-experts blocks as cases of the tool (``moe-qwen3``, ``moe-mixtral``, ``moe-gpt-oss``): the case and its
presets, the golden and the plain computation through the same paths as a dense model's (``golden_for``,
``compute_of``, ``plain_run_of``), each the ``compare.problem.moe`` block of the model's spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compare.backends.registry import BACKENDS
from compare.cli.args import default_backends
from compare.cli.main import main
from compare.problem import moe
from compare.problem.cases import MODELS, MOE_MODELS, PRESETS, Case, Shape
from compare.problem.golden import compute_of, golden_for, plain_run_of, reference_names
from compare.problem.reference import Arith
from compare.results.document import Result, read_json
from compare.run.cell import plain_reference
from compare.run.pipeline import skipped

pytestmark = pytest.mark.standard

#: each CPU preset (the real expert count and top-k, dim 64, hidden 32, 24 tokens) and its model
CPU_PRESETS = {"qwen3-moe-cpu": "moe-qwen3", "mixtral-cpu": "moe-mixtral", "gpt-oss-20b-cpu": "moe-gpt-oss"}


def test_the_moe_models_are_cases_kept_out_of_the_dense_models() -> None:
    """Each MoE model is a case with its spec's parameters at the shape's dim and hidden; none is in ``MODELS``
    (which the dense enumerations walk); every MoE preset, the full-size ones too, names its model and shape."""
    assert set(MOE_MODELS) == set(moe.MOE_SPECS) and not set(MOE_MODELS) & set(MODELS)
    for name, model in CPU_PRESETS.items():
        p = PRESETS[name]
        assert p.model == model and p.shape == Shape(1, 24, 64, 32)
        case = p.case("bfloat16")
        spec = moe.MOE_SPECS[model]
        assert spec == moe.MOE_PRESETS[name].spec
        assert case.weight_shapes() == spec.weight_shapes(64, 32)
        assert case.output_shape() == case.input_shape() == (1, 24, 64)
    for name in ("qwen3-moe", "mixtral", "gpt-oss-20b"):
        m = moe.MOE_PRESETS[name]
        assert PRESETS[name].shape == Shape(1, m.tokens, m.dim, m.hidden)
        assert moe.MOE_SPECS[PRESETS[name].model] == m.spec


@pytest.mark.parametrize("name", list(CPU_PRESETS))
def test_the_golden_and_the_plain_computation_are_the_blocks(name: str) -> None:
    """The golden (``golden_for``) is ``moe_fwd_bwd`` in ``Arith.exact()`` on the case's inputs and weights, its
    tensors ``y``, ``dx`` and ``d<param>`` for every parameter (no ``routing`` or ``logits``: not tensors to judge);
    the plain computation (``plain_run_of``) is the block in ``Arith.plain(dtype, final=False)`` routed to the
    golden's experts, without twins; ``chosen`` routes both elsewhere."""
    case = PRESETS[name].case("bfloat16")
    spec = moe.MOE_SPECS[case.model]
    g = golden_for(case)
    assert list(g.ref) == list(reference_names(case)) == ["y", "dx", *(f"d{p}" for p in spec.weight_shapes(64, 32))]
    x, dy = g.x.reshape(24, 64), g.dy.reshape(24, 64)
    exact = moe.moe_fwd_bwd(x, g.params, dy, Arith.exact(), spec)
    for k in g.ref:
        assert np.array_equal(np.asarray(g.ref[k]).reshape(exact[k].shape), exact[k]), k
    experts, logits = moe.golden_routing(x, g.params, spec)
    assert np.array_equal(experts, exact["routing"]) and np.array_equal(logits, exact["logits"])
    unrounded, envelope, signature = plain_run_of(case, g.x, g.params, g.dy)
    assert envelope is None and signature is None and set(unrounded) == set(g.ref)
    plain = moe.moe_fwd_bwd(x, g.params, dy, Arith.plain("bfloat16", final=False), spec, chosen=experts)
    for k in g.ref:
        assert np.array_equal(unrounded[k].reshape(plain[k].shape), plain[k]), k
    assert set(plain_reference(case)) == set(g.ref)  # the gate's yardstick: finite, in range
    # routed elsewhere: the first token's last expert swapped for one it does not take
    other = experts.copy()
    other[0, -1] = next(e for e in range(spec.experts) if e not in experts[0])
    routed = compute_of(case, g.x, g.params, g.dy, Arith.exact(), chosen=other)
    assert np.array_equal(routed["y"][0, 1:], np.asarray(g.ref["y"])[0, 1:])
    assert not np.array_equal(routed["y"][0, 0], np.asarray(g.ref["y"])[0, 0])


def test_a_dense_case_takes_no_chosen_experts() -> None:
    case = Case("geglu", Shape(1, 4, 8, 16), "float32")
    g = golden_for(case)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        compute_of(case, g.x, g.params, g.dy, Arith.exact(), chosen=np.zeros((4, 2), dtype=np.int64))


FAST = ["--budget", "0.05", "--no-ceilings", "--no-plots", "--quiet"]


def _run(tmp_path: Path, *args: str) -> tuple[int, list[Result]]:
    """``python -m compare run ARGS`` through ``main``: its exit status and its results."""
    out = tmp_path / "out"
    status = main(["run", *args, *FAST, "--out", str(out)])
    return status, list(read_json(out / "results.json").results)


#: The MoE backends: a MoE case's default backend list.
MOE_BACKENDS = ("torch-moe-loop", "torch-moe-grouped", "jax-moe-dense", "jax-moe-ragged")


def test_a_moe_case_runs_its_four_backends_and_every_other_backend_skips_it(tmp_path: Path) -> None:
    """``--preset mixtral-cpu`` through the command line, no ``--backend``: the four MoE backends run and pass in
    float32 forward and backward; every other registered backend skips a MoE case, saying why."""
    case = PRESETS["mixtral-cpu"].case("float32")
    assert default_backends([1], case.model) == list(MOE_BACKENDS)
    for name, s in BACKENDS.items():
        if name not in MOE_BACKENDS:
            r = skipped(s, case, "fwd+bwd")
            assert r is not None and r.status == "skipped" and r.reason.endswith("only, not moe-mixtral"), name
    status, results = _run(tmp_path, "--preset", "mixtral-cpu", "--mode", "fwd+bwd")
    assert status == 0 and [r.backend for r in results] == list(MOE_BACKENDS)
    assert all(r.status == "ok" for r in results), [(r.backend, r.reason) for r in results]
