"""Mixture-of-experts MLP blocks in pure JAX, two formulations of one function: ``f(params, x, spec) -> (y [T, D],
experts [T, k] int32)``, jit-able with ``spec`` static (a frozen :class:`~compare.problem.moe.MoeSpec`), backward by
``jax.vjp`` / ``jax.grad``. What they compute is ``compare.problem.moe``'s (its module docstring; its float64 golden
``moe_fwd_bwd`` judges both: tests/test_moe_jax_ops.py).

Shapes: ``x [T, D]``; ``params`` in torch's ``(out, in)`` layout, as the golden's: ``router [E, D]``, ``gate_up
[E, 2I, D]``, ``down [E, D, I]`` and, with ``spec.biases``, ``router_bias [E]``, ``gate_up_bias [E, 2I]``,
``down_bias [E, D]``. Every GEMM runs at ``precision=HIGHEST`` (``jax_impl.device.PRECISION``, as the backends pin
it: no TF32 or bf16 passes for float32) in the operands' dtype.

Routing (:func:`route`, shared): ``logits = x @ router.T (+ router_bias)`` in ``x``'s dtype; the softmax and the
top-k in ``promote_types(x.dtype, float32)`` (float32 for bfloat16 / float16 inputs, as transformers' Qwen3-MoE and
Mixtral routers take theirs; the input dtype for float32 and float64); the combine weights ``[T, k]`` are cast back
to ``x``'s dtype before the combine. ``jax.lax.top_k`` returns each row's k largest largest first and breaks ties to
the lower index, the golden's stable-sort rule (measured on jax 0.10.2, CPU, in float32, bfloat16 and float64, as its
docstring says); where it differs from the golden's ``np.argsort(-s, kind="stable")`` is only off the real line of
routing scores: it orders ``+0.0`` above ``-0.0`` (numpy: equal, so the lower index first) and a NaN above every
number (numpy: last). The top-k choice has no gradient; the router's gradient flows through the chosen weights.

Formulations:

- :func:`moe_dense`, the one-hot baseline: every token through every expert (two einsums over all ``E``), then a
  combine with a ``[T, E]`` weight matrix that is zero off each token's top k. The simplest correct XLA program;
  ``E / k`` times the expert FLOPs of the routed block (every token through ``E`` experts instead of its ``k``: 16x
  for Qwen3-MoE's 128 / 8, 4x Mixtral's, 8x gpt-oss-20b's), and it materialises ``[T, E, 2I]``, ``[T, E, I]`` and
  ``[T, E, D]``. XLA fuses the activation and the bias adds into elementwise loops beside the two GEMMs; the
  backward keeps them all.
- :func:`moe_ragged`, the routed one: the ``T * k`` (token, slot) assignments sorted by expert (a stable argsort, so
  each expert's rows in token order), ``x``'s rows gathered into ``[T * k, D]``, ``jax.lax.ragged_dot`` with each
  expert's row count (``group_sizes [E]``, a bincount of static length ``E``) for ``gate_up`` and for ``down`` (the
  weights transposed to ``ragged_dot``'s ``rhs [E, in, out]``), the activation between, the biases gathered by
  each row's expert, and the weighted rows scatter-added (``.at[tokens].add``) back onto ``[T, D]``. It
  materialises ``[T * k, D]``, ``[T * k, 2I]``, ``[T * k, I]`` and ``[T * k, D]``, not the ``E``-wide tensors.
  How ``ragged_dot`` runs is the platform's: on CPU (jax 0.10.2) it lowers to a masked dense dot (the lhs
  broadcast to ``[E, T * k, in]``, zero outside each group, contracted over ``E`` and ``in``), ``E`` times its
  useful FLOPs, k times the dense baseline's; on GPU and TPU to XLA's ragged-dot instruction (or, with
  ``jax_ragged_dot_use_gpu_pallas_triton_lowering``, a Pallas kernel). Its gradients (lhs and rhs) work on CPU in
  float64, float32, bfloat16 and float16.

Numerics: each step rounds in the operands' dtype, as the golden with a plain Arith does, except that the router's
softmax runs in float32 for 16-bit inputs (above), XLA may fuse elementwise steps without rounding between them,
and the combine sums each token's k weighted rows in XLA's order (the golden adds them in expert order). With a
clamp, the gradient passes where the input is within the limits, bounds included (torch's ``clamp`` backward, the
golden's), written with ``where`` (``jnp.minimum``'s gradient splits a tie in half).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from compare.problem.moe import MoeSpec
from jax_impl.device import PRECISION

Params = dict[str, jax.Array]


def route(params: Params, x: jax.Array, spec: MoeSpec) -> tuple[jax.Array, jax.Array]:
    """The router's choice: ``experts [T, k]`` (int32, largest score first, ties to the lower index) and their
    combine ``weights [T, k]`` in ``x``'s dtype (module docstring: where the softmax is computed)."""
    logits = jnp.einsum("td,ed->te", x, params["router"], precision=PRECISION)  # [T, E], x's dtype
    if spec.biases:
        logits = logits + params["router_bias"]
    scores = logits.astype(jnp.promote_types(x.dtype, jnp.float32))
    if spec.order == "softmax-topk":
        weights, experts = jax.lax.top_k(jax.nn.softmax(scores, axis=-1), spec.top_k)  # over all E, then the k
        if spec.renormalize:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    else:  # topk-softmax: the k largest logits, a softmax over those k
        top, experts = jax.lax.top_k(scores, spec.top_k)
        weights = jax.nn.softmax(top, axis=-1)
    return experts.astype(jnp.int32), weights.astype(x.dtype)


