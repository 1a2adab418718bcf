"""The routing of a mixture-of-experts step: the experts its router chose, judged beside the tensors.

A MoE backend's step output carries its router's choice, ``routing`` (``[T, k]`` integers over the flattened tokens),
beside ``y``, ``dx`` and ``d<param>`` (``Prepared.to_numpy``); it is not a tensor to judge (:func:`split` takes it
apart). Top-k is discontinuous: where two experts' scores are within the rounding of the step's logits, an honest
backend may take either, and its outputs then differ from the golden's by a whole expert's contribution. So the gate
judges each draw (:class:`Draw`: the golden inputs on the first call, the fresh draw on the harness's inputs, a few
tokens in the every-call check) by one rule:

- the step's experts are the golden's (per token, as sets): its tensors are judged against the golden and the plain
  computation as any other step's;
- else, where every token it routed otherwise is ``moe.routable`` with the tolerance below (its experts are the top
  k of logits each within ``tol`` of the golden's float64 logits), its tensors are judged against the golden
  recomputed with its experts (``chosen=``, in the golden's arithmetic) and the plain computation routed likewise;
  the count of tokens it rerouted is recorded (:class:`~compare.gate.parity.RoutingCheck`);
- else it is a wrong router: the result fails, naming the first tokens, their experts and the golden's.

The tolerance, per token ``t``, bounds how far a logit computed in the case dtype can be from the float64 one:
``tol_t = max_e [2 u (|l_te| + |b_e|) + D 2^-24 (sum_d |x_td w_ed| + |b_e|)] + 8 2^-24 (1 + max_e |l_te|)`` with
``u = 2^-p`` the dtype's unit roundoff (``compare.problem.reference.SIGNIFICAND_BITS``), ``w`` the router's weight,
``b`` its bias (0 without one) and ``D`` the width: two roundings to the dtype (the GEMM's output and a bias added
after it), a float32 accumulation over ``D`` terms at its worst-case bound, and a float32 softmax ranked where its
probabilities are (a few float32 ulps of each probability, and the rounding of ``l - max l``). In bfloat16 the first
term rules (``2^-7`` of the row's largest logit); in float32 the accumulation's (about ``64 x 2^-24`` of the sum of
magnitudes at ``D = 64``). What it cannot see: a router whose logits are wrong by less than that (a wrong router
within the dtype's rounding of the right one: its effect on the outputs is the gate's to judge), and a backend that
reports one routing and computes with another (its tensors then fail against the golden of the routing it reports).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from compare.gate.parity import Parity, Plain, RoutingCheck
from compare.problem import moe
from compare.problem.cases import Case, is_moe
from compare.problem.golden import compute_of, golden_for, plain_run_of
from compare.problem.reference import SIGNIFICAND_BITS, Arith, held, round_to_dtype

#: The name of a routed step's experts in its output.
ROUTING = "routing"
#: Roundings to the case dtype a logit goes through (the GEMM's output, a bias added after it): unit roundoffs of
#: ``|l| + |b|``.
ROUND_UNITS = 2.0
#: Float32 ulps of ``1 + max|l|`` the router's float32 softmax may move a score by (module docstring).
SOFTMAX_ULPS = 8.0
#: Wrong tokens a reason names; the rest are counted.
NAMED = 3


def split(tensors: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """``(the tensors to judge, the routing or None)`` of a step's output read as named arrays."""
    if ROUTING not in tensors:
        return tensors, None
    rest = {k: v for k, v in tensors.items() if k != ROUTING}
    return rest, np.asarray(tensors[ROUTING])


def tolerance(x: np.ndarray, params: dict[str, np.ndarray], logits: np.ndarray, dtype: str) -> np.ndarray:
    """Per token ``[T]``: how far a logit of ``x [T, D]`` computed in ``dtype`` may be from the float64 ``logits``
    (module docstring)."""
    u = 2.0 ** -SIGNIFICAND_BITS[dtype]
    w = np.abs(np.asarray(params["router"], dtype=np.float64))
    b = np.abs(np.asarray(params.get("router_bias", np.zeros(w.shape[0])), dtype=np.float64))
    mags = np.abs(np.asarray(x, dtype=np.float64)) @ w.T  # [T, E]: sum_d |x_td w_ed|
    lg = np.abs(logits)
    per_logit = ROUND_UNITS * u * (lg + b) + x.shape[-1] * 2.0**-24 * (mags + b)
    return np.max(per_logit, axis=1) + SOFTMAX_ULPS * 2.0**-24 * (1.0 + np.max(lg, axis=1))


def near_ties(logits: np.ndarray, k: int, tol: np.ndarray) -> np.ndarray:
    """Per token: whether its choice is open within ``tol`` (the k-th and (k+1)-th logits less than ``2 tol``
    apart: each may move by ``tol``, so either side may be taken)."""
    if k >= logits.shape[1]:
        return np.zeros(logits.shape[0], dtype=bool)
    s = -np.sort(-logits, axis=1)
    return s[:, k - 1] - s[:, k] <= 2.0 * tol


def experts_of(routing: np.ndarray, tokens: int, k: int, who: str) -> np.ndarray:
    """A step's ``routing`` as ``[tokens, k]`` int64 (read back from any float type it was held in); a routing of
    another shape or with a value that is no integer is an error naming ``who``."""
    r = np.asarray(routing)
    if r.shape != (tokens, k):
        raise RuntimeError(f"{who} returned a routing of shape {list(r.shape)}; the router chooses [{tokens}, {k}]")
    as_int = np.rint(np.asarray(r, dtype=np.float64)).astype(np.int64)
    if not np.array_equal(as_int, np.asarray(r, dtype=np.float64)):
        raise RuntimeError(f"{who} returned a routing that is not integers (the experts its router chose)")
    return as_int


