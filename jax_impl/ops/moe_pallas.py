"""A mixture-of-experts block with its experts as Pallas grouped GEMMs: :func:`moe_pallas` ``(params, x [T, D], spec)
-> (y [T, D], experts [T, k] int32)``, the signature of ``jax_impl.moe_ops``' forms, jit-able with ``spec`` static.

What runs where:

- ``jax.numpy`` (XLA): the router (``moe_ops.route``), the stable sort of the ``M = T * k`` assignments by expert,
  the gather of ``x``'s rows into ``xs [M, D]`` (padded by ``block_m`` zero rows), the tile table, the split of
  ``gate_up [E, 2I, D]`` into ``Wg``, ``Wu [E, I, D]`` (and the bias alike; a strided copy for gpt-oss's interleaved
  rows), the combine weights and the scatter-add back to the tokens (``moe_ragged``'s).
- Pallas, :func:`_grouped_kernel` twice, over a grid ``(tiles, I / block_n)`` then ``(tiles, D / block_n)``: a tile
  is at most ``block_m`` sorted rows of one expert (the table ``[tiles, 3]``: expert, first row, end row; its
  length ``cdiv(M, block_m) + E`` is static, tiles past the last expert's are empty). The first call computes ``g =
  xs @ Wg[e].T (+ bg[e])`` and ``u`` alike from the same loaded rows and writes only ``h = glu(g, u)`` (SwiGLU or
  gpt-oss's clamped form, float32 math): ``g`` and ``u`` never reach memory. The second is ``out = h @ down[e].T (+
  bd[e])``. Each program reads its tile's rows over the whole of ``D`` (or ``I``) at once: no K loop, so a
  program's block is ``block_m x D``; fine for the CPU presets' widths, not for a GPU at gpt-oss's 2880.

Backward: the experts are a ``jax.custom_vjp`` whose backward is ``jax.vjp`` of a ``jax.numpy`` reference of the same
experts (:func:`_experts_reference`: ``jax.lax.ragged_dot`` over the sorted rows, as ``moe_ragged``), not a Pallas
kernel; the router's and the combine's gradients are JAX's autodiff of the ``jax.numpy`` parts. Residuals: the
experts' inputs (``xs``, the weights, the group sizes).

Precision: every tile upcast to float32, ``precision=HIGHEST`` dots, float32 epilogue, one rounding to the input
dtype on each store. Verified only under ``interpret=True`` (CPU); on a GPU the Pallas Triton lowering would need
power-of-two blocks and the masked stores it is written with, untested here.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from compare.problem.moe import MoeSpec
from jax_impl import moe_ops
from jax_impl.device import PRECISION

__all__ = ["BLOCK_M", "moe_pallas", "tile_table"]

#: Rows per tile: the CPU presets' experts hold 1 to 10 rows of their 24 tokens' assignments.
BLOCK_M = 16
#: The widest column block (each block divides its width: :func:`_block_n`).
MAX_BLOCK_N = 128


def _block_n(n: int) -> int:
    """A column block that divides ``n`` (so no column is masked): ``gcd(n, MAX_BLOCK_N)``."""
    return math.gcd(n, MAX_BLOCK_N)


def tile_table(sizes: jax.Array, m: int, block_m: int) -> jax.Array:
    """``[cdiv(m, block_m) + E, 3]`` int32 (expert, first row, end row) of the ``m`` sorted rows for the experts' row
    counts ``sizes [E]``: an expert with ``n`` rows has ``cdiv(n, block_m)`` tiles, in expert order, and the table's
    tail past them is empty tiles (first row = end row = 0). Static length: jit-able."""
    e_count = sizes.shape[0]
    per = (sizes + block_m - 1) // block_m  # [E] tiles per expert
    ends = jnp.cumsum(per)  # [E]: one past each expert's last tile
    starts = jnp.cumsum(sizes) - sizes  # [E]: each expert's first row
    t = jnp.arange(pl.cdiv(m, block_m) + e_count)
    e = jnp.minimum(jnp.searchsorted(ends, t, side="right"), e_count - 1)
    valid = t < ends[-1]
    first = starts[e] + (t - (ends[e] - per[e])) * block_m
    end = jnp.minimum(first + block_m, starts[e] + sizes[e])
    return jnp.stack([e, jnp.where(valid, first, 0), jnp.where(valid, end, 0)], axis=1).astype(jnp.int32)


def _glu_f32(g: jax.Array, u: jax.Array, spec: MoeSpec) -> jax.Array:
    """``h`` of float32 ``g``, ``u``: ``silu(g) * u`` or gpt-oss's clamped form (``compare.problem.moe``)."""
    if spec.glu == "swiglu":
        return g * jax.nn.sigmoid(g) * u
    gc = jnp.minimum(g, spec.limit)
    uc = jnp.clip(u, -spec.limit, spec.limit)
    return (uc + 1.0) * (gc * jax.nn.sigmoid(spec.alpha * gc))


