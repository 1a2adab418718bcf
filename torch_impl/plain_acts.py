"""The activations of ``torch_impl.plain``'s computations, by kind: which value and derivative functions
(``compare.problem.reference.Activations``, float64 arrays in and out) each run evaluates an activation op with.

Kinds (:data:`KINDS`): ``gelu_tanh`` and ``gelu_erf`` (torch's ``gelu`` with ``approximate='tanh'`` and ``'none'``,
``nn.GELU()``'s default), ``silu``, ``mish``, ``tanh``, ``sigmoid``. Every kind has its three forms:
:func:`acts_plain` (op by op in float32 for the plain run, float64 math for the reference), :func:`acts_envelope`
(the float32 plain run with each of its transcendentals off by up to ``TRANSCENDENTAL_ERROR_ULPS`` ulps drawn from the
seed) and :func:`acts_signature` (float64 with the transcendentals all one way). GELU and SiLU are the reference's
own, picked as it picks them by model and GELU form (``reference.activations``, ``reference.envelope_activations``,
``reference.signature_activations``; the erf GELU has its erf, and its derivative's density its ``exp``, off).
tanh, sigmoid and Mish are built here from the same parts: one rounding ``r`` (to float32 after every op, or none)
and the project's transcendentals (``fixedbits``' tanh, ``log1p`` and ``reference.exp_saturating``; ``ulps_off`` of
them in the twins, each transcendental of an activation a draw of its own); sigmoid as libraries write it,
``1 / (1 + exp(-x))``; Mish as torch's kernel does, ``x tanh(log1p(exp(x)))`` and the derivative ``t + x s (1 - t^2)``
with ``t = tanh(log1p(exp(x)))``, ``s = sigmoid(x)``. Only the value of tanh and sigmoid is used by
``torch_impl.plain`` (their backward ops receive the output).

ReLU (and squared ReLU, ``relu(x) ** 2`` or ``torch.square(relu(x))``: a ReLU and a product) has no kind and needs
no twin: its ops are exact (a comparison, and a product of dtype values exact in float64, rounded once), so no float32
library computes them differently and there is no transcendental to be a few ulps off.

A kind that is not one of these raises :class:`NoActivation` (``torch_impl.plain`` has a rule only for these).
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
KINDS: tuple[str, ...] = ("gelu_tanh", "gelu_erf", "silu", "mish", "tanh", "sigmoid")
#: Kind -> (a built-in model, GELU form) whose activation it is in ``compare.problem.reference``.
_REFERENCE_KIND: dict[str, tuple[str, str]] = {
    "gelu_tanh": ("geglu", "tanh"),
    "gelu_erf": ("geglu", "erf"),
    "silu": ("swiglu", "tanh"),
}

#: The activations of one computation by kind.
ActsFor = Callable[[str], Activations]


class NoActivation(LookupError):
    """A kind this module has no form of (not one of :data:`KINDS`)."""


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


def _mish(r: Activation, exp: Activation, log1p: Activation, tanh: Activation) -> Activations:
    """Mish and its derivative as torch's kernels compute them (``aten.mish``, ``aten.mish_backward``), every op
    rounded by ``r``: ``x tanh(log1p(exp(x)))`` and ``t + (x s) (1 - t t)``. No threshold: past ``exp``'s range
    ``log1p(inf) = inf`` and ``tanh(inf) = 1``, as in float32 (where beyond ``x = 20`` the tanh is 1 anyway)."""

    def tanh_softplus(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # exp(x) = inf for large x, as in float32
            return r(tanh(r(log1p(r(exp(x))))))

    def value(x: np.ndarray) -> np.ndarray:
        x = r(x)
        return r(x * tanh_softplus(x))

    def derivative(x: np.ndarray) -> np.ndarray:
        x = r(x)
        with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: sigmoid 0
            s = r(1.0 / r(1.0 + r(exp(r(-x)))))
        t = tanh_softplus(x)
        return r(t + r(r(x * s) * r(1.0 - r(t * t))))

    return value, derivative


#: A transcendental made a float32 library's (``reference.ulps_off`` with the twin's ulps and seed): ``(fn, lo, hi,
#: stream)`` -> the function off.
Off = Callable[[Activation, float, float, int], Activation]


def _own(kind: str, r: Activation, off: Off | None) -> Activations:
    """tanh, sigmoid or Mish (the kinds the reference lacks), every op rounded by ``r``, each transcendental made
    ``off`` (None: the accurate ones). tanh and exp take stream 0 (the draw tanh and sigmoid always had); Mish's
    ``log1p`` and tanh streams 1 and 2, so each of its transcendentals is off by a draw of its own."""
    tanh: Activation = fixedbits.tanh
    exp: Activation = exp_saturating
    log1p: Activation = fixedbits.log1p
    if off is not None:
        tanh, exp = off(tanh, -1.0, 1.0, 0), off(exp, 0.0, math.inf, 0)
        if kind == "mish":
            log1p, tanh = off(fixedbits.log1p, 0.0, math.inf, 1), off(fixedbits.tanh, -1.0, 1.0, 2)
    if kind == "mish":
        return _mish(r, exp, log1p, tanh)
    return _tanh_sigmoid(kind, r, tanh, exp)


def _rounding(dtype: str | None) -> Activation:
    """Rounding to ``dtype`` as float64 (None: none)."""
    if dtype is None:
        return lambda a: np.asarray(a, dtype=np.float64)
    return lambda a: round_to_dtype(np.asarray(a, dtype=np.float64), dtype).astype(np.float64)


def _reference_kind(kind: str) -> tuple[str, str] | None:
    """The reference's (model, GELU form) of ``kind``; None for the kinds built here (tanh, sigmoid, Mish)."""
    if kind not in KINDS:
        raise NoActivation(f"no activation of kind {kind!r}; kinds: {', '.join(KINDS)}")
    return _REFERENCE_KIND.get(kind)


def acts_plain(act_dtype: str | None) -> ActsFor:
    """The activations evaluated op by op in ``act_dtype`` (``Arith.act_dtype``: float32 for the plain run, None:
    float64 math), as ``reference.activations`` gives them."""

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind)
        if ref is not None:
            return activations(*ref, act_dtype)
        return _own(kind, _rounding(act_dtype), None)

    return acts_for


def acts_envelope(seed: int) -> ActsFor:
    """The envelope twin's float32 activations: each transcendental (tanh, exp, erf, log1p) off by up to
    ``TRANSCENDENTAL_ERROR_ULPS`` ulps, drawn from ``seed``."""
    e = TRANSCENDENTAL_ERROR_ULPS

    def off(fn: Activation, lo: float, hi: float, stream: int) -> Activation:
        return ulps_off(fn, e, seed, lo, hi, stream)

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind)
        if ref is not None:
            return envelope_activations(ref[0], seed, ref[1])
        return _own(kind, _rounding("float32"), off)

    return acts_for


def acts_signature(ulps: int) -> ActsFor:
    """A signature twin's float64 activations: the transcendentals ``ulps`` float32 ulps off, all one way."""

    def off(fn: Activation, lo: float, hi: float, stream: int) -> Activation:
        return ulps_off(fn, ulps, None, lo, hi)

    def acts_for(kind: str) -> Activations:
        ref = _reference_kind(kind)
        if ref is not None:
            return signature_activations(ref[0], ulps, ref[1])
        return _own(kind, _rounding(None), off)

    return acts_for
