"""Mixture-of-experts blocks as cases of the tool (``moe-qwen3``, ``moe-mixtral``, ``moe-gpt-oss``): the case and its
presets, the golden and the plain computation through the same paths as a dense model's (``golden_for``,
``compute_of``, ``plain_run_of``), each the ``compare.problem.moe`` block of the model's spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from compare.backends.registry import BACKENDS, register, unregister
from compare.cli.args import default_backends
from compare.cli.main import main
from compare.formats.codec import to_json
from compare.gate import fresh, routing
from compare.gate.parity import Parity, check_all
from compare.problem import moe
from compare.problem.cases import MODELS, MOE_MODELS, PRESETS, Case, InputError, Shape
from compare.problem.golden import compute_of, golden_for, plain_run_of, reference_names
from compare.problem.reference import Arith
from compare.results.document import Result, read_json
from compare.run import preflight
from compare.run.cell import plain_reference
from compare.run.pipeline import Spot, skipped, spot_failures
from tests import moe_variant_backend
from torch_impl import moe_ops

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


#: The MoE backends the runs below take: the eager and jitted forms (the compiled, Triton and Pallas ones are
#: tests/test_moe_kernels.py's).
MOE_BACKENDS = ("torch-moe-loop", "torch-moe-grouped", "jax-moe-dense", "jax-moe-ragged")
#: A MoE case's default backend list: every backend that implements the MoE models, in the registry's order.
DEFAULT_MOE_BACKENDS = (
    "torch-moe-loop", "torch-moe-grouped", "torch-moe-loop-compile", "torch-moe-grouped-compile", "torch-moe-triton",
    "jax-moe-dense", "jax-moe-ragged", "jax-moe-pallas",
)  # fmt: skip


def test_a_moe_case_runs_its_backends_and_every_other_backend_skips_it(tmp_path: Path) -> None:
    """A MoE case's default backends are the MoE ones; ``--preset mixtral-cpu`` through the command line: the four
    eager and jitted MoE backends run and pass in float32 forward and backward; every other registered backend skips
    a MoE case, saying why."""
    case = PRESETS["mixtral-cpu"].case("float32")
    assert default_backends([1], case.model) == list(DEFAULT_MOE_BACKENDS)
    for name, s in BACKENDS.items():
        if name not in DEFAULT_MOE_BACKENDS:
            r = skipped(s, case, "fwd+bwd")
            assert r is not None and r.status == "skipped" and r.reason.endswith("only, not moe-mixtral"), name
    status, results = _run(tmp_path, "--preset", "mixtral-cpu", "--mode", "fwd+bwd", "--backend", *MOE_BACKENDS)
    assert [r.backend for r in results] == list(MOE_BACKENDS)
    assert all(r.status == "ok" for r in results), [(r.backend, r.status, r.reason) for r in results]
    assert status == 0
    # the fusion headroom is torch's MoE baseline's (measured with --profile), JAX has none; no plan says more
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "Fusion headroom: torch: not measured (torch-moe-loop not profiled with kernel times" in md
    assert "jax: no unfused baseline registered (a mixture-of-experts block has no cost-model plan" in md


#: (preset, seed) of the full runs: every MoE CPU preset, each on seeds of its own
RUNS = [("qwen3-moe-cpu", 0), ("mixtral-cpu", 1), ("gpt-oss-20b-cpu", 2), ("qwen3-moe-cpu", 3), ("mixtral-cpu", 4),
        ("gpt-oss-20b-cpu", 5)]  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread while the test runs (restored after): on a busy 2-core machine the MoE loop's
    many small ``index_add_`` calls wait for a second OpenMP thread (34 ms a call profiled in float32; a preset's run
    took 54 s so, 22.5 s on one thread: MOE_NOTES.md)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("preset", "seed"), RUNS, ids=[f"{p}-s{s}" for p, s in RUNS])
def test_every_moe_backend_passes_or_deviates_on_every_preset(tmp_path: Path, preset: str, seed: int) -> None:
    """``run --preset P --dtype float32 bfloat16 --mode fwd+bwd --budget 0.05 --no-ceilings --no-plots --seed S``
    (warm timings only, to keep the test short): each of the four MoE backends passes or deviates in both dtypes,
    its routing judged (near-ties counted, no wrong router) on the golden inputs and on fresh ones."""
    status, results = _run(
        tmp_path, "--preset", preset, "--dtype", "float32", "bfloat16", "--mode", "fwd+bwd", "--seed", str(seed),
        "--cache", "warm", "--backend", *MOE_BACKENDS,
    )  # fmt: skip
    assert sorted((r.backend, r.dtype) for r in results) == sorted(
        (b, d) for b in MOE_BACKENDS for d in ("float32", "bfloat16")
    )
    for r in results:
        assert r.status in ("ok", "deviates"), (r.backend, r.dtype, r.reason)
        assert r.parity is not None and r.parity.routing is not None and not r.parity.routing.wrong_tokens
        assert r.parity.fresh is not None and r.parity.fresh.routing is not None
    assert status == 0


# --- routing: near-ties judged against the golden of the backend's own choice, a wrong router failed --------------


def _swapped_near_tie(draw: routing.Draw) -> tuple[int, np.ndarray]:
    """The token of ``draw`` whose k-th and (k+1)-th logits are closest, and the golden's experts with those two
    swapped there (a choice within the tolerance: a near-tie taken the other way)."""
    k = draw.k
    order = np.argsort(-draw.logits, axis=1, kind="stable")
    gaps = draw.logits[np.arange(len(order)), order[:, k - 1]] - draw.logits[np.arange(len(order)), order[:, k]]
    t = int(np.argmin(gaps))
    chosen = draw.experts.copy()
    chosen[t, chosen[t] == order[t, k - 1]] = order[t, k]
    assert gaps[t] <= 2 * draw.tol[t]  # a near-tie: routable
    return t, chosen


def test_the_routing_rule_judges_a_near_tie_against_its_own_golden_and_fails_a_wrong_router() -> None:
    """The gate's rule on the golden draw of qwen3-moe-cpu in bfloat16 (``routing.Draw``), on outputs made of the
    plain computation: the golden's experts are judged as today; a near-tie taken the other way is routable and
    judged against the golden and the plain computation of that choice (a pass, one token rerouted), where against
    the golden's own routing the same outputs fail; a token routed to its last-ranked expert is a wrong router,
    named."""
    case = PRESETS["qwen3-moe-cpu"].case("bfloat16")
    g = golden_for(case)
    names = tuple(g.ref)
    draw = routing.golden_draw(case, names)
    assert draw is not None and routing.golden_draw(PRESETS["tiny"].case("bfloat16"), ("y",)) is None
    ref, plain = {k: g.ref[k] for k in names}, plain_reference(case)

    def check(got: dict[str, np.ndarray], r: Any, p: Any) -> Parity:
        return check_all(got, r, p, "bfloat16")

    same = draw.judge(dict(plain), draw.experts, ref, plain, check, "test")
    assert same.tier == "pass" and same.routing is not None and same.routing.rerouted == 0
    assert same.routing.near_ties >= 1 and same.routing.tol > 0
    t, chosen = _swapped_near_tie(draw)
    theirs = dict(draw.of(chosen)[1])  # what an honest backend that took the near-tie the other way computes
    routed = draw.judge(theirs, chosen, ref, plain, check, "test")
    assert routed.tier == "pass" and routed.routing is not None and routed.routing.rerouted == 1
    assert check(theirs, ref, plain).tier == "fail"  # against the golden's own routing: a whole expert off
    wrong = draw.experts.copy()
    last = int(np.argmin(draw.logits[t]))
    wrong[t, -1] = last
    bad = draw.judge(dict(plain), wrong, ref, plain, check, "test")
    assert bad.tier == "fail" and bad.routing is not None and bad.routing.wrong_tokens == 1
    assert bad.failures()[0].startswith(f"routing: routes token {t} to experts {sorted(wrong[t].tolist())}; no logits")
    assert "(a wrong router)" in bad.failures()[0]
    with pytest.raises(RuntimeError, match="returned no routing"):
        draw.judge(dict(plain), None, ref, plain, check, "test")


def _nudge(monkeypatch: pytest.MonkeyPatch, units: float, wrong: bool = False) -> None:
    """torch-moe-loop's router logits perturbed on every call (``moe_ops._logits``): with ``units``, on every token
    the k-th and (k+1)-th logits moved towards each other by ``units`` unit roundoffs of bfloat16 times the row's
    largest |logit| each (so a near-tie closer than twice that is taken the other way; the gate's tolerance is at
    least 2 such units: ``routing.ROUND_UNITS``); with ``wrong``, the largest and the smallest logit of every token
    swapped (each moved by the row's whole range: far beyond any tolerance)."""
    real = moe_ops._logits

    def nudged(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        lg = real(x, params).float()  # float32: the router takes it as it is (bfloat16 would round it again)
        rows = torch.arange(lg.shape[0])
        order = torch.argsort(lg.detach(), dim=1, descending=True, stable=True)
        if wrong:  # a permutation of each row's logits: its largest and smallest trade places
            idx = torch.arange(lg.shape[1]).repeat(lg.shape[0], 1)
            idx[rows, order[:, 0]], idx[rows, order[:, -1]] = order[:, -1], order[:, 0]
            return lg.gather(1, idx)
        k = moe_ops.MOE_SPECS["moe-qwen3"].top_k
        delta = units * 2.0**-8 * lg.detach().abs().amax(dim=1)
        bump = torch.zeros_like(lg.detach())
        bump[rows, order[:, k - 1]], bump[rows, order[:, k]] = -delta, delta
        return lg + bump

    monkeypatch.setattr(moe_ops, "_logits", nudged)


def test_a_backend_that_takes_near_ties_the_other_way_passes_and_a_wrong_router_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch-moe-loop with its logits nudged by half a unit roundoff of bfloat16 (x the row's largest |logit|), a
    quarter of the gate's tolerance: it takes some near-ties the other way on the golden draw and on the fresh one,
    and passes, its tensors judged against the golden of its own routing, the tokens it rerouted counted. Negative
    control: the same backend with each token's largest and smallest logit swapped fails as a wrong router, on the
    golden inputs and on fresh ones."""
    args = ("--preset", "qwen3-moe-cpu", "--dtype", "bfloat16", "--mode", "fwd+bwd", "--backend", "torch-moe-loop")
    _nudge(monkeypatch, 0.5)
    status, (r,) = _run(tmp_path / "near", *args, "--cache", "warm")
    assert status == 0 and r.status in ("ok", "deviates"), r.reason
    assert r.parity is not None and r.parity.routing is not None and r.parity.routing.rerouted >= 1
    assert r.parity.fresh is not None and r.parity.fresh.routing is not None
    assert r.parity.routing.rerouted <= r.parity.routing.near_ties
    _nudge(monkeypatch, 0.0, wrong=True)
    status, (r,) = _run(tmp_path / "wrong", *args, "--cache", "warm")
    assert status == 1 and r.status == "parity-fail"
    assert r.parity is not None and r.parity.routing is not None and r.parity.routing.wrong_tokens == 24
    assert r.reason.startswith("routing: routes token 0 to experts ["), r.reason
    assert "(a wrong router)" in r.reason and "fresh inputs" in r.reason


def test_a_wrong_variant_fails_parity(tmp_path: Path) -> None:
    """A backend computing gpt-oss's block with gate and up concatenated instead of interleaved (registered by the
    test: tests/moe_variant_backend.py) fails parity, its routing the golden's, and its row names that variant
    (``compare.gate.near_variants``). What the gate cannot see here: the clamp (limit 7) never binds on the CPU
    preset's draw, so a backend without it would pass (MOE_NOTES.md)."""
    register(moe_variant_backend.SPEC)
    try:
        status, (r,) = _run(
            tmp_path, "--preset", "gpt-oss-20b-cpu", "--mode", "fwd", "--backend", moe_variant_backend.NAME
        )
    finally:
        unregister(moe_variant_backend.NAME)
    assert status == 1 and r.status == "parity-fail" and r.reason.startswith("y: "), r.reason
    assert r.parity is not None and r.parity.routing is not None and r.parity.routing.rerouted == 0
    named = "computes gpt-oss's block with gate_up concatenated instead of interleaved"
    assert r.parity.variants is not None and r.parity.variants.short == named and f"; {named}" in r.reason
    g = golden_for(PRESETS["gpt-oss-20b-cpu"].case("float32"))
    spec = moe.MOE_SPECS["moe-gpt-oss"]
    x = g.x.reshape(24, 64)
    experts, _ = moe.golden_routing(x, g.params, spec)
    gu = np.einsum("td,tkhd->tkh", x, g.params["gate_up"][experts]) + g.params["gate_up_bias"][experts]
    assert np.max(gu) < spec.limit / 1.5  # the clamp is far from binding


def test_the_full_size_presets_are_refused_by_the_memory_preflight_alone() -> None:
    """The full-size MoE presets are cases like the CPU ones; only the memory preflight refuses them where memory is
    short (here told 16 GB are available), naming what it would need; the CPU presets fit in 2 GB."""
    specs = [BACKENDS[b] for b in MOE_BACKENDS]
    for name in ("qwen3-moe", "mixtral", "gpt-oss-20b"):
        case = PRESETS[name].case("float32")
        with pytest.raises(InputError, match=rf"case {case.name} needs about .* of memory at its peak"):
            preflight.check_memory([case], specs, backward=True, available=(16_000_000_000, "a test"))
    for name in CPU_PRESETS:
        preflight.check_memory([PRESETS[name].case("float32")], specs, backward=True, available=(2_000_000_000, "test"))


def test_the_every_call_check_follows_the_routing_rule() -> None:
    """The spot check of every call (``pipeline.spot_failures``) on a MoE case: a call whose outputs are the golden
    of its own routing passes where that routing is the golden's or a near-tie taken the other way; a call routed to
    a token's last-ranked expert fails as a wrong router, and one without a routing fails too."""
    case = PRESETS["qwen3-moe-cpu"].case("bfloat16")
    g = golden_for(case)
    draw = routing.golden_draw(case, tuple(g.ref))
    assert draw is not None
    t, near = _swapped_near_tie(draw)
    rows = np.array([t, (t + 1) % 24])
    x, dy = g.x.reshape(24, 64)[rows], g.dy.reshape(24, 64)[rows]
    wrong = draw.experts[rows].copy()
    wrong[0, -1] = int(np.argmin(draw.logits[t]))

    def spot(experts: np.ndarray | None, call: int) -> Spot:
        chosen = draw.experts[rows] if experts is None else experts
        out = fresh.token_reference(case, g.params, x[None], dy[None], chosen)
        got = {k: [np.asarray(out[k]).reshape(2, -1)] for k in ("y", "dx")}
        return Spot(call, rows, x, dy, got, routing=None if experts is None else experts.astype(np.float64))

    spots = [spot(draw.experts[rows], 0), spot(near[rows], 1), spot(wrong, 2), spot(None, 3)]
    failed = spot_failures(spots, case, "fwd+bwd")
    assert len(failed) == 2, failed
    assert failed[0].startswith(f"call 3: tokens {rows.tolist()}: routes a token to experts ")
    assert "(the golden's: " in failed[0] and "a wrong router" in failed[0]
    assert failed[1] == f"call 4: tokens {rows.tolist()}: no array of the routing's shape [T, 8] among its outputs"


def test_sweep_refuses_a_moe_case_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not done yet for a MoE case, and said so (exit 2): ``sweep`` (``--weights``: tests/test_moe_checkpoint.py)."""
    assert main(["sweep", "--preset", "mixtral-cpu", "--tokens", "8", "16", "--out", str(tmp_path / "s")]) == 2
    assert "moe-mixtral" in capsys.readouterr().err


# --- routing distributions: a case axis ---------------------------------------------------------------------------


def _expert_counts(case: Case) -> np.ndarray:
    """Tokens per expert ``[E]`` of ``case``'s golden routing on its golden inputs."""
    g = golden_for(case)
    spec = moe.MOE_SPECS[case.model]
    experts, _ = moe.golden_routing(g.x.reshape(-1, g.x.shape[-1]), g.params, spec)
    return np.bincount(experts.ravel(), minlength=spec.experts)


@pytest.mark.parametrize("name", list(CPU_PRESETS))
def test_each_routing_distribution_routes_as_its_name_says_on_ten_seeds(name: str) -> None:
    """On seeds 0 to 9 of each CPU preset (24 tokens): ``hot`` sends every token to expert 0, ``empty`` no token to
    an expert ``e % 4 == 3``, ``zipf`` at least 85% of the tokens to expert 0 and at least twice a uniform share of
    the assignments to experts 0 to k - 1; the uniform draws (the control) do none of these."""
    for seed in range(10):
        base = dataclasses.replace(PRESETS[name].case("bfloat16"), seed=seed)
        uniform, zipf, hot, empty = (
            _expert_counts(dataclasses.replace(base, routing=r)) for r in (None, "zipf", "hot", "empty")
        )
        tokens = base.shape.tokens
        assert hot[0] == tokens and uniform[0] < tokens, (seed, hot[0], uniform[0])
        assert empty[3::4].sum() == 0 and uniform[3::4].sum() > 0, (seed, empty[3::4], uniform[3::4])
        k, experts = moe.MOE_SPECS[base.model].top_k, len(uniform)
        for counts, skewed in ((zipf, True), (uniform, False)):  # the first k experts' share, expert 0's tokens
            share = counts[:k].sum() / counts.sum()
            assert (share >= 2 * k / experts and counts[0] >= 0.85 * tokens) == skewed, (seed, skewed, counts)


def test_a_routing_distribution_is_a_case_axis_of_a_moe_case_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--routing`` makes one case per distribution (``uniform`` is the default case, named as it always was; a
    steered one's name ends ``-r<routing>``); a dense case, or an unknown distribution, is refused with exit 2."""
    hot = dataclasses.replace(PRESETS["mixtral-cpu"].case("float32"), routing="hot")
    assert hot.name.endswith("-s0-rhot") and to_json(hot)["routing"] == "hot"
    assert "routing" not in to_json(PRESETS["mixtral-cpu"].case("float32"))  # a uniform case's cache keys as before
    with pytest.raises(InputError, match="has no router"):
        dataclasses.replace(PRESETS["tiny"].case("float32"), routing="hot")
    with pytest.raises(InputError, match="give routing None"):
        dataclasses.replace(hot, routing="uniform")
    for args, says in (
        (["--preset", "tiny", "--routing", "hot"], "a geglu case has no router"),
        (["--preset", "mixtral-cpu", "--routing", "lumpy"], "unknown routing 'lumpy'"),
        (["--preset", "mixtral-cpu", "--routing", "hot", "hot"], "a routing repeats"),
    ):
        assert main(["run", *args, *FAST, "--out", str(tmp_path / "o")]) == 2, args
        assert says in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("preset", list(CPU_PRESETS))
def test_every_moe_backend_passes_on_every_routing_distribution(tmp_path: Path, preset: str) -> None:
    """``run --preset P --routing uniform zipf hot empty --dtype bfloat16 --mode fwd+bwd`` (seed 6) of the four
    eager and jitted MoE backends (the compiled and interpreted ones: tests/test_moe_kernels.py): each passes or
    deviates on every distribution, its routing judged (no wrong router), on the golden inputs and
    on fresh ones drawn from the same steered distribution; the cases are named by their routing."""
    status, results = _run(
        tmp_path, "--preset", preset, "--routing", "uniform", "zipf", "hot", "empty", "--dtype", "bfloat16",
        "--mode", "fwd+bwd", "--seed", "6", "--cache", "warm", "--backend", *MOE_BACKENDS,
    )  # fmt: skip
    suffixes = sorted({r.case.rsplit("-s6", 1)[1] for r in results})
    assert suffixes == ["", "-rempty", "-rhot", "-rzipf"] and len(results) == 4 * len(MOE_BACKENDS)
    for r in results:
        assert r.status in ("ok", "deviates"), (r.backend, r.case, r.reason)
        assert r.parity is not None and r.parity.routing is not None and not r.parity.routing.wrong_tokens
    assert status == 0