class Draw:
    """One draw of a MoE case as the gate judges it: its inputs ``x [.., D]`` (``dy`` with a backward), the golden's
    experts and float64 logits on them (``moe.golden_routing``), the per-token tolerance (:func:`tolerance`), and,
    made on demand and kept per routing, the golden (in ``exact``: ``Arith.exact()`` for the golden inputs, the fresh
    draw's float64 arithmetic for it) and the plain computation of another routing, of the tensors ``names``."""

    def __init__(
        self,
        case: Case,
        x: np.ndarray,
        params: dict[str, np.ndarray],
        dy: np.ndarray | None,
        exact: Arith,
        names: tuple[str, ...],
    ) -> None:
        self.case, self.x, self.params, self.dy, self.exact, self.names = case, x, params, dy, exact, names
        spec = moe.MOE_SPECS[case.model]
        self.k = spec.top_k
        x2 = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
        self.experts, self.logits = moe.golden_routing(x2, params, spec)
        self.tol = tolerance(x2, params, self.logits, case.dtype)
        self._routed: dict[bytes, tuple[dict[str, np.ndarray], Plain]] = {}

    def of(self, chosen: np.ndarray) -> tuple[dict[str, np.ndarray], Plain]:
        """The golden and the plain computation of the draw routed to ``chosen [T, k]``."""
        key = np.ascontiguousarray(chosen, dtype=np.int64).tobytes()
        if key not in self._routed:
            c = self.case
            full = compute_of(c, self.x, self.params, self.dy, self.exact, chosen=chosen)
            unrounded, _, _ = plain_run_of(c, self.x, self.params, self.dy, chosen=chosen)
            plain = {k: held(round_to_dtype(unrounded[k], c.dtype), c.dtype) for k in self.names}
            self._routed[key] = ({k: full[k] for k in self.names}, Plain(plain, None, unrounded, None))
        return self._routed[key]

    def judge(
        self,
        got: dict[str, np.ndarray],
        routing: np.ndarray | None,
        ref: Any,
        plain: Any,
        check: Callable[[dict[str, np.ndarray], Any, Any], Parity],
        who: str,
    ) -> Parity:
        """The gate's verdict on ``got`` (the tensors) and ``routing`` (the step's experts) by the module's rule:
        ``check(got, ref, plain)`` against the golden's own ``ref`` and ``plain`` where the experts are the
        golden's (or a wrong router's), against :meth:`of` the step's experts where they are routable."""
        if routing is None:
            raise RuntimeError(
                f"{who} returned no routing: a mixture-of-experts step's output carries the experts its router "
                f"chose ('{ROUTING}', [tokens, k])"
            )
        chosen = experts_of(routing, len(self.experts), self.k, who)
        other = np.any(np.sort(chosen, axis=1) != np.sort(self.experts, axis=1), axis=1)
        ok = moe.routable(chosen, self.logits, self.tol)
        wrong = other & ~ok
        ties = int(np.count_nonzero(near_ties(self.logits, self.k, self.tol)))
        rerouted = int(np.count_nonzero(other & ok))
        why = ""
        if wrong.any():
            named = [
                f"routes token {t} to experts {sorted(chosen[t].tolist())}; no logits within {self.tol[t]:.3g} of "
                f"the golden's choose them (the golden's: {sorted(self.experts[t].tolist())})"
                for t in np.flatnonzero(wrong)[:NAMED]
            ]
            more = int(wrong.sum()) - len(named)
            why = "; ".join(named) + (f"; and {more} more tokens" if more > 0 else "") + " (a wrong router)"
        elif other.any():
            ref, plain = self.of(chosen)
        parity = check(got, ref, plain)
        verdict = RoutingCheck(len(chosen), ties, rerouted, float(np.max(self.tol)), int(wrong.sum()), why)
        return Parity(parity.tensors, verdict)


@functools.lru_cache(maxsize=8)
def golden_draw(case: Case, mode_names: tuple[str, ...]) -> Draw | None:
    """The :class:`Draw` of ``case``'s golden inputs (``Arith.exact()``: the golden's own arithmetic) for the
    tensors ``mode_names`` (a backward's when any is a gradient); None for a case that is not a MoE block."""
    if not is_moe(case.model):
        return None
    g = golden_for(case)
    dy = g.dy if any(n != "y" for n in mode_names) else None
    return Draw(case, g.x, g.params, dy, Arith.exact(), mode_names)


def check_rows(
    case: Case, params: dict[str, np.ndarray], x: np.ndarray, routing: np.ndarray | None
) -> tuple[np.ndarray, list[str]]:
    """The every-call check's rule (``compare.run.pipeline.spot_failures``) on a few tokens ``x [K, D]``: the
    golden's experts of them (``[K, k]``), and per token whose experts ``routing [K, k]`` no logits within the
    tolerance choose, why (empty when every one is routable; ``routing`` None: nothing is checked)."""
    spec = moe.MOE_SPECS[case.model]
    x2 = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
    gold, logits = moe.golden_routing(x2, params, spec)
    if routing is None:
        return gold, []
    tol = tolerance(x2, params, logits, case.dtype)
    chosen = np.rint(np.asarray(routing, dtype=np.float64)).astype(np.int64)
    bad = ~moe.routable(chosen, logits, tol)
    return gold, [
        f"routes a token to experts {sorted(chosen[t].tolist())}; no logits within {tol[t]:.3g} of the golden's "
        f"choose them (the golden's: {sorted(gold[t].tolist())}; a wrong router)"
        for t in np.flatnonzero(bad)
    ]
