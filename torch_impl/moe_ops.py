"""Mixture-of-experts MLP blocks in torch, forward only (autograd gives the backward), for any
:class:`~compare.problem.moe.MoeSpec`: the router, ``E`` gated experts and the weighted combine, as two
implementations of one signature, each returning ``(y [T, D], experts [T, k] int64)``:

- :func:`moe_loop`: transformers' eager form: a Python loop over the experts that have tokens (gather the tokens,
  ``gate_up`` linear, activation, ``down`` linear, scale, ``index_add_``). Nothing is fused: per expert and GEMM one
  ``mm``.
- :func:`moe_grouped`: the ``T * k`` (token, slot) assignments sorted by expert (a stable argsort: within an expert
  by token, as the loop takes them), the rows gathered once (the permute), each expert GEMM as ONE
  ``torch.nn.functional.grouped_mm`` over all experts (int32 offsets: each group's cumulative end), the activation
  once over all rows, and the combine (weighting and unpermute) as one ``index_add_``. The permute and combine are
  plain gathers/scatters, not fused into the GEMMs; the activation is not fused either.

Shapes (``compare.problem.moe``'s canonical names, torch's ``(out, in)`` layout): ``x [T, D]``, ``router [E, D]``,
``gate_up [E, 2I, D]``, ``down [E, D, I]``, with biases ``router_bias [E]``, ``gate_up_bias [E, 2I]``,
``down_bias [E, D]``; every parameter in ``x``'s dtype.

Numerics (both implementations alike): the linears run in ``x``'s dtype (the biases added after the GEMM, as
gpt-oss's eager block does); the router's softmax, top-k and renormalisation run in at least float32
(``promote_types(dtype, float32)``: float64 stays float64), for every router order; that is transformers' choice for
Qwen3-MoE and Mixtral (gpt-oss's eager block keeps a bfloat16 router in bfloat16: not modelled). The combine weight
stays in that router dtype, so ``out * w`` is computed there and rounded to ``x``'s dtype before the ``index_add_``
(as transformers' Mixtral does). Top-k is a stable descending sort: ties go to the lower expert index, as the
golden's ``np.argsort(kind="stable")`` (``torch.topk`` on CPU does not promise that: on ``[1, 3, 3, 2, 3]`` it
returns ``[2, 4, 1]``). Softmax-topk ranks the probabilities, topk-softmax the logits, as the golden does.

``grouped_mm`` as measured on this CPU build (torch 2.13): ``grouped_mm(a [M, K], b [G, K, N], offs=int32 [G])``
computes ``a[s_g:e_g] @ b[g]``; our ``[E, N, K]`` weights are passed as the view ``w.mT`` (no copy). dtypes float32,
bfloat16 and float16 only (float64 is refused: "Expected mat_a to be Float32, BFloat16 or Float16"); offsets must be
int32; the non-unit stride of each operand must be a multiple of 16 bytes (``K`` and ``N`` multiples of 4 float32 or
8 bfloat16 elements); ``bias=`` is refused ("Bias not supported yet"); ``out_dtype`` must equal the input's. Autograd
works for all three dtypes, and its backward is itself two ``_grouped_mm`` calls per GEMM (``dA`` and the per-group
``dW`` with the offsets on the token dimension): no custom ``autograd.Function`` is needed. Output rows past
``offs[-1]`` are left unwritten (ours never has any). On CPU torch runs ``grouped_mm`` as a C++ loop of one ``mm``
per group (its ``_grouped_mm_fallback``, per torch's source; we measured the same bits as a loop of ``a_g @ w_g.T``,
forward and backward): one op call instead of ``E``, not a grouped kernel.

What runs grouped, exactly: where both operands are float32/bfloat16/float16 with 16-byte-aligned strides
(:func:`grouped_mm_applies`), the two expert GEMMs forward and their four backward GEMMs run as ``_grouped_mm``.
Otherwise (float64: every golden comparison at full precision; or unaligned widths) each GEMM is a Python loop of
``a_g @ w_g.T`` over the groups with ordinary autograd: the same permutation, offsets, activation and combine, but
no grouped GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compare.problem.golden import Problem
from compare.problem.moe import MOE_SPECS, MoeSpec

__all__ = ["MoeBlock", "build", "grouped_mm_applies", "moe_grouped", "moe_loop", "route"]

#: The dtypes ``grouped_mm`` accepts (torch's ``_grouped_mm_validate_inputs``; float64 is refused on CPU).
GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def route(logits: torch.Tensor, spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The combine ``weights [T, k]`` (in ``promote_types(logits.dtype, float32)``) and ``experts [T, k]`` (int64,
    largest score first, ties to the lower index) of router ``logits [T, E]``."""
    lg = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if spec.order == "softmax-topk":  # softmax over all E, top k of the probabilities, optional renormalisation
        probs = torch.softmax(lg, dim=-1)
        experts = _top_k(probs, spec.top_k)
        weights = probs.gather(1, experts)
        if spec.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts
    experts = _top_k(lg, spec.top_k)  # topk-softmax: top k of the logits, softmax over those k
    return torch.softmax(lg.gather(1, experts), dim=-1), experts


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[T, k]`` of each row's ``k`` largest scores. A stable descending sort keeps equal scores in index
    order, so ties go to the lower expert as in the golden (``torch.topk`` leaves tie order unspecified)."""
    return torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[:, :k]


def _glu(gu: torch.Tensor, spec: MoeSpec) -> torch.Tensor:
    """``h [M, I]`` from the fused ``gate_up`` output ``gu [M, 2I]``: split per layout, then the spec's GLU."""
    if spec.layout == "interleaved":  # gate at even columns, up at odd (gpt-oss)
        gate, up = gu[:, ::2], gu[:, 1::2]
    else:  # concat: gate columns first, then up (chunk(2))
        gate, up = gu.chunk(2, dim=-1)
    if spec.glu == "swiglu":
        return F.silu(gate) * up
    # gpt-oss's clamped SwiGLU: gate clamped above, up to [-limit, limit]; (up + 1) * gate * sigmoid(alpha * gate)
    gate = gate.clamp(max=spec.limit)
    up = up.clamp(min=-spec.limit, max=spec.limit)
    return (up + spec.offset) * (gate * torch.sigmoid(gate * spec.alpha))


