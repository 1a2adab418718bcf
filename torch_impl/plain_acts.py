"""The activations of ``torch_impl.plain``'s computations, by kind: which value and derivative functions
(``compare.problem.reference.Activations``, float64 arrays in and out) each run evaluates an activation op with.

Kinds (:data:`KINDS`): ``gelu_tanh`` and ``gelu_erf`` (torch's ``gelu`` with ``approximate='tanh'`` and ``'none'``),
``silu``, ``tanh``, ``sigmoid``. GELU and SiLU are the reference's own, picked as it picks them by model (SiLU for
``swiglu``, the GELU otherwise): :func:`acts_plain` is ``reference.activations`` (op by op in float32 for the plain
run, float64 math for the reference), :func:`acts_envelope` is ``reference.envelope_activations`` (the float32
plain run with its tanh or exp off by up to ``TRANSCENDENTAL_ERROR_ULPS`` ulps drawn from the seed) and
:func:`acts_signature` is ``reference.signature_activations`` (float64 with the transcendental all one way). tanh and
sigmoid are built the same way from the same parts: one rounding ``r`` (to float32 after every op, or none), the
reference's tanh and ``exp`` (``reference.ulps_off`` of them in the twins); sigmoid as libraries write it,
``1 / (1 + exp(-x))``. Only their value is used by ``torch_impl.plain`` (their backward ops receive the output).

The reference has no envelope or signature form of the erf GELU: asking for one raises :class:`NoActivation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from compare.problem import fixedbits
from compare.problem.reference import (
    TRANSCENDENTAL_ERROR_ULPS,
    Activation,
    Activations,
    activations,
    envelope_activations,
    exp_saturating,
    round_to_dtype,
    signature_activations,
    ulps_off,
)

__all__ = ["KINDS", "ActsFor", "NoActivation", "acts_envelope", "acts_plain", "acts_signature"]

#: The activation kinds an ``ActsFor`` is asked for.
KINDS: tuple[str, ...] = ("gelu_tanh", "gelu_erf", "silu", "tanh", "sigmoid")
#: Kind -> (a built-in model, GELU form) whose activation it is in ``compare.problem.reference``.
_REFERENCE_KIND: dict[str, tuple[str, str]] = {
    "gelu_tanh": ("geglu", "tanh"),
    "gelu_erf": ("geglu", "erf"),
    "silu": ("swiglu", "tanh"),
}

#: The activations of one computation by kind.
ActsFor = Callable[[str], Activations]


class NoActivation(LookupError):
    """A kind this computation has no form of (unknown, or the erf GELU in a twin)."""


def _tanh_sigmoid(kind: str, r: Activation, tanh: Activation, exp: Activation) -> Activations:
    """tanh or sigmoid and its derivative, every op rounded by ``r``."""
    if kind == "tanh":

        def value(x: np.ndarray) -> np.ndarray:
            return r(tanh(r(x)))

        def derivative(x: np.ndarray) -> np.ndarray:
            t = value(x)
            return r(1.0 - r(t * t))

        return value, derivative

    def sig(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: sigmoid 0, as in float32
            return r(1.0 / r(1.0 + r(exp(r(-np.asarray(x, dtype=np.float64))))))

    return sig, lambda x: r(sig(x) * r(1.0 - sig(x)))


def _rounding(dtype: str | None) -> Activation:
    """Rounding to ``dtype`` as float64 (None: none)."""
    if dtype is None:
        return lambda a: np.asarray(a, dtype=np.float64)
    return lambda a: round_to_dtype(np.asarray(a, dtype=np.float64), dtype).astype(np.float64)


def _reference_kind(kind: str, twin: str | None) -> tuple[str, str] | None:
    """The reference's (model, GELU form) of ``kind``; None for tanh and sigmoid. ``twin``: the twin asking."""
    if kind not in KINDS:
        raise NoActivation(f"no activation of kind {kind!r}; kinds: {', '.join(KINDS)}")
    if twin is not None and kind == "gelu_erf":
        raise NoActivation(f"{kind} has no {twin} twin in compare.problem.reference: only the tanh GELU has")
    return _REFERENCE_KIND.get(kind)


def acts_plain(act_dtype: str | None) -> ActsFor:
    """The activations evaluated op by op in ``act_dtype`` (``Arith.act_dtype``: float32 for the plain run, None:
    float64 math), as ``reference.activations`` gives them."""

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind, None)
        if ref is not None:
            return activations(*ref, act_dtype)
        return _tanh_sigmoid(kind, _rounding(act_dtype), fixedbits.tanh, exp_saturating)

    return acts_for


def acts_envelope(seed: int) -> ActsFor:
    """The envelope twin's float32 activations: tanh or exp off by up to ``TRANSCENDENTAL_ERROR_ULPS`` ulps, drawn
    from ``seed``."""
    e = TRANSCENDENTAL_ERROR_ULPS

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind, "envelope")
        if ref is not None:
            return envelope_activations(ref[0], seed)
        tanh, exp = ulps_off(fixedbits.tanh, e, seed, -1.0, 1.0), ulps_off(exp_saturating, e, seed, 0.0, math.inf)
        return _tanh_sigmoid(kind, _rounding("float32"), tanh, exp)

    return acts_for


def acts_signature(ulps: int) -> ActsFor:
    """A signature twin's float64 activations: the transcendental ``ulps`` float32 ulps off, all one way."""

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind, "signature")
        if ref is not None:
            return signature_activations(ref[0], ulps)
        tanh, exp = ulps_off(fixedbits.tanh, ulps, None, -1.0, 1.0), ulps_off(exp_saturating, ulps, None, 0.0, math.inf)
        return _tanh_sigmoid(kind, _rounding(None), tanh, exp)

    return acts_for
