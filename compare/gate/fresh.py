"""An answer no backend can cache: the check on inputs a backend has never seen.

A backend's ``prepare`` is handed the case's :class:`~compare.problem.golden.Problem`, and from it anyone can compute
the golden answer (``golden_for(problem.case)``, the golden file, ``compare.problem.reference.compute``) and
return that, rounded to the dtype, at every step: right on the first call, and as fast as a memory copy.
So every later call of each prepared step runs on the harness's inputs (``compare.run.pipeline.Feed``, through
``Prepared.bind``): a fresh draw of ``x`` and ``dy``, of the same shapes and distribution as the case's, from a seed
drawn at run time (:func:`new_seed`, from the operating system's entropy: no code can predict it), its tokens in an
order of each call's own; the weights stay. A sub-draw whose outputs would leave the dtype's
range is passed over before any step sees it (:func:`draw`), so no seed makes the case unjudgeable. Only after
every step of the case has returned does it compute the reference and the plain computation of that draw
(:func:`reference`: the golden's arithmetic, its products through the machine's float64 BLAS) and judge the outputs
with the same gate.

What counts: a **fail** on fresh inputs makes the result ``parity-fail`` (the step does not compute its answer from
its inputs). A deviation found only on the fresh draw is recorded, not promoted: the status's ``deviates`` comes
from the committed, reproducible case, and a fresh seed changes with every run.

Cost: one exact and one plain computation per case (about 24 s for ``cpu-mlp`` in bfloat16 and 39 s in float32 on
a 2-core machine with a backward, where the float32 envelope twin adds the third), for the tensors the case's modes
check. A forward-only check judges :data:`FRESH_ROWS` of the draw's tokens (every token of a smaller case): each
token's output depends on that token's input alone, so the reference of those rows is the reference of the whole
draw restricted to them, at a fraction of its cost (``cpu-mlp``: 128 of 1024 tokens, about 0.7 s instead of 5.6 s).
The rows are drawn from the operating system's entropy only after every step returned (:func:`reference`), so a
step cannot know which of its rows are read; one that gets a share ``f`` of its rows wrong escapes with probability
``(1 - f) ** 128`` (below 1e-7 for ``f`` = 1/8). What it gives up: the fresh draw's deviations (recorded, never
promoted) are read on fewer elements, so a small bias found there is found with less power. With a backward every
token is judged (a weight's gradient sums over all of them).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from compare.formats.codec import LATER
from compare.gate import routing
from compare.gate.parity import DTYPE_MAX, Parity, Plain, RoutingCheck, UnusableCase, check_plain
from compare.problem import datacache
from compare.problem.cases import Case, is_moe
from compare.problem.golden import case_input, compute_of, kernels_run_of, plain_run_of, spot_reference_of
from compare.problem.reference import Arith, activations_in, compute, held, round_to_dtype


def new_seed() -> int:
    """A seed no backend can know in advance (32 bits from the operating system's entropy source)."""
    return secrets.randbits(32)


#: A draw is handed to the steps only if a quick float32 run of it stays within this share of the dtype's largest
#: finite value (:func:`_in_range`): the gate's own reference and plain computation differ from that run by far less
#: (rounding in the dtype, not in magnitude), so a screened draw is never refused as unusable after the steps ran.
RANGE_SHARE = 0.5
#: Tokens a forward-only fresh check judges (module docstring): a case with more has that many drawn at random.
FRESH_ROWS = 128
#: Sub-draws tried per seed before the case is called unusable for fresh inputs (a heavy-tailed ``student_t`` case
#: in float16 rarely needs a second; a case whose own golden draw is near the top of the range may need many).
MAX_DRAWS = 64


def _blas32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32) @ np.asarray(b, dtype=np.float32)


