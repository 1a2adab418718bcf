"""The kind of a kernel (``gemm``, ``fused``, ``elementwise``, ``reduction``, ``copy``, ``other``) from its name: a
torch op, a CUDA kernel, an Inductor kernel or an HLO opcode. Pure; the kinds are ``compare.kernels.summary.KINDS``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from compare.kernels.names import op_name, parse_fused_name

_GEMM_RE = re.compile(
    r"(^|[^a-z])(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|dot|_addmm_activation|_scaled_mm|dot_general|"
    r"convolution|conv[123]d|cudnn_convolution\w*|mkldnn_convolution)$|gemm|xmma|s16816|s1688|s884|hgemm|sgemm|nvjet|cublas|cutlass|wgmma|onednn\$matmul|"
    r"mkldnn_linear|mkl_linear|_linear_pointwise|__triton_gemm|triton_tem_|"
    # this project's Triton GEMMs: the fused gate/up one (_glu_matmul_kernel, _geglu_ in committed data) and the plain
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
#: Collectives: torch's c10d ops and functional collectives (and their waits), gloo's and NCCL's own events, XLA's
#: collective HLO ops (``all-reduce``, ``all-reduce-start``/``-done``, ``all-gather``, ``reduce-scatter``, ...).
_COLLECTIVE_RE = re.compile(
    r"^c10d::|^_c10d_functional::(all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|wait_tensor)|^gloo:|nccl|"
    r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)(-start|-done)?"
    r"(\.\d+)?$",
    re.IGNORECASE,
)
#: Ops whose presence among a fused kernel's absorbed ops (an HLO fusion's, or those an Inductor kernel's name lists)
#: makes it a GEMM with a fused prologue or epilogue: an XLA dot fusion, Inductor's C++ GEMM template
#: (``cpp_fused_gelu_mm_mul_0``: the template names its kernel after every op it absorbed). Not ``addmm``: Inductor
#: on a GPU splits an addmm feeding a pointwise op into mm plus a bias add fused into the pointwise kernel, whose name
#: then lists ``addmm``; nor Inductor's Triton pointwise and reduction kernels (``triton_poi_``, ``triton_red_``,
#: ``triton_per_``), which never hold a GEMM.
_GEMM_ABSORBED = frozenset({"dot", "convolution", "mm", "bmm", "_mm_plus_mm"})
_NO_GEMM_PREFIX = ("triton_poi_", "triton_red_", "triton_per_")
_TORCH_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(?:\.\w+)?$")


def classify(name: str, absorbed: Sequence[str] = ()) -> str:
    """The kind of a kernel from its name (a torch op, a CUDA kernel, an Inductor kernel or an HLO opcode).

    GEMMs (``mm``/``addmm``/``bmm``/``linear``, cuBLAS/CUTLASS/``nvjet`` names, HLO ``dot``, Inductor GEMM
    templates, a fused kernel that absorbed a GEMM op: its epilogue fused) are ``gemm``; Inductor
    ``cpp_fused``/``triton_*`` kernels and anything named ``fused`` are ``fused``;
    ``gelu``/``mul``/``add``-like ops ``elementwise``; ``sum``-like ``reduction``; ``copy_``/``to``/memcpy ``copy``;
    all-reduces and other collectives (torch c10d, gloo, NCCL, XLA) and their waits ``collective``.
    """
    if _COLLECTIVE_RE.search(name):
        return "collective"
    op = op_name(name)
    fused_ops = set(absorbed) | set(parse_fused_name(name) or ())
    template = bool(_GEMM_ABSORBED & fused_ops) and not op.startswith(_NO_GEMM_PREFIX)
    if _GEMM_RE.search(op) or _GEMM_RE.search(name) or template:
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
