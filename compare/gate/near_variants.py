"""What a backend computes instead: the known near variants of each model, and which one explains a failure.

A backend that fails or deviates often computes a near variant of its model: the erf GELU where the tanh form is
meant, gate and up swapped, a fused ``gate_up`` read in the other layout, gpt-oss's clamp dropped or at another limit,
its ``+ 1`` dropped, the router's softmax taken before top-k instead of after, the renormalisation missing. Each
model's near variants are data here (:data:`VARIANTS`: a name, the words a row uses, and how its golden is computed:
the GELU form, parameters dropped or swapped, or a ``compare.problem.moe.MoeSpec`` change), and :func:`check` asks
which of them explains a step's output.

Only where the gate's verdict on the first call (the golden inputs) is ``fail`` or ``deviates`` (:func:`explained`:
a passing step costs nothing): per variant, its float64 golden ``y`` (:data:`VARIANT_GOLDEN`) and its plain
same-dtype computation of ``y`` on the golden inputs (a MoE block routed to the experts the step chose, when its
routing is not a wrong router's; a dense model's kept in the data cache), then the gate's own rule
(``compare.gate.parity.check_all``) on the step's ``y`` against them. A variant whose golden the step's ``y`` passes
against *explains* it; the row says ``computes <its words>``, and otherwise ``unexplained``.
The verdict stays what it was: a backend that computes the wrong function is still wrong.

What it compares: ``y`` alone (forward), on the golden inputs alone. So it says nothing of a step whose ``y`` passes
and whose gradients fail (that step is ``unexplained``, saying why), nor of a failure seen only on fresh inputs. A
variant that the gate cannot tell apart from the model itself on these inputs (its plain computation passes against
the model's golden: gpt-oss's clamp, which never binds on inputs whose gate stays below the limit) is never named; it
is listed as ``unseen``. Where two variants both explain a step (not told apart from each other on these inputs) the
first is named and the other given beside it. Not checked: a module case (a user's own MLP file) has no variants here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compare.formats.codec import to_json
from compare.gate import routing
from compare.gate.fresh import _blas64
from compare.gate.parity import Parity, Plain, VariantCheck, check_all
from compare.problem import datacache, moe
from compare.problem.cases import Case, is_moe
from compare.problem.golden import golden_for
from compare.problem.reference import Arith, compute, held, plain_run, round_to_dtype


@dataclass(frozen=True)
class Variant:
    """A near variant of a model: its ``name``, the ``words`` after "computes" in a row, and how its golden differs
    from the model's: the GELU form (``gelu``), parameters set to zero (``zero``: a bias dropped), gate and up
    swapped (``swap``: a dense model's two weights, a MoE expert's two halves of ``gate_up``), and for a MoE block
    the fields of its ``MoeSpec`` changed (``spec``)."""

    name: str
    words: str
    gelu: str = "tanh"
    zero: tuple[str, ...] = ()
    swap: bool = False
    spec: tuple[tuple[str, Any], ...] = ()


_SWAPPED = Variant("gate-up-swapped", "{} with gate and up swapped", swap=True)
_ERF = Variant("erf-gelu", "{} with the erf GELU instead of the tanh form", gelu="erf")


def _of(model: str, *variants: Variant) -> tuple[Variant, ...]:
    return tuple(dataclasses.replace(v, words=v.words.format(model)) for v in variants)


def _block(name: str, words: str, **spec: Any) -> Variant:
    """A MoE block's variant by ``MoeSpec`` fields changed."""
    return Variant(name, words, spec=tuple(spec.items()))


def _router_weights(model: str) -> tuple[Variant, ...]:
    """Qwen3-MoE's or Mixtral's variants: ``gate_up`` interleaved, gate and up swapped, no renormalisation."""
    return (
        _block(
            "interleaved", f"{model}'s block with gate_up interleaved instead of concatenated", layout="interleaved"
        ),
        *_of(f"{model}'s block", _SWAPPED),
        _block("renormalisation-missing", f"{model}'s router without the renormalisation", renormalize=False),
    )