def _logits(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Router logits ``[T, E]`` in ``x``'s dtype."""
    return F.linear(x, params["router"], params.get("router_bias"))


def moe_loop(x: torch.Tensor, params: dict[str, torch.Tensor], spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The block on ``x [T, D]``: ``(y [T, D], experts [T, k])``, a Python loop over the experts with tokens."""
    weights, experts = route(_logits(x, params), spec)
    # per expert views, unbound once: indexing [e] in the loop would make autograd write a zero [E, ...] gradient
    # per expert hit and add them all (most of the loop's time at E = 128); unbind's backward stacks once
    names = ("gate_up", "down", "gate_up_bias", "down_bias") if spec.biases else ("gate_up", "down")
    per = {n: params[n].unbind(0) for n in names}
    y = torch.zeros_like(x)
    for e in torch.unique(experts).tolist():  # ascending: the golden's expert order of the sums into y
        tok, slot = torch.where(experts == e)  # tokens ascending, each token once
        gu = F.linear(x[tok], per["gate_up"][e])  # [n, 2I]
        if spec.biases:
            gu = gu + per["gate_up_bias"][e]
        out = F.linear(_glu(gu, spec), per["down"][e])  # [n, D]
        if spec.biases:
            out = out + per["down_bias"][e]
        y.index_add_(0, tok, (out * weights[tok, slot, None]).to(x.dtype))
    return y, experts


def _aligned(m: torch.Tensor) -> bool:
    """Whether ``grouped_mm`` takes operand ``m`` (torch's ``check_valid_strides_and_return_transposed``): one of
    the last two dims unit-stride, the other's stride a multiple of 16 bytes (and, off CPU, a 16-byte data pointer)."""
    align = 16 // m.element_size()
    s, n = m.stride(), m.shape
    if s[-2] == 1 and s[-1] >= max(1, n[-2]):
        ok = s[-1] % align == 0
    elif s[-1] == 1 and s[-2] >= max(1, n[-1]):
        ok = s[-2] % align == 0
    else:
        return False
    return ok and (m.device.type == "cpu" or m.data_ptr() % 16 == 0)


def grouped_mm_applies(a: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``a [M, K]`` times the ``[E, N, K]`` weights ``w`` (as ``w.mT``) runs as ``grouped_mm``."""
    return a.dtype == w.dtype and a.dtype in GROUPED_DTYPES and _aligned(a) and _aligned(w.mT)


@torch.library.custom_op("fusion_compare::grouped_linear", mutates_args=())
def _opaque_grouped_linear(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``grouped_mm(a [M, K], w.mT, offs) -> [M, N]`` as a custom op ``torch.compile`` does not trace into: torch's
    fake (meta) ``grouped_mm`` accepts bfloat16 only ("Expected inputs of BF16 type", torch 2.13), where the CPU
    kernel takes float32 and float16 too, so a compiled float32 ``grouped_mm`` fails to trace. Same bits as eager."""
    return F.grouped_mm(a, w.mT, offs=offs)


@_opaque_grouped_linear.register_fake
def _(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], w.shape[1]))


@torch.library.custom_op("fusion_compare::grouped_linear_backward", mutates_args=())
def _opaque_grouped_linear_backward(
    dout: torch.Tensor, a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(da [M, K], dw [E, N, K])`` of :func:`_opaque_grouped_linear` for ``dout [M, N]``, opaque to ``torch.compile``
    as the forward is: the two ``grouped_mm`` eager autograd runs (``da = dout_g @ w[g]``; ``dw[g] = dout_g.T @ a_g``,
    the offsets on the token dimension), the same bits as its autograd (measured)."""
    return F.grouped_mm(dout, w, offs=offs), F.grouped_mm(dout.T, a, offs=offs)


@_opaque_grouped_linear_backward.register_fake
def _(dout: torch.Tensor, a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.new_empty(a.shape), w.new_empty(w.shape)


def _opaque_setup(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _opaque_backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    a, w, offs = ctx.saved_tensors
    da, dw = _opaque_grouped_linear_backward(dout.contiguous(), a, w, offs)
    return da, dw, None


_opaque_grouped_linear.register_autograd(_opaque_backward, setup_context=_opaque_setup)


def _grouped_linear(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``[M, N]``: rows ``offs[g-1]:offs[g]`` of ``a [M, K]`` times ``w[g].T`` (``w [E, N, K]``), every group in one
    ``grouped_mm`` where it applies, else a loop of ``mm`` over the groups (module docstring). Under
    ``torch.compile`` a non-bfloat16 ``grouped_mm`` is the opaque custom op :func:`_opaque_grouped_linear` (torch's
    fake ``grouped_mm`` refuses it); bfloat16 is traced as it is."""
    if grouped_mm_applies(a, w):
        if torch.compiler.is_compiling() and a.dtype != torch.bfloat16:
            return _opaque_grouped_linear(a, w, offs)
        return F.grouped_mm(a, w.mT, offs=offs)
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([a[s:e] @ w[g].T for g, (s, e) in enumerate(zip(starts, ends, strict=True))])


def moe_grouped(x: torch.Tensor, params: dict[str, torch.Tensor], spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The block on ``x [T, D]``: ``(y [T, D], experts [T, k])``, assignments sorted by expert, grouped GEMMs."""
    k = spec.top_k
    weights, experts = route(_logits(x, params), spec)
    flat = experts.reshape(-1)  # [T*k]: the expert of each (token, slot), token-major
    order = torch.argsort(flat, stable=True)  # [T*k]: by expert, then token (as the loop's torch.where)
    rows = order // k  # [T*k]: the token of each sorted assignment
    eid = flat[order]  # [T*k]: its expert (ascending)
    offs = torch.bincount(flat, minlength=spec.experts).cumsum(0).to(torch.int32)  # [E]: each group's end
    gu = _grouped_linear(x[rows], params["gate_up"], offs)  # [T*k, 2I]
    if spec.biases:  # per row, by its expert
        gu = gu + params["gate_up_bias"][eid]
    out = _grouped_linear(_glu(gu, spec), params["down"], offs)  # [T*k, D]
    if spec.biases:
        out = out + params["down_bias"][eid]
    w = weights.reshape(-1)[order]  # [T*k]: the combine weight of each sorted assignment
    y = torch.zeros_like(x).index_add_(0, rows, (out * w[:, None]).to(x.dtype))
    return y, experts


#: A MoE block's forward: ``(x [T, D], params, spec) -> (y [T, D], experts [T, k])`` (:func:`moe_loop`,
#: :func:`moe_grouped`).
MoeForward = Callable[[torch.Tensor, dict[str, torch.Tensor], MoeSpec], tuple[torch.Tensor, torch.Tensor]]


class MoeBlock(nn.Module):
    """A MoE case's block as an ``nn.Module`` for the shared runner (``torch_impl.runner``): its parameters under
    their canonical names (``compare.problem.moe``: ``router``, ``gate_up``, ``down`` and the biases, in
    ``MoeSpec.weight_shapes``' order, so the ``state_dict`` names are the canonical ones), ``forward(x [..., D])``
    the block through ``impl`` over the flattened tokens: ``(y [..., D], experts [T, k])``. The experts are the
    step's routing, which the gate reads beside the tensors it judges (``compare.gate.routing``)."""

    def __init__(self, spec: MoeSpec, params: dict[str, torch.Tensor], impl: MoeForward) -> None:
        super().__init__()
        self.spec, self.impl = spec, impl
        for name, value in params.items():
            self.register_parameter(name, nn.Parameter(value))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params: dict[str, torch.Tensor] = dict(self.named_parameters())
        y, experts = self.impl(x.reshape(-1, x.shape[-1]), params, self.spec)
        return y.reshape(x.shape), experts


def build(problem: Problem, device: torch.device, dtype: torch.dtype, impl: MoeForward) -> MoeBlock:
    """The case's :class:`MoeBlock` on ``device`` in ``dtype`` (its spec: ``MOE_SPECS`` of the case's model), every
    parameter a copy of the problem's, in ``MoeSpec.weight_shapes``' order."""
    s = problem.case.shape
    spec = MOE_SPECS[problem.case.model]
    params = {
        name: torch.from_numpy(problem.params[name]).to(device=device, dtype=dtype)
        for name in spec.weight_shapes(s.dim, s.hidden)
    }
    return MoeBlock(spec, params, impl)
