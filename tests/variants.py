"""Honest implementation differences, built in numpy on the reference's own code path (``compare.problem.reference``):
each
computes the same function as the plain computation, in the case dtype, but the way some real implementation does.
The parity gate must never put one of them in its fail tier (``tests/test_variants.py``); where the gate's fail
lines sit is set against them.

- accumulation orders of the float32 GEMMs and token sums: sequential with FMA, reversed, pairwise, blocked by 16 to
  256 (each block summed from zero, then added to the output, as a K-blocked GEMM kernel does), split-K in 4;
- transcendentals (tanh in GELU, exp in SiLU's sigmoid) off by up to 4 float32 ulp, at random or all one way, in the
  plain computation's float32 activation;
- the activation and its derivative evaluated op by op in the case dtype with their constants rounded to it (what
  ``jax.nn.gelu`` does on 16-bit inputs);
- a 16-bit GEMM whose output stays float32 for the next operation (fewer roundings than the plain computation).

Every variant is a pure function of the case (seeded where it draws), so its verdict is the same on every machine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from compare.problem import fixedbits
from compare.problem.cases import Case
from compare.problem.golden import golden_for
from compare.problem.reference import Activations, Arith, activations_in, compute, exp_saturating, ulps_off

Gemm = Callable[[np.ndarray, np.ndarray], np.ndarray]
ULP32 = 2.0**-23


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def sequential_fma(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``acc = fl32(acc + a_ip b_pj)`` with the product exact (an FMA; the float64 sum rounded once to float32)."""
    a32, b32 = _f32(a), _f32(b)
    acc = np.zeros((a32.shape[0], b32.shape[1]), dtype=np.float32)
    for p in range(a32.shape[1]):
        acc = (acc.astype(np.float64) + a32[:, p : p + 1].astype(np.float64) * b32[p].astype(np.float64)).astype(
            np.float32
        )
    return acc


def reversed_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sequential, from the last ``k`` to the first."""
    return fixedbits.matmul32(_f32(a)[:, ::-1], _f32(b)[::-1])


def pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The float32 products ``fl32(a_ip b_pj)`` summed as a balanced binary tree over ``k`` (in float32)."""
    a32, b32 = _f32(a), _f32(b)
    terms = [a32[:, p : p + 1] * b32[p] for p in range(a32.shape[1])]
    while len(terms) > 1:
        nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms[0] if terms else np.zeros((a32.shape[0], b32.shape[1]), dtype=np.float32)


def blocked(size: int) -> Gemm:
    """Blocks of ``size`` along ``k``, each accumulated sequentially from zero, then added to the output in order."""

    def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a32, b32 = _f32(a), _f32(b)
        out = np.zeros((a32.shape[0], b32.shape[1]), dtype=np.float32)
        for k0 in range(0, a32.shape[1], size):
            out += fixedbits.matmul32(a32[:, k0 : k0 + size], b32[k0 : k0 + size])
        return out

    gemm.__name__ = f"blocked_{size}"
    return gemm


def split_k(parts: int) -> Gemm:
    """``k`` cut into ``parts`` contiguous chunks, each sequential, the partial products summed in float32."""

    def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a32, b32 = _f32(a), _f32(b)
        bounds = np.linspace(0, a32.shape[1], parts + 1).astype(int)
        out = np.zeros((a32.shape[0], b32.shape[1]), dtype=np.float32)
        for lo, hi in itertools.pairwise(bounds):
            out += fixedbits.matmul32(a32[:, lo:hi], b32[lo:hi])
        return out

    gemm.__name__ = f"split_k_{parts}"
    return gemm


@dataclass(frozen=True)
class Variant:
    """One honest implementation difference: how it computes (``arith``, ``acts``) given the case."""

    name: str
    what: str
    arith: Callable[[Case], Arith]
    acts: Callable[[Case], Activations | None] = lambda case: None
    #: Dtypes where the variant differs from the plain computation (elsewhere it is not run: it would change nothing).
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")


def _gemm_variant(
    name: str, what: str, gemm: Gemm, dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
) -> Variant:
    return Variant(name, what, lambda case: Arith(case.dtype, gemm=gemm), dtypes=dtypes)


def _act_variant(name: str, what: str, acts: Callable[[Case], Activations]) -> Variant:
    return Variant(name, what, lambda case: Arith.plain(case.dtype), acts)


def _transcendental(case: Case, ulps: int, seed: int | None) -> Activations:
    """The plain computation's float32 activation with its tanh (GELU) or exp (SiLU) ``ulps`` off."""
    return activations_in(
        case.model,
        "tanh",
        "float32",
        tanh=ulps_off(fixedbits.tanh, ulps, seed, -1.0, 1.0),
        exp=ulps_off(exp_saturating, ulps, seed, 0.0, math.inf),
    )


VARIANTS: tuple[Variant, ...] = (
    # a product of two bf16 or fp16 values is exact in float32 (16 or 22 bits): FMA changes nothing there
    _gemm_variant("fma", "sequential float32 accumulation with FMA", sequential_fma, ("float32",)),
    _gemm_variant("reversed", "sequential float32 accumulation, last k first", reversed_order),
    _gemm_variant("pairwise", "pairwise (tree) float32 summation over k", pairwise),
    _gemm_variant("blocked-16", "k in blocks of 16, each from zero", blocked(16)),
    _gemm_variant("blocked-64", "k in blocks of 64, each from zero", blocked(64)),
    _gemm_variant("blocked-256", "k in blocks of 256, each from zero", blocked(256)),
    _gemm_variant("split-k-4", "k split in 4 chunks, partial products added", split_k(4)),
    _act_variant(
        "transcendental-4ulp", "tanh / exp off by up to 4 float32 ulp at random", lambda c: _transcendental(c, 4, 12345)
    ),
    _act_variant(
        "transcendental+4ulp", "tanh / exp 4 float32 ulp too large everywhere", lambda c: _transcendental(c, 4, None)
    ),
    _act_variant(
        "transcendental-4ulp-low",
        "tanh / exp 4 float32 ulp too small everywhere",
        lambda c: _transcendental(c, -4, None),
    ),
    Variant(
        "activation-in-dtype",
        "activation op by op in the dtype, constants rounded",
        lambda case: Arith(case.dtype, act_in=case.dtype),
        dtypes=("bfloat16", "float16"),
    ),
    Variant(
        "float32-intermediates",
        "16-bit GEMMs whose outputs stay float32 until the next op (only the outputs rounded to the dtype)",
        lambda case: Arith(case.dtype, inner="float32"),
        dtypes=("bfloat16", "float16"),
    ),
)


@cache
def variant_outputs(name: str, case: Case) -> dict[str, np.ndarray]:
    """Every output and gradient of ``case`` (fwd+bwd) computed by variant ``name``."""
    v = next(v for v in VARIANTS if v.name == name)
    g = golden_for(case)
    return compute(case.model, g.x, g.params, g.dy, v.arith(case), acts=v.acts(case))