#: Each model's near variants, in the order they are tried (the first that explains a step is named). Not listed
#: where it is the model itself: a softmax after top-k, renormalised, is the softmax before it (Qwen3-MoE's and
#: Mixtral's order and gpt-oss's are one function once renormalised: ``compare.problem.moe``).
VARIANTS: dict[str, tuple[Variant, ...]] = {
    "linear": (Variant("bias-dropped", "the linear layer without its bias", zero=("bias",)),),
    "geglu": _of("GeGLU", _ERF, _SWAPPED),
    "swiglu": _of("SwiGLU", _SWAPPED),
    "gelu-mlp": (
        *_of("the GELU MLP", _ERF),
        Variant("fc1-bias-dropped", "the GELU MLP without fc1's bias", zero=("b1",)),
        Variant("fc2-bias-dropped", "the GELU MLP without fc2's bias", zero=("b2",)),
    ),
    "moe-gpt-oss": (
        _block("concatenated", "gpt-oss's block with gate_up concatenated instead of interleaved", layout="concat"),
        *_of("gpt-oss's block", _SWAPPED),
        _block("clamp-dropped", "SwiGLU without the clamp", limit=math.inf),
        _block("clamp-at-10", "SwiGLU with the clamp at 10 instead of 7", limit=10.0),
        _block("plus-one-dropped", "SwiGLU without the + 1 on up", offset=0.0),
        _block(
            "softmax-before-top-k",
            "gpt-oss's router with the softmax over every expert before top-k",
            order="softmax-topk",
            renormalize=False,
        ),
    ),
    "moe-qwen3": _router_weights("Qwen3-MoE"),
    "moe-mixtral": _router_weights("Mixtral"),
}


