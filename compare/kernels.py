"""Kernels per step: the summary schema every profiler adapter returns and its helpers (the report section is
``compare.kernel_report``).

Framework-agnostic (imports neither torch nor jax). ``torch_impl.profiling`` fills a summary from
``torch.profiler``; ``jax_impl.profiling`` fills one from XLA's optimized HLO.

A kernel summary is a JSON-able dict; every count is **per step** (one call of ``Prepared.step``)::

    {
      "source": "torch.profiler" | "xla-hlo",
      "device": str,                       # "cpu", "cuda", ...
      "kernels_per_step": int,             # sum of the kernels' counts
      "kernels": [                         # in order of first launch within a step
        {"name": str,                      # as the profiler / HLO names it, e.g. "aten::mm",
                                           #   "graph_0_cpp_fused__unsafe_view_gelu_mul_0", "ynn_fusion"
         "short": str,                     # shorten(name), for tables
         "kind": "gemm" | "elementwise" | "fused" | "reduction" | "copy" | "custom" | "other",
         "count": int,                     # launches per step
         "absorbed": [str],                # ops a fused kernel absorbed ([] for an unfused kernel)
         "time_us": float | None},         # time per step, all its launches together (None: not measured)
      ],
      "metadata_ops": [{"name": str, "count": int}],   # ops that launch nothing (views, transposes, bitcasts)
      "trace": str | None,                 # where a Chrome/Perfetto/XPlane trace was written, if one was
      "notes": str,
    }
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

SOURCES: tuple[str, ...] = ("torch.profiler", "xla-hlo")
KINDS: tuple[str, ...] = ("gemm", "elementwise", "fused", "reduction", "copy", "custom", "other")

#: Longest shortened kernel name.
SHORT_WIDTH = 48

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

#: Namespaces dropped by :func:`shorten` (longest first).
_NAMESPACES = ("at::native::", "at::cuda::", "at::", "c10::", "cutlass::", "aten::", "void ")

_GEMM_RE = re.compile(
    r"(^|[^a-z])(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|dot|_addmm_activation|_scaled_mm|dot_general|"
    r"convolution|conv[123]d|cudnn_convolution\w*|mkldnn_convolution)$|gemm|xmma|s16816|s1688|s884|hgemm|sgemm|nvjet|cublas|cutlass|wgmma|onednn\$matmul|"
    r"mkldnn_linear|mkl_linear|_linear_pointwise|__triton_gemm|triton_tem_|"
    # this project's hand-written Triton GEMMs (the fused gate/up one with its GeGLU epilogue, and the plain one)
    r"_matmul_kernel$",
    re.IGNORECASE,
)
_REDUCTION_OPS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "var",
        "std",
        "var_mean",
        "norm",
        "prod",
        "argmax",
        "argmin",
        "logsumexp",
        "cumsum",
        "cumprod",
        "_softmax",
        "_log_softmax",
        "softmax",
        "log_softmax",
        "reduce",
        "reduce-window",
        "linalg_vector_norm",
        "_linalg_vector_norm",
        "all",
        "any",
        "max",
        "min",
    }
)
_COPY_OPS = frozenset(
    {
        "copy",
        "copy_",
        "to",
        "_to_copy",
        "clone",
        "contiguous",
        "cat",
        "stack",
        "index_select",
        "gather",
        "transpose",
        "concatenate",
        "pad",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "copy-start",
        "copy-done",
        "convert_element_type",
        "convert",
    }
)
_ELEMENTWISE_OPS = frozenset(
    {
        "add",
        "add_",
        "sub",
        "rsub",
        "mul",
        "mul_",
        "div",
        "div_",
        "neg",
        "abs",
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "pow",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tanh",
        "tanh_backward",
        "sigmoid",
        "sigmoid_backward",
        "gelu",
        "gelu_backward",
        "silu",
        "silu_backward",
        "relu",
        "relu_",
        "threshold_backward",
        "erf",
        "erfinv",
        "fill_",
        "zero_",
        "where",
        "clamp",
        "clamp_min",
        "clamp_max",
        "maximum",
        "minimum",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "masked_fill",
        "addcmul",
        "addcdiv",
        "lerp",
        "sign",
        "floor",
        "ceil",
        "round",
        "trunc",
        "fmod",
        "remainder",
        "logical_not",
        "bitwise_and",
        "bitwise_or",
        "native_dropout",
        "bernoulli_",
        "uniform_",
        "normal_",
        "multiply",
        "subtract",
        "divide",
        "negate",
        "exponential",
        "exponential-minus-one",
        "logistic",
        "select",
        "compare",
        "and",
        "or",
        "not",
        "power",
        "broadcast",
        "iota",
        "rng",
        "rng-bit-generator",
    }
)
_FUSED_RE = re.compile(r"fused|fusion", re.IGNORECASE)
_CUDA_ELEMENTWISE = re.compile(r"elementwise|Functor|CUDAKernelImpl|pointwise|fill_kernel", re.IGNORECASE)
_CUDA_REDUCTION = re.compile(r"reduce_kernel|reduction|Reduce|softmax", re.IGNORECASE)
_CUDA_COPY = re.compile(r"copy|memcpy|memset|transpose", re.IGNORECASE)


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


def _drop_call_args(s: str) -> str:
    """``f<...>(int, T)`` -> ``f<...>``: remove a trailing balanced ``(...)`` argument list."""
    s = s.rstrip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(s[i], 0)
        if depth == 0:
            return s[:i].rstrip() if i > 0 else s
    return s


def _split_template(s: str) -> tuple[str, list[str]] | None:
    """``base<a, b<c>, d>`` -> ``("base", ["a", "b<c>", "d"])``; None without a template argument list."""
    lt = s.find("<")
    if lt <= 0 or not s.endswith(">"):
        return None
    args: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s[lt + 1 : -1]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    args.append("".join(cur).strip())
    return s[:lt], args


_GENERIC_FUNCTORS = frozenset(
    {
        "BinaryFunctor",
        "AUnaryFunctor",
        "BUnaryFunctor",
        "UnaryFunctor",
        "ReduceOp",
        "OffsetCalculator",
        "LoadWithoutCast",
        "StoreWithoutCast",
    }
)
_FUNCTOR = re.compile(r"([A-Za-z_]\w*(?:Functor|functor|KernelImpl|Kernel|Op))\b")
#: cuBLAS kernel-name suffixes that say nothing about the GEMM itself.
_CUBLAS_NOISE = re.compile(r"(?:_execute)?(?:_segment_k_(?:on|off))?_kernel__\d+x_cublas$")
_TORCH_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(?:\.\w+)?$")


def shorten(name: str, width: int = SHORT_WIDTH) -> str:
    """A kernel name short enough for a table cell (at most ``width`` characters).

    Namespaces (``aten::``, ``at::native::``, ``void ``) and C++ call argument lists are dropped; a CUTLASS
    ``Kernel<...>`` wrapper becomes its first template argument; a PyTorch elementwise kernel keeps its functor
    (``vectorized_elementwise_kernel<MulFunctor>``); what is still too long keeps its head and its meaningful tail
    (tile shape, layout, alignment) around ``...``. Deterministic; short names come back unchanged.
    """
    s = " ".join(name.split())
    s = _drop_call_args(s)
    for ns in _NAMESPACES:
        if s.startswith(ns):
            s = s[len(ns) :]
    parts = _split_template(s)
    if parts is not None:
        base, args = parts
        base_leaf = base.rsplit("::", 1)[-1]
        if base_leaf in ("Kernel", "Kernel2", "device_kernel", "kernel") and args:
            s = args[0]
        else:
            functors = [f for f in _FUNCTOR.findall(", ".join(args)) if f not in _GENERIC_FUNCTORS]
            s = f"{base_leaf}<{functors[-1]}>" if functors else base_leaf
        s = _drop_call_args(s)
    for ns in _NAMESPACES:
        s = s.replace(ns, "")
    s = _CUBLAS_NOISE.sub("", s)
    if len(s) <= width:
        return s
    head = (width - 3) * 2 // 5
    tail = width - 3 - head
    return s[:head] + "..." + s[-tail:]


def classify(name: str, absorbed: Sequence[str] = ()) -> str:
    """The kind of a kernel from its name (a torch op, a CUDA kernel, an Inductor kernel or an HLO opcode).

    GEMMs (``mm``/``addmm``/``bmm``/``linear``, cuBLAS/CUTLASS/``nvjet`` names, HLO ``dot``, Inductor GEMM
    templates) are ``gemm``; Inductor ``cpp_fused``/``triton_*`` kernels and anything named ``fused`` are ``fused``;
    ``gelu``/``mul``/``add``-like ops ``elementwise``; ``sum``-like ``reduction``; ``copy_``/``to``/memcpy ``copy``.
    """
    op = op_name(name)
    if _GEMM_RE.search(op) or _GEMM_RE.search(name) or {"dot", "convolution"} & set(absorbed):
        return "gemm"
    if parse_fused_name(name) is not None or _FUSED_RE.search(name) or op.startswith("triton_"):
        return "fused"
    if op in _REDUCTION_OPS:
        return "reduction"
    if op in _COPY_OPS:
        return "copy"
    if op in _ELEMENTWISE_OPS:
        return "elementwise"
    if _TORCH_OP.match(name):
        return "other"
    if _CUDA_REDUCTION.search(name):
        return "reduction"
    if _CUDA_COPY.search(name):
        return "copy"
    if _CUDA_ELEMENTWISE.search(name):
        return "elementwise"
    return "other"


def kernel_entry(
    name: str,
    count: int,
    *,
    kind: str | None = None,
    absorbed: Sequence[str] | None = None,
    time_us: float | None = None,
) -> dict[str, Any]:
    """One ``kernels`` item of a summary; ``kind`` and ``absorbed`` default to what the name says."""
    if absorbed is None:
        absorbed = parse_fused_name(name) or []
    kind = kind or classify(name)
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; known: {', '.join(KINDS)}")
    return {
        "name": name,
        "short": shorten(name),
        "kind": kind,
        "count": int(count),
        "absorbed": list(absorbed),
        "time_us": None if time_us is None else float(time_us),
    }


def summary(
    source: str,
    device: str,
    kernels: list[dict[str, Any]],
    metadata_ops: list[dict[str, Any]],
    trace: str | None = None,
    notes: str = "",
    steps: int | None = None,
) -> dict[str, Any]:
    """A kernel summary dict (schema in the module docstring); ``kernels_per_step`` is the sum of counts;
    ``steps`` is how many steps a profiler recorded (None where the count is read off a compiled program)."""
    if source not in SOURCES:
        raise ValueError(f"unknown kernel summary source {source!r}; known: {', '.join(SOURCES)}")
    return {
        "source": source,
        "device": device,
        "kernels_per_step": sum(k["count"] for k in kernels),
        "kernels": kernels,
        "metadata_ops": metadata_ops,
        "trace": trace,
        "notes": notes,
        "steps": steps,
    }


def check_summary(s: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first way ``s`` departs from the schema."""
    keys = {"source", "device", "kernels_per_step", "kernels", "metadata_ops", "trace", "notes"}
    if not keys <= set(s):
        raise ValueError(f"kernel summary lacks {sorted(keys - set(s))}")
    if s["source"] not in SOURCES:
        raise ValueError(f"unknown source {s['source']!r}")
    for k in s["kernels"]:
        if not {"name", "short", "kind", "count", "absorbed", "time_us"} <= set(k):
            raise ValueError(f"kernel entry {k} lacks keys")
        if k["kind"] not in KINDS or not isinstance(k["count"], int) or not isinstance(k["absorbed"], list):
            raise ValueError(f"bad kernel entry {k}")
    if s["kernels_per_step"] != sum(k["count"] for k in s["kernels"]):
        raise ValueError("kernels_per_step is not the sum of the kernels' counts")
    for m in s["metadata_ops"]:
        if not isinstance(m.get("name"), str) or not isinstance(m.get("count"), int):
            raise ValueError(f"bad metadata op entry {m}")


def count_by_kind(s: dict[str, Any]) -> dict[str, int]:
    """Kernels per step of each kind present, e.g. ``{"gemm": 3, "fused": 1}``, in ``KINDS`` order."""
    out = {kind: 0 for kind in KINDS}
    for k in s["kernels"]:
        out[k["kind"]] += k["count"]
    return {kind: n for kind, n in out.items() if n}


def describe(s: dict[str, Any]) -> str:
    """A plain-text listing of a summary, one line per kernel (for logs and test output)."""
    lines = [f"{s['source']} on {s['device']}: {s['kernels_per_step']} kernels per step"]
    for k in s["kernels"]:
        t = "" if k["time_us"] is None else f"  {k['time_us']:.1f} us"
        absorbed = f"  absorbed: {' '.join(k['absorbed'])}" if k["absorbed"] else ""
        lines.append(f"  {k['count']:3d} x {k['kind']:11s} {k['name']}{absorbed}{t}")
    lines.append("  metadata ops: " + (", ".join(f"{m['name']} x{m['count']}" for m in s["metadata_ops"]) or "none"))
    return "\n".join(lines)