def _grouped_kernel(tiles_ref, a_ref, *refs, block_m: int, block_n: int, spec: MoeSpec | None, has_bias: bool):
    # One program: rows [start, end) of one expert e (at most block_m), columns j*block_n + [0, block_n).
    # spec given: refs = (Wg, Wu[, bg, bu], h): h = glu(a Wg[e]^T + bg[e], a Wu[e]^T + bu[e]); else
    # refs = (W[, b], out): out = a W[e]^T + b[e]. Weights [E, N, K]; a [M + block_m, K]; out [M + block_m, N].
    n_w = 1 if spec is None else 2
    w_refs, out_ref = refs[:n_w], refs[-1]
    b_refs = refs[n_w : 2 * n_w] if has_bias else ()
    t, j = pl.program_id(0), pl.program_id(1)
    e, start, end = tiles_ref[t, 0], tiles_ref[t, 1], tiles_ref[t, 2]
    rows, cols = pl.ds(start, block_m), pl.ds(j * block_n, block_n)
    a = a_ref[rows, :].astype(jnp.float32)  # [block_m, K]
    accs = []
    for i, w_ref in enumerate(w_refs):
        acc = jnp.dot(a, w_ref[e, cols, :].astype(jnp.float32).T, precision=PRECISION)  # [block_m, block_n]
        if has_bias:
            acc = acc + b_refs[i][e, cols].astype(jnp.float32)[None, :]
        accs.append(acc)
    val = accs[0] if spec is None else _glu_f32(accs[0], accs[1], spec)
    mask = jnp.broadcast_to((start + jnp.arange(block_m) < end)[:, None], (block_m, block_n))
    plgpu.store(out_ref.at[rows, cols], val.astype(out_ref.dtype), mask=mask)


def _grouped_call(
    tiles: jax.Array, a: jax.Array, ws: tuple[jax.Array, ...], bs: tuple[jax.Array, ...], spec: MoeSpec | None
) -> jax.Array:
    """``[M + BLOCK_M, N]``: the grouped GEMM of ``a [M + BLOCK_M, K]`` (rows past ``M`` zero) with ``ws`` ``[E, N,
    K]`` (one, or gate and up with ``spec``'s activation in the epilogue) and the biases ``bs`` (``[E, N]`` each, or
    none). Rows no tile covers are left zero."""
    n = ws[0].shape[1]
    block_n = _block_n(n)
    kernel = functools.partial(_grouped_kernel, block_m=BLOCK_M, block_n=block_n, spec=spec, has_bias=bool(bs))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0], n), a.dtype),
        grid=(tiles.shape[0], n // block_n),
        interpret=_interpret(),
        name="moe_glu_grouped" if spec is not None else "moe_grouped",
    )(tiles, a, *ws, *bs)