def _params(model: str, v: Variant, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The parameters the variant's golden is the model's golden of: ``zero`` set to 0, gate and up swapped."""
    p = {k: (np.zeros_like(a) if k in v.zero else a) for k, a in params.items()}
    if v.swap and is_moe(model):
        half = p["gate_up"].shape[1] // 2
        pairs = np.arange(2 * half).reshape(-1, 2) if moe.MOE_SPECS[model].layout == "interleaved" else None
        perm = pairs[:, ::-1].ravel() if pairs is not None else np.roll(np.arange(2 * half), half)
        p["gate_up"] = p["gate_up"][:, perm]
        if "gate_up_bias" in p:
            p["gate_up_bias"] = p["gate_up_bias"][:, perm]
    elif v.swap:
        p["gate"], p["up"] = p["up"], p["gate"]
    return p


def variant_y(
    case: Case, v: Variant, x: np.ndarray, params: Mapping[str, np.ndarray], ar: Arith, chosen: np.ndarray | None
) -> np.ndarray:
    """``y`` of variant ``v`` of ``case``'s model on ``x`` in ``ar`` (a MoE block routed to ``chosen``)."""
    p = _params(case.model, v, params)
    if is_moe(case.model):
        spec = dataclasses.replace(moe.MOE_SPECS[case.model], **dict(v.spec))
        with np.errstate(over="ignore", invalid="ignore"):
            return moe.compute_case(case.model, x, p, None, ar, weights=False, chosen=chosen, spec=spec)["y"]
    return compute(case.model, x, p, None, ar, gelu=v.gelu, weights=False)["y"]


#: The variant's golden: float64 through the machine's BLAS (as the fresh draw's reference, ``compare.gate.fresh``),
#: not the golden's error-free products: its error (about ``k 2**-53`` of a row's scale) is far below any dtype's
#: rounding, and on ``cpu-mlp`` it takes 0.8 s where the error-free forward took 17 s.
VARIANT_GOLDEN = Arith(None, gemm=_blas64)


def _golden(case: Case, v: Variant, chosen: np.ndarray | None) -> tuple[dict[str, np.ndarray], Plain]:
    """The variant's float64 golden ``y`` (:data:`VARIANT_GOLDEN`) and its plain computation on the golden inputs,
    as the gate judges with: a dense model's with its twins (``reference.plain_run``), kept in the data cache (the
    plain ``cpu-mlp`` with its twins takes about 16 s in float32); a MoE block's routed to ``chosen``."""
    g = golden_for(case)
    if is_moe(case.model):
        ref = {"y": variant_y(case, v, g.x, g.params, VARIANT_GOLDEN, chosen)}
        unrounded = {"y": variant_y(case, v, g.x, g.params, Arith.plain(case.dtype, final=False), chosen)}
        return ref, Plain({"y": held(round_to_dtype(unrounded["y"], case.dtype), case.dtype)}, None, unrounded)
    name = datacache.key("variant", {"case": to_json(case), "variant": repr(v)})
    parts = datacache.load(name)
    if parts is None:
        p = _params(case.model, v, g.params)
        unrounded, envelope, signature = plain_run(case.model, case.dtype, case.seed, g.x, p, None, gelu=v.gelu)
        ref = {"y": variant_y(case, v, g.x, g.params, VARIANT_GOLDEN, None)}
        twins = {"ref": ref, "unrounded": unrounded, "envelope": envelope or {}, "signature": signature or {}}
        parts = {f"{part}.y": d["y"] for part, d in twins.items() if "y" in d}
        datacache.save(name, parts)
    got = {part: {"y": parts[f"{part}.y"]} if f"{part}.y" in parts else None for part in _PARTS}
    plain = {"y": held(round_to_dtype(parts["unrounded.y"], case.dtype), case.dtype)}
    return {"y": parts["ref.y"]}, Plain(plain, got["envelope"], got["unrounded"], got["signature"])


_PARTS = ("unrounded", "envelope", "signature")


def check(
    case: Case,
    parity: Parity,
    got: Mapping[str, np.ndarray],
    ref: Mapping[str, np.ndarray],
    plain: Any,
    draw: routing.Draw | None = None,
) -> VariantCheck | None:
    """Which near variants of ``case``'s model explain the step's output ``got`` (its tensors, with a MoE step's
    ``routing``), judged ``parity`` against the model's golden ``ref`` and ``plain`` (a MoE step's ``draw``:
    ``compare.gate.routing.Draw``): None where the model has no variants (a module case), or the step is a wrong
    router (its routing is the finding)."""
    variants = VARIANTS.get(case.model, ()) if case.module is None else ()
    if not variants or (parity.routing is not None and parity.routing.wrong_tokens):
        return None
    tensors, experts = routing.split(dict(got))
    chosen, truth, truth_plain = None, {"y": ref["y"]}, plain
    if draw is not None and experts is not None:
        chosen = routing.experts_of(experts, len(draw.experts), draw.k, case.name)
        if np.any(np.sort(chosen, axis=1) != np.sort(draw.experts, axis=1)):
            full, truth_plain = draw.of(chosen)  # judged against the golden of its own routing: so are its variants
            truth = {"y": full["y"]}
    names = tuple(v.name for v in variants)
    y = {"y": np.asarray(tensors["y"])}
    if check_all(y, truth, truth_plain, case.dtype).passed:
        return VariantCheck((), names, note="its y passes; the variants are told apart on y alone")
    computes, unseen = [], []
    for v in variants:
        vref, vplain = _golden(case, v, chosen)
        if check_all({"y": vplain["y"]}, truth, truth_plain, case.dtype).passed:
            unseen.append(v.name)  # the gate cannot tell this variant from the model on these inputs
        elif check_all(y, vref, vplain, case.dtype).passed:
            computes.append(v.words)
    return VariantCheck(tuple(computes), names, tuple(unseen))


def explained(
    judged: Sequence[tuple[str, Parity]],
    copies: Sequence[tuple[str, Mapping[str, np.ndarray]]],
    case: Case,
    ref: Mapping[str, np.ndarray],
    plain: Any,
    draw: routing.Draw | None = None,
) -> list[tuple[str, Parity]]:
    """``(device, verdict)`` of every device copy (``compare.run.pipeline.Judged`` of ``copies``), each verdict
    with what its copy computes instead (:func:`check`) where it fails or deviates on ``y``; unchanged (nothing
    computed) where it passes, or the mode does not check ``y``."""
    return [
        (d, p if p.passed or "y" not in ref else dataclasses.replace(p, variants=check(case, p, t, ref, plain, draw)))
        for (d, p), (_, t) in zip(judged, copies, strict=True)
    ]
