"""A test-only backend that computes a near variant of its model, or its model wrong in a way no variant explains:
the plain same-dtype computation in numpy (``tests/numpy_backend.py``'s arithmetic) with the variant made here by
hand, independently of ``compare.gate.near_variants`` (``tests/test_near_variants.py`` registers it and names the
variant in :data:`ENV`): a dense model's gate and up swapped, a bias dropped, the erf GELU; a MoE block's
``MoeSpec`` changed (layout, clamp limit, the ``+ 1``, router order, renormalisation) or its experts' gate and up
rows swapped; or ``scaled`` (the output times 1.01) and ``noisy`` (noise of 1% of the output's rms added); any other
name (``honest``) computes the model itself."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import numpy as np

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.problem import moe
from compare.problem.cases import MODELS, MOE_MODELS, is_moe
from compare.problem.golden import Problem
from compare.problem.reference import compute
from tests.numpy_backend import blas_plain

NAME = "numpy-variant"
#: The environment variable naming what the backend computes (a variant's name, ``scaled`` or ``noisy``).
ENV = "FUSION_COMPARE_TEST_VARIANT"
SPEC = BackendSpec(
    name=NAME,
    framework="numpy",
    target="tests.near_variant_backend",
    about="a test's backend computing a near variant of its model (or its model scaled or noisy)",
    models=MODELS + MOE_MODELS,
    modes=("fwd",),
)

#: MoE variants by ``MoeSpec`` change
SPEC_CHANGES: dict[str, dict[str, object]] = {
    "concatenated": {"layout": "concat"},
    "interleaved": {"layout": "interleaved"},
    "clamp-dropped": {"limit": math.inf},
    "clamp-at-10": {"limit": 10.0},
    "plus-one-dropped": {"offset": 0.0},
    "softmax-before-top-k": {"order": "softmax-topk", "renormalize": False},
    "renormalisation-missing": {"renormalize": False},
}
#: dense variants by a parameter dropped
DROPPED = {"bias-dropped": "bias", "fc1-bias-dropped": "b1", "fc2-bias-dropped": "b2"}


def _swap_gate_up(params: dict[str, np.ndarray], spec: moe.MoeSpec) -> dict[str, np.ndarray]:
    """A MoE block's experts with their gate and up rows traded (as its layout places them)."""
    out = dict(params)
    for name in ("gate_up", "gate_up_bias"):
        if name not in params:
            continue
        w = params[name].copy()
        if spec.layout == "interleaved":
            w[:, ::2], w[:, 1::2] = params[name][:, 1::2], params[name][:, ::2]
        else:
            h = w.shape[1] // 2
            w[:, :h], w[:, h:] = params[name][:, h:], params[name][:, :h]
        out[name] = w
    return out


def forward(
    model: str, variant: str, x: np.ndarray, params: dict[str, np.ndarray], dtype: str
) -> dict[str, np.ndarray]:
    """``y`` (and a MoE block's ``routing``) of ``variant`` of ``model`` on ``x`` in the plain ``dtype`` arithmetic."""
    ar = blas_plain(dtype)
    p = dict(params)
    if is_moe(model):
        spec = dataclasses.replace(moe.MOE_SPECS[model], **SPEC_CHANGES.get(variant, {}))  # type: ignore[arg-type]
        if variant == "gate-up-swapped":
            p = _swap_gate_up(p, spec)
        out = moe.moe_fwd_bwd(x.reshape(-1, x.shape[-1]), p, None, ar, spec)
        y, extra = out["y"].reshape((*x.shape[:-1], -1)), {"routing": out["routing"].astype(np.float64)}
    else:
        if variant == "gate-up-swapped":
            p["gate"], p["up"] = params["up"], params["gate"]
        if variant in DROPPED:
            p[DROPPED[variant]] = np.zeros_like(params[DROPPED[variant]])
        y = compute(model, x, p, None, ar, gelu="erf" if variant == "erf-gelu" else "tanh")["y"]
        extra = {}
    if variant == "scaled":
        y = y * 1.01
    if variant == "noisy":
        rng = np.random.default_rng(0)
        y = y + 0.01 * float(np.sqrt(np.mean(y**2))) * rng.standard_normal(y.shape)
    return {"y": np.asarray(y, dtype=np.float64), **extra}


class VariantBackend:
    name = NAME

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        if mode != "fwd":
            raise ValueError(f"{NAME} runs the forward alone")
        case, variant = problem.case, os.environ.get(ENV, "")

        def step_on(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return forward(case.model, variant, inputs["x"], problem.params, case.dtype)

        def bind(inputs: dict[str, np.ndarray], _slot: int) -> Callable[[], dict[str, np.ndarray]]:
            return lambda: step_on(inputs)

        return Prepared(
            step=lambda: step_on(problem.inputs), sync=lambda outs: None, to_numpy=lambda out: dict(out), bind=bind
        )


BACKEND = VariantBackend()
