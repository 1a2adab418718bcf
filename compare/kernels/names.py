"""Kernel and op names as profilers and compilers write them: the bare op of a name (``aten::mm`` -> ``mm``) and the
ops an Inductor fused kernel absorbed, parsed from its name. Pure; used by ``compare.kernels.classify`` and by the
profiler adapters (``torch_impl.profiling``, ``jax_impl.profiling``) through ``compare.kernels.summary``."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Multi-word op names (aten / prims / HLO) that Inductor may join into a fused kernel name with ``_``; single-word
#: ops need no entry. Parsing a fused name matches these longest-first, so ``gelu_backward`` stays one op.
MULTI_WORD_OPS: frozenset[str] = frozenset(
    {
        "_unsafe_view",
        "_to_copy",
        "_softmax",
        "_log_softmax",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
        "_unsafe_index",
        "_unsafe_index_put",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training",
        "_adaptive_avg_pool2d",
        "_adaptive_avg_pool2d_backward",
        "_fused_rms_norm",
        "_fused_rms_norm_backward",
        "_reshape_alias",
        "_local_scalar_dense",
        "_prelu_kernel",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_mm",
        "_addmm_activation",
        "_foreach_add",
        "_foreach_mul",
        "_weight_norm_interface",
        "gelu_backward",
        "silu_backward",
        "sigmoid_backward",
        "tanh_backward",
        "threshold_backward",
        "hardtanh_backward",
        "hardswish_backward",
        "hardsigmoid_backward",
        "leaky_relu_backward",
        "elu_backward",
        "softplus_backward",
        "mish_backward",
        "log_sigmoid_forward",
        "log_sigmoid_backward",
        "native_layer_norm",
        "native_layer_norm_backward",
        "native_batch_norm",
        "native_batch_norm_backward",
        "native_group_norm",
        "native_group_norm_backward",
        "native_dropout",
        "native_dropout_backward",
        "embedding_dense_backward",
        "convolution_backward",
        "max_pool2d_with_indices",
        "max_pool2d_with_indices_backward",
        "avg_pool2d_backward",
        "upsample_nearest2d",
        "upsample_bilinear2d",
        "upsample_nearest2d_backward",
        "upsample_bilinear2d_backward",
        "constant_pad_nd",
        "reflection_pad2d",
        "index_put",
        "index_add",
        "index_select",
        "index_copy",
        "index_fill",
        "scatter_add",
        "scatter_reduce",
        "masked_fill",
        "masked_scatter",
        "masked_select",
        "clamp_min",
        "clamp_max",
        "var_mean",
        "logical_and",
        "logical_or",
        "logical_not",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "split_with_sizes",
        "select_scatter",
        "slice_scatter",
        "diagonal_scatter",
        "as_strided_scatter",
        "as_strided",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "empty_strided",
        "full_like",
        "zeros_like",
        "ones_like",
        "empty_like",
        "rand_like",
        "randn_like",
        "lift_fresh_copy",
        "scalar_tensor",
        "expand_copy",
        "permute_copy",
        "view_copy",
        "view_as_real",
        "view_as_complex",
        "convert_element_type",
        "device_put",
        "philox_rand",
        "inductor_random",
        "inductor_seeds",
        "inductor_lookup_seed",
        "randint_like",
        "floor_divide",
        "true_divide",
        "nan_to_num",
        "grid_sampler_2d",
        "repeat_interleave",
        "unfold_copy",
        "squeeze_copy",
        "unsqueeze_copy",
        "linalg_vector_norm",
        "_linalg_vector_norm",
        "round_decimals",
    }
)

#: Inductor fused kernel names: ``cpp_fused_<ops>_<n>``, ``triton_<poi|red|per|tem|...>_fused_<ops>_<n>``,
#: with ``graph_<k>_`` in front when ``torch._inductor.config.cpp.enable_kernel_profile`` names CPU kernels.
_INDUCTOR_FUSED = re.compile(r"^(?:graph_\d+_)?(?:cpp|triton_[a-z]+|triton)_fused(?:_(?P<ops>.*?))??(?:_(?P<n>\d+))?$")


def op_name(name: str) -> str:
    """The bare op of a profiler or HLO name: ``aten::mm`` -> ``mm``, ``aten::gelu.default`` -> ``gelu``."""
    base = name.rsplit("::", 1)[-1]
    return base.split(".", 1)[0] if "::" in name else base


def parse_fused_name(name: str, known: Iterable[str] = MULTI_WORD_OPS) -> list[str] | None:
    """The ops an Inductor fused kernel absorbed, parsed from its name; None if ``name`` is not one.

    ``cpp_fused__unsafe_view_gelu_mul_0`` -> ``["_unsafe_view", "gelu", "mul"]``; the ``graph_<k>_`` prefix of
    CPU kernel profiling and the ``triton_<poi|red|per|tem>_`` prefixes are accepted. Inductor joins the sorted op
    names with ``_``; ops whose own names contain ``_`` are recovered from ``known``, longest match first, and an
    empty token (a doubled ``_``) starts an op with a leading underscore.
    """
    m = _INDUCTOR_FUSED.match(name)
    if m is None:
        return None
    ops = m.group("ops")
    if not ops:
        return []
    known_set = frozenset(known)
    tokens = ops.split("_")
    out: list[str] = []
    i = 0
    while i < len(tokens):
        best = 0
        for j in range(len(tokens), i, -1):
            if "_".join(tokens[i:j]) in known_set:
                best = j - i
                break
        if best:
            out.append("_".join(tokens[i : i + best]))
            i += best
        elif tokens[i] == "" and i + 1 < len(tokens):
            out.append("_" + tokens[i + 1])  # a leading-underscore op that is not in ``known``
            i += 2
        else:
            if tokens[i]:
                out.append(tokens[i])
            i += 1
    return out
