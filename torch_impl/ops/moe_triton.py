"""A mixture-of-experts block with its experts as hand-written Triton grouped GEMMs (:mod:`triton_impl.moe_kernels`):
the torch launchers, the tile table, and autograd.

:func:`moe_triton` ``(x [T, D], params, spec) -> (y [T, D], experts [T, k])``, the signature of
``torch_impl.moe_ops``' forms, computes what ``moe_grouped`` does, with the experts in Triton:

- torch: the router (``moe_ops.route``: logits in ``x``'s dtype, softmax and top-k in at least float32), the sort of
  the ``M = T * k`` assignments by expert (a stable argsort: within an expert by token), the tile table, and the
  combine (``out * w`` in the router's dtype, rounded to ``x``'s dtype, ``index_add_``) as ``moe_grouped``'s;
- Triton (:class:`MoeExperts`): ``h = glu(x[rows] @ gate_up[e].T + b)`` in one grouped GEMM with the activation in
  its epilogue (``g``, ``u`` never stored), then ``out = h @ down[e].T + bd[e]`` as a grouped GEMM.

Gradients: ``dx`` and the router's through torch's autograd of the router and the combine (the combine weights'
gradient ``sum(out * dy)`` is autograd's of ``out * w``), plus the experts' share of ``dx`` from
:class:`MoeExperts`' backward, whose parts are:

- Triton: ``dh = dout @ down[e]`` (grouped GEMM); the fused backward kernel recomputes ``g``, ``u`` from ``x`` and
  writes ``h`` and ``d gate_up`` (``dgu [M, 2I]``, in ``gate_up``'s layout); ``dx_sorted = dgu @ gate_up[e]``
  (grouped GEMM);
- torch: ``dx`` as ``index_add_`` of ``dx_sorted`` onto the tokens, the weight gradients ``d down[e] = dout_e.T @
  h_e`` and ``d gate_up[e] = dgu_e.T @ x[rows_e]`` (one ``mm`` per expert with rows), the bias gradients (row sums
  per expert, ``index_add_``).

The tile table needs the experts' row counts on the host: one device-to-host copy per forward (``counts.tolist()``).
Saved for the backward: ``x`` and the weights, the sort and the tile table; not ``g``, ``u`` or ``h``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton

from compare.problem.moe import MoeSpec
from torch_impl import moe_ops
from triton_impl.env import FP_FUSION
from triton_impl.moe_kernels import CONFIG, INTERPRETED, glu_kernel, matmul_kernel

from ._launch import launch
from .glu import EXACT_BF16_CAST

__all__ = ["MoeExperts", "moe_triton", "tile_table"]


def tile_table(counts: list[int], block_m: int, device: torch.device) -> torch.Tensor:
    """``[tiles, 3]`` int32 (expert, first row, end row) of the sorted rows, ``block_m`` rows of one expert at most
    per tile, for the experts' row ``counts`` (experts without rows have no tile)."""
    table, start = [], 0
    for e, n in enumerate(counts):
        table += [(e, s, min(s + block_m, start + n)) for s in range(start, start + n, block_m)]
        start += n
    return torch.tensor(table, dtype=torch.int32, device=device).reshape(-1, 3)


def _kw(dtype: torch.dtype) -> dict[str, Any]:
    """The launch keywords every kernel takes: the config and the interpreter's two workarounds."""
    return {
        **CONFIG,
        "UPCAST": INTERPRETED and dtype != torch.float32,
        "EXACT_BF16": EXACT_BF16_CAST,
        "enable_fp_fusion": FP_FUSION,
    }


def _glu_kw(spec: MoeSpec) -> dict[str, Any]:
    return {
        "INTERLEAVED": spec.layout == "interleaved",
        "HAS_BIAS": spec.biases,
        "GLU": spec.glu,
        "ALPHA": spec.alpha,
        "LIMIT": spec.limit,
    }


def _grid(tiles: torch.Tensor, n: int) -> tuple[int, int]:
    """One program per tile and ``BLOCK_N`` columns."""
    return tiles.shape[0], triton.cdiv(n, CONFIG["BLOCK_N"])


def grouped_matmul(
    a: torch.Tensor, tiles: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, transpose_b: bool
) -> torch.Tensor:
    """``c [M, N]``: row ``r`` of ``a [M, K]`` (contiguous) times its tile's expert's ``b[e]`` (``b [E, N, K]`` as
    ``b[e].T`` with ``transpose_b``, else ``b [E, K, N]``), plus ``bias[e]`` (``[E, N]``) if given."""
    m, k = a.shape
    sb = b.stride()
    n, stride_bk, stride_bn = (b.shape[1], sb[2], sb[1]) if transpose_b else (b.shape[2], sb[1], sb[2])
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if tiles.shape[0]:
        with launch("_moe_matmul_kernel"):
            matmul_kernel[_grid(tiles, n)](
                a, tiles, b, b if bias is None else bias, c,
                n, k,
                a.stride(0), a.stride(1), sb[0], stride_bk, stride_bn, 0 if bias is None else bias.stride(0),
                c.stride(0),
                HAS_BIAS=bias is not None, **_kw(a.dtype),
            )  # fmt: skip
    return c