def _blas64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` through the machine's float64 BLAS, the operands widened first: a built-in model's are float32
    arrays, and ``np.matmul`` of those is a float32 product (whose rounding the plain computation's equals, bit for
    bit, where the BLAS adds in order without FMA: a capped-ISA machine then passed no error at all)."""
    return np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)


#: The dtypes whose module cases' draws are screened through torch's float32 kernels (:func:`_in_range`): those
#: whose range is float32's. A float16 tensor overflows where its float32 value does not: screened as rounded.
KERNEL_SCREENED: tuple[str, ...] = ("bfloat16", "float32")


def _in_range(case: Case, params: dict[str, np.ndarray], x: np.ndarray, dy: np.ndarray | None) -> bool:
    """Whether ``case`` on ``(x, dy)`` stays finite in its dtype, every materialised tensor rounded to it, and every
    output and gradient within :data:`RANGE_SHARE` of its largest value (numpy's float32 GEMMs and numpy's own tanh
    and exp: a screen, not a reference, a few ulp from the gate's arithmetic where the share leaves a factor of two;
    its values are dropped before any step sees the draw; a module case's module and a MoE block run with the fixed
    arithmetic's activations, ``compare.problem.golden.compute_of``). A bfloat16 or float32 module case's runs
    through torch's own float32 kernels instead (``compare.problem.golden.kernels_run_of``), its tensors unrounded:
    float32's range is those dtypes' (bfloat16's largest value is float32's but for its last 16 bits), so no
    tensor finite there overflows them, and the plain computation's dispatch cost seconds on a real layer."""
    ar = Arith(case.dtype, final=False, gemm=_blas32)
    with np.errstate(over="ignore", invalid="ignore"):
        if case.module is not None and case.dtype in KERNEL_SCREENED:
            out = kernels_run_of(case, x, params, dy, "float32")
        elif case.module is None and not is_moe(case.model):
            acts = activations_in(case.model, "tanh", "float32", tanh=np.tanh, exp=np.exp)
            out = compute(case.model, x, params, dy, ar, acts=acts)
        else:
            out = compute_of(case, x, params, dy, ar)
    top = RANGE_SHARE * DTYPE_MAX[case.dtype]
    return all(bool(np.all(np.isfinite(v))) and float(np.max(np.abs(v), initial=0.0)) <= top for v in out.values())


def draw(case: Case, seed: int, params: dict[str, np.ndarray], backward: bool = True) -> dict[str, np.ndarray]:
    """Fresh inputs of ``case`` with its ``params``: ``{"x", "dy"}`` with the golden's shapes, distribution and dtype
    rounding (``compare.problem.golden.make_golden``), from ``seed`` (float32 arrays holding dtype values, as
    ``Problem.inputs``); the same arrays for the same seed on every machine.

    A heavy-tailed draw can push a 16-bit output past the dtype's range, which would leave every cell of the case
    unjudgeable on fresh inputs (an error that depends on the seed). So the seed's sub-draws are tried in order and
    the first whose outputs stay in range (:func:`_in_range`) is the draw: fresh inputs come from the case's
    distribution conditioned on the case being judgeable on them. Raises :class:`~compare.gate.parity.UnusableCase` when
    none of :data:`MAX_DRAWS` is. Without ``backward`` (a forward-only run, whose check reads ``y`` alone) only the
    forward is screened."""
    s = case.shape
    tag = zlib.crc32(f"fresh|{case.model}|{s.batch}|{s.seq}|{s.dim}|{s.hidden}|{case.dist}".encode())
    for attempt in range(MAX_DRAWS):
        entropy = [seed, tag] if attempt == 0 else [seed, tag, attempt]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        x = round_to_dtype(case_input(rng, case), case.dtype)
        dy = round_to_dtype(rng.standard_normal(case.output_shape()), case.dtype)
        if _in_range(case, params, x, dy if backward else None):
            return {"x": x, "dy": dy}
    raise UnusableCase(
        f"case {case.name}: none of {MAX_DRAWS} fresh draws of seed {seed} keeps its outputs within "
        f"{RANGE_SHARE:g} of {case.dtype}'s largest finite value {DTYPE_MAX[case.dtype]:.6g}; use smaller inputs "
        "or a wider dtype"
    )


@dataclass(frozen=True)
class FreshReference:
    """The reference of a fresh draw (:func:`reference`): the float64 ``ref`` and the ``plain`` computation of the
    draw's tokens ``rows`` (sorted indices into its flattened tokens, from ``rows_seed``; None: every token)."""

    ref: Mapping[str, Any]
    plain: Plain
    rows: np.ndarray | None = None
    rows_seed: int | None = None
    #: a mixture-of-experts case's draw as the routing rule judges it (``compare.gate.routing.Draw``); None otherwise
    draw: routing.Draw | None = None

    def take(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``outputs`` of the whole draw (``y [batch, seq, out]``, a MoE step's ``routing [T, k]``) restricted to
        :attr:`rows` (``y [1, rows, out]``, as :attr:`ref` holds it); unchanged when every token is judged."""
        if self.rows is None:
            return outputs
        if set(outputs) - {"y", routing.ROUTING}:  # rows are drawn for a forward-only check: no gradient sums
            raise ValueError(f"a reference of {len(self.rows)} rows judges y alone, got {sorted(outputs)}")
        y = outputs["y"]
        out = {"y": y.reshape(-1, y.shape[-1])[self.rows][None]}
        if routing.ROUTING in outputs:
            out[routing.ROUTING] = np.asarray(outputs[routing.ROUTING])[self.rows]
        return out


def reference(
    case: Case,
    params: dict[str, np.ndarray],
    inputs: dict[str, np.ndarray],
    backward: bool = True,
    rows: int = FRESH_ROWS,
) -> FreshReference:
    """The float64 reference and the plain computation (with its envelope twin where the golden has one,
    ``compare.run.cell.plain_reference``) of ``case`` on ``inputs`` with the case's ``params``: ``y``, and every
    gradient when ``backward``. Without the backward, a draw of more than ``rows`` tokens is judged on ``rows`` of
    them, drawn now from the operating system's entropy (module docstring; ``rows=0``: every token).

    Raises :class:`~compare.gate.parity.UnusableCase` when the draw cannot be judged in the dtype (as for the case)."""
    x, dy = inputs["x"], (inputs["dy"] if backward else None)
    tokens = x.reshape(-1, x.shape[-1])
    picked, rows_seed = None, None
    if not backward and 0 < rows < len(tokens):
        rows_seed = new_seed()
        rng = np.random.Generator(np.random.PCG64(rows_seed))
        picked = np.sort(rng.choice(len(tokens), size=rows, replace=False))
        x = tokens[picked][None]
    # float64 through the machine's BLAS, not the golden's error-free products: the draw is new every run, so its
    # bits need not be the same on every machine, and its error (about k * 2**-53 of a row's scale) is 2**29 below
    # float32's rounding. A Llama 3 8B layer's fwd+bwd: seconds, where the golden's products took 25 s or more.
    # A module case's through torch's own float64 kernels (``compare.problem.golden.kernels_run_of``): the same
    # float64 computation but for the last bits of its BLAS and libm, without the plain computation's dispatch, which
    # converted every operand it read (a Llama 3.2 1B layer's fwd+bwd: 3.9 s of CPU on a busy 2-core VM).
    if case.module is not None:
        exact = kernels_run_of(case, x, params, dy, "float64")
    else:
        exact = compute_of(case, x, params, dy, Arith(None, gemm=_blas64))
    ref = datacache.spill(exact)  # read a block at a time
    del exact
    unrounded, envelope, signature = plain_run_of(case, x, params, dy)
    plain = {k: held(round_to_dtype(v, case.dtype), case.dtype) for k, v in unrounded.items()}
    del unrounded
    check_plain(f"{case.name} (fresh inputs)", case.dtype, ref, plain)
    # a MoE case's draw as its routing rule judges it, in this function's float64 arithmetic
    draw = routing.Draw(case, x, params, dy, Arith(None, gemm=_blas64), tuple(ref)) if is_moe(case.model) else None
    # without the unrounded tensors: only the golden's resolution rows read them
    return FreshReference(ref, Plain(plain, envelope, None, signature), picked, rows_seed, draw)


def token_reference(
    case: Case,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    dy: np.ndarray | None,
    chosen: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The ``y`` (and ``dx`` given ``dy``) of a few tokens ``x [1, K, dim]`` (``dy [1, K, out]``): the every-call
    check's yardstick (``compare.run.pipeline.judge_spots``), against which an error of an eighth of a row's scale
    fails a call, so its last bits do not matter. Each token's outputs depend on its own row alone, so ``K`` rows
    cost ``K`` rows of the layer's GEMMs, and no weight gradient is made. A built-in model's: float64 through the
    machine's BLAS (``Arith``'s ``gemm``); a module case's: its module in float32 through torch's own kernels
    (``compare.problem.golden.spot_reference_of``), where the float64 module the plain computation's dispatch runs
    took seconds a batch to build on a real layer. A MoE case's is routed to ``chosen [K, k]`` where given (the
    experts the step chose, where ``compare.gate.routing`` found them routable)."""
    if case.module is not None:
        return spot_reference_of(case, x, params, dy)
    out = compute_of(case, x, params, dy, Arith(None, gemm=_blas64), weights=False, chosen=chosen)
    return {k: out[k] for k in ("y", "dx") if k in out}


def compact(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A step's outputs (``Prepared.to_numpy``: float arrays of any width) held until the reference exists: each in
    the narrowest of bfloat16 (``ml_dtypes``), float16, float32 and its own type that holds every value exactly (a
    16-bit step's in 2 bytes an element, a float32 step's in 4), so a case's cells hold a quarter of their float64
    size. A Llama 3 8B layer's three weight gradients are 176M elements: 5 backends keep one call each, 1.8 GB in
    bfloat16 where float64 would be 7 GB. Read back with ``astype(np.float64)``."""
    out = {}
    for k, v in tensors.items():
        out[k] = v = np.asarray(v)
        if v.dtype.kind != "f" and v.dtype != ml_dtypes.bfloat16:
            out[k] = v = v.astype(np.float64)
        bits = np.dtype(f"i{v.dtype.itemsize}")
        for narrow in (ml_dtypes.bfloat16, np.float16, np.float32):  # the first that is exact
            if np.dtype(narrow).itemsize >= v.dtype.itemsize:
                continue
            with np.errstate(over="ignore"):  # a value past the narrow type's range is not exact: it stays wider
                n = v.astype(narrow)
            if np.array_equal(n.astype(v.dtype).view(bits), v.view(bits)):  # the same bits (a NaN stays)
                out[k] = n
                break
    return out


@dataclass(frozen=True)
class FreshCheck:
    """The verdict on a step's output for fresh inputs: the draw's ``seed`` (``compare run`` reproduces nothing
    from it by itself: it is recorded so that a failure can be replayed), the gate's ``tier`` and its findings, and
    where only some tokens were judged (:data:`FRESH_ROWS`), how many and the seed of their draw; ``judged`` of the
    ``made`` calls on the harness's inputs were judged (``compare.run.pipeline.Feed``; None in an older document,
    whose check was one call apart from the timed ones)."""

    seed: int
    tier: str
    failures: tuple[str, ...] = ()
    deviations: tuple[str, ...] = ()
    rows: int | None = field(default=None, metadata=LATER)
    rows_seed: int | None = field(default=None, metadata=LATER)
    judged: int | None = field(default=None, metadata=LATER)
    made: int | None = field(default=None, metadata=LATER)
    #: calls whose output was read at return and checked on a few tokens (``compare.run.pipeline.judge_spots``; None:
    #: not checked, a tensor-parallel step or an older document)
    spot_calls: int | None = field(default=None, metadata=LATER)
    #: a mixture-of-experts step's routing on the draw (``compare.gate.routing``); None for any other step
    routing: RoutingCheck | None = field(default=None, metadata=LATER)

    @staticmethod
    def of(
        seed: int,
        parity: Parity,
        ref: FreshReference | None = None,
        judged: int | None = None,
        made: int | None = None,
        spot: tuple[int, list[str]] = (0, []),
    ) -> FreshCheck:
        """The check of ``parity`` (the gate on the draw's call) and ``spot``, the every-call check's ``(calls
        checked, failures)``: a spot failure fails the check."""
        rows = None if ref is None or ref.rows is None else len(ref.rows)
        seed_rows = None if ref is None else ref.rows_seed
        found, dev = (*parity.failures(), *spot[1]), tuple(parity.deviations())
        tier = "fail" if spot[1] else parity.tier
        return FreshCheck(seed, tier, found, dev, rows, seed_rows, judged, made, spot[0] or None, parity.routing)

    @property
    def reasons(self) -> list[str]:
        """What the result's status takes from this check: its failures (a deviation here is recorded only)."""
        return [f"fresh inputs (seed {self.seed}): {f}" for f in self.failures]