def _interpret() -> bool:
    """Interpret unless the default backend is a GPU (the Pallas Triton lowering's target)."""
    return jax.default_backend() not in ("gpu", "cuda", "rocm")


def _split_rows(w: jax.Array | None, spec: MoeSpec) -> tuple[jax.Array, ...]:
    """``gate_up`` (``[E, 2I, D]``) or its bias (``[E, 2I]``) as its gate and up halves (``moe_ops``' split along
    axis 1); none without it."""
    if w is None:
        return ()
    return tuple(jnp.moveaxis(p, -1, 1) for p in moe_ops._split(jnp.moveaxis(w, 1, -1), spec))


def _experts_reference(xs, gate_up, gate_up_bias, down, down_bias, sizes, spec: MoeSpec) -> jax.Array:
    """``out [M, D]`` of the sorted rows ``xs [M, D]`` in ``jax.numpy``: ``moe_ragged``'s experts (``ragged_dot``)."""
    by_expert = jnp.repeat(jnp.arange(sizes.shape[0]), sizes, total_repeat_length=xs.shape[0])
    gu = jax.lax.ragged_dot(xs, jnp.swapaxes(gate_up, 1, 2), sizes, precision=PRECISION)
    if gate_up_bias is not None:
        gu = gu + gate_up_bias[by_expert]
    h = moe_ops.glu(*moe_ops._split(gu, spec), spec)
    out = jax.lax.ragged_dot(h, jnp.swapaxes(down, 1, 2), sizes, precision=PRECISION)
    return out if down_bias is None else out + down_bias[by_expert]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _experts(xs, gate_up, gate_up_bias, down, down_bias, sizes, spec: MoeSpec) -> jax.Array:
    """``out [M, D]``: the experts of the sorted rows ``xs [M, D]`` (expert ``e`` owns ``sizes[e]`` rows) through
    the two Pallas calls; ``down_bias`` added, not yet weighted."""
    m = xs.shape[0]
    tiles = tile_table(sizes, m, BLOCK_M)
    pad = jnp.zeros((BLOCK_M, xs.shape[1]), xs.dtype)
    h = _grouped_call(
        tiles, jnp.concatenate([xs, pad]), _split_rows(gate_up, spec), _split_rows(gate_up_bias, spec), spec
    )  # [M + BLOCK_M, I]: the padding rows zero
    out = _grouped_call(tiles, h, (down,), () if down_bias is None else (down_bias,), None)
    return out[:m]


def _experts_fwd(xs, gate_up, gate_up_bias, down, down_bias, sizes, spec):
    out = _experts(xs, gate_up, gate_up_bias, down, down_bias, sizes, spec)
    return out, (xs, gate_up, gate_up_bias, down, down_bias, sizes)


def _experts_bwd(spec, residuals, dout):
    *args, sizes = residuals
    _, vjp = jax.vjp(lambda xs, gu, gub, d, db: _experts_reference(xs, gu, gub, d, db, sizes, spec), *args)
    return (*vjp(dout), np.zeros(sizes.shape, dtype=jax.dtypes.float0))


_experts.defvjp(_experts_fwd, _experts_bwd)


def moe_pallas(params: dict[str, Any], x: jax.Array, spec: MoeSpec) -> tuple[jax.Array, jax.Array]:
    """The block: ``y [T, D]`` and ``experts [T, k]``; the experts in Pallas (module docstring)."""
    experts, weights = moe_ops.route(params, x, spec)
    k = spec.top_k
    flat = experts.reshape(-1)  # [T * k], token-major
    order = jnp.argsort(flat, stable=True)  # by expert, then token
    tokens = order // k  # [T * k]: each sorted row's token
    sizes = jnp.bincount(flat, length=spec.experts).astype(jnp.int32)  # [E]
    out = _experts(
        x[tokens], params["gate_up"], params.get("gate_up_bias"), params["down"], params.get("down_bias"), sizes, spec
    )
    out = out * weights.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[tokens].add(out), experts