def _glu(
    x: torch.Tensor,
    rows: torch.Tensor,
    tiles: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    h: torch.Tensor,
    dh: torch.Tensor | None,
    dgu: torch.Tensor | None,
    spec: MoeSpec,
) -> None:
    """Launch the fused ``gate_up`` kernel into ``h [M, I]`` (contiguous); with ``dh`` (``[M, I]``, contiguous) its
    backward, writing ``dgu [M, 2I]`` too."""
    bias = gate_up if gate_up_bias is None else gate_up_bias  # any pointer where HAS_BIAS is off
    backward = dh is not None and dgu is not None
    if tiles.shape[0]:
        with launch("_moe_glu_kernel"):
            glu_kernel[_grid(tiles, h.shape[1])](
                x, rows, tiles, gate_up, bias, h, dh if backward else h, dgu if backward else h,
                h.shape[1], x.shape[1],
                x.stride(0), x.stride(1), *gate_up.stride(), bias.stride(0), h.stride(0),
                0 if dgu is None else dgu.stride(0),
                BACKWARD=backward, **_glu_kw(spec), **_kw(x.dtype),
            )  # fmt: skip


def _weight_grad(a: torch.Tensor, b: torch.Tensor, counts: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    """``[E, N, K]``: per expert ``a_e.T @ b_e`` over its rows (``a [M, N]``, ``b [M, K]``), zero where it has none
    (torch ``mm``, one per expert with rows)."""
    out = torch.zeros(shape, dtype=a.dtype, device=a.device)
    start = 0
    for e, n in enumerate(counts):
        if n:
            out[e] = a[start : start + n].T @ b[start : start + n]
        start += n
    return out


class MoeExperts(torch.autograd.Function):
    """The experts of the sorted assignments: ``out [M, D]`` (unweighted, ``down_bias`` added) from ``x [T, D]``,
    ``rows [M]`` (int32 tokens), ``eid [M]`` (each row's expert), the tile table and the counts (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        gate_up_bias: torch.Tensor | None,
        down_bias: torch.Tensor | None,
        rows: torch.Tensor,
        eid: torch.Tensor,
        tiles: torch.Tensor,
        counts: list[int],
        spec: MoeSpec,
    ) -> torch.Tensor:
        m, i = rows.shape[0], down.shape[2]
        h = torch.empty((m, i), dtype=x.dtype, device=x.device)
        _glu(x, rows, tiles, gate_up, gate_up_bias, h, None, None, spec)
        out = grouped_matmul(h, tiles, down, down_bias, transpose_b=True)  # h @ down[e].T: down [E, D, I]
        ctx.save_for_backward(x, gate_up, down, gate_up_bias, rows, eid, tiles)
        ctx.counts, ctx.spec = counts, spec
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, gate_up, down, gate_up_bias, rows, eid, tiles = ctx.saved_tensors
        spec, counts = ctx.spec, ctx.counts
        dout = dout.to(x.dtype).contiguous()
        e_, d, i = down.shape
        dh = grouped_matmul(dout, tiles, down, None, transpose_b=False)  # dout @ down[e]: [M, I]
        h = torch.empty_like(dh)
        dgu = torch.empty((dh.shape[0], 2 * i), dtype=x.dtype, device=x.device)
        _glu(x, rows, tiles, gate_up, gate_up_bias, h, dh, dgu, spec)
        dxs = grouped_matmul(dgu, tiles, gate_up, None, transpose_b=False)  # dgu @ gate_up[e]: [M, D]
        dx = torch.zeros_like(x).index_add_(0, rows, dxs)
        xs = x[rows]
        d_gate_up = _weight_grad(dgu, xs, counts, tuple(gate_up.shape))
        d_down = _weight_grad(dout, h, counts, tuple(down.shape))
        d_gub = d_db = None
        if gate_up_bias is not None:
            d_gub = torch.zeros((e_, 2 * i), dtype=x.dtype, device=x.device).index_add_(0, eid, dgu)
            d_db = torch.zeros((e_, d), dtype=x.dtype, device=x.device).index_add_(0, eid, dout)
        return dx, d_gate_up, d_down, d_gub, d_db, None, None, None, None, None


def moe_triton(x: torch.Tensor, params: dict[str, torch.Tensor], spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The block on ``x [T, D]``: ``(y [T, D], experts [T, k])``, the experts in Triton (module docstring)."""
    k = spec.top_k
    logits = F.linear(x, params["router"], params.get("router_bias"))  # [T, E], x's dtype
    weights, experts = moe_ops.route(logits, spec)
    flat = experts.reshape(-1)  # [T*k], token-major
    order = torch.argsort(flat, stable=True)  # [T*k]: by expert, then token
    rows = (order // k).to(torch.int32)  # [T*k]: each sorted row's token
    eid = flat[order]  # [T*k]: its expert
    counts = torch.bincount(flat, minlength=spec.experts).tolist()  # host: the tile table's one sync
    tiles = tile_table(counts, CONFIG["BLOCK_M"], x.device)
    out = MoeExperts.apply(
        x, params["gate_up"], params["down"], params.get("gate_up_bias"), params.get("down_bias"),
        rows, eid, tiles, counts, spec,
    )  # fmt: skip
    w = weights.reshape(-1)[order]  # [T*k]: each sorted row's combine weight
    y = torch.zeros_like(x).index_add_(0, rows, (out * w[:, None]).to(x.dtype))
    return y, experts