def _split(gu: jax.Array, spec: MoeSpec) -> tuple[jax.Array, jax.Array]:
    """``gate, up [..., I]`` of a fused ``gate_up [..., 2I]``: interleaved (gate at even columns) or concat."""
    if spec.layout == "interleaved":
        return gu[..., ::2], gu[..., 1::2]
    half = gu.shape[-1] // 2
    return gu[..., :half], gu[..., half:]


def glu(gate: jax.Array, up: jax.Array, spec: MoeSpec) -> jax.Array:
    """The expert's activation ``h [..., I]``: ``silu(gate) * up`` or gpt-oss's clamped ``(up + 1) * gate *
    sigmoid(alpha * gate)`` (gate clamped above at ``limit``, up to ``[-limit, limit]``; the gradient passes where
    the input is within the limits, bounds included)."""
    if spec.glu == "swiglu":
        return jax.nn.silu(gate) * up
    lim = spec.limit
    g = jnp.where(gate > lim, lim, gate)
    u = jnp.where(up > lim, lim, jnp.where(up < -lim, -lim, up))
    return (u + spec.offset) * (g * jax.nn.sigmoid(spec.alpha * g))


def moe_dense(params: Params, x: jax.Array, spec: MoeSpec) -> tuple[jax.Array, jax.Array]:
    """The one-hot baseline: ``y [T, D]`` and ``experts [T, k]``. Every token through all ``E`` experts (``E / k``
    times the routed block's expert FLOPs; ``[T, E, *]`` intermediates), combined with ``[T, E]`` weights that are
    zero off each token's top k."""
    experts, weights = route(params, x, spec)
    gu = jnp.einsum("td,efd->tef", x, params["gate_up"], precision=PRECISION)  # [T, E, 2I]
    if spec.biases:
        gu = gu + params["gate_up_bias"]
    h = glu(*_split(gu, spec), spec)  # [T, E, I]
    out = jnp.einsum("tei,edi->ted", h, params["down"], precision=PRECISION)  # [T, E, D]
    if spec.biases:
        out = out + params["down_bias"]
    # [T, E]: each token's k weights at its experts, zero elsewhere (the k experts are distinct)
    one_hot = jax.nn.one_hot(experts, spec.experts, dtype=x.dtype)  # [T, k, E]
    combine = jnp.einsum("tk,tke->te", weights, one_hot, precision=PRECISION)
    return jnp.einsum("te,ted->td", combine, out, precision=PRECISION), experts


def moe_ragged(params: Params, x: jax.Array, spec: MoeSpec) -> tuple[jax.Array, jax.Array]:
    """The routed block: ``y [T, D]`` and ``experts [T, k]``. The ``T * k`` assignments sorted by expert, two
    ``jax.lax.ragged_dot`` over the experts' row groups, the weighted rows scatter-added back to their tokens."""
    experts, weights = route(params, x, spec)
    k = spec.top_k
    flat = experts.reshape(-1)  # [T * k], row t * k + j: token t's j-th expert
    order = jnp.argsort(flat, stable=True)  # [T * k]: by expert, ties (one expert's rows) in token order
    tokens = order // k  # [T * k]: each sorted row's token
    by_expert = flat[order]  # [T * k], ascending
    sizes = jnp.bincount(flat, length=spec.experts).astype(jnp.int32)  # [E] rows per expert, static length
    # ragged_dot wants rhs [E, in, out]: the (out, in) weights transposed (XLA folds it into the dot's layout)
    gu = jax.lax.ragged_dot(x[tokens], jnp.swapaxes(params["gate_up"], 1, 2), sizes, precision=PRECISION)
    if spec.biases:
        gu = gu + params["gate_up_bias"][by_expert]  # [T * k, 2I]
    h = glu(*_split(gu, spec), spec)  # [T * k, I]
    out = jax.lax.ragged_dot(h, jnp.swapaxes(params["down"], 1, 2), sizes, precision=PRECISION)  # [T * k, D]
    if spec.biases:
        out = out + params["down_bias"][by_expert]
    out = out * weights.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[tokens].add(out), experts


#: The formulations by name (the tests run each).
FORMULATIONS = {"dense": moe_dense, "ragged": moe_ragged}
