"""The PyTorch modules: ``nn.Linear``, the blog post's gated MLP (GeGLU, SwiGLU), GPT-2's MLP, from golden weights."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from compare.problem.cases import MODULE_MODEL, is_moe
from compare.problem.golden import Problem
from compare.problem.weights import linear_weight

#: Canonical parameter name -> torch parameter path, per model.
_GLU_PATHS = {"gate": "gate_proj.weight", "up": "up_proj.weight", "down": "down_proj.weight"}
PARAM_PATHS: dict[str, dict[str, str]] = {
    "linear": {"weight": "weight", "bias": "bias"},
    "geglu": _GLU_PATHS,
    "swiglu": _GLU_PATHS,
    "gelu-mlp": {"fc1": "fc1.weight", "b1": "fc1.bias", "fc2": "fc2.weight", "b2": "fc2.bias"},
}

ActMul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def eager_geglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(g) * u`` as two eager kernels (GELU, then mul). Tanh form asked for explicitly."""
    return F.gelu(g, approximate="tanh") * u


def eager_swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` as two eager kernels (SiLU, then mul)."""
    return F.silu(g) * u


#: The eager ``act(g) * u`` of each gated (GLU) model.
EAGER_ACT_MUL: dict[str, ActMul] = {"geglu": eager_geglu, "swiglu": eager_swiglu}


class GatedMLP(nn.Module):
    """``y = down(act_mul(gate(x), up(x)))``; ``x, y [..., dim]``, hidden ``[..., hidden]``; bias-free.

    ``act_mul(g, u) = act(g) * u``: GeGLU with :func:`eager_geglu` (the default, the blog post's module), SwiGLU with
    :func:`eager_swiglu`, or a hand-written kernel of either."""

    def __init__(self, dim: int, hidden: int, act_mul: ActMul = eager_geglu) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act_mul = act_mul

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The GEMM outputs the activation reads: ``(g, u)``."""
        return self.gate_proj(x), self.up_proj(x)

    def tail(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The activation and the GEMM that reads it: ``down(act(g) * u)``."""
        return self.down_proj(self.act_mul(g, u))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(*self.heads(x))


class GeluMLP(nn.Module):
    """GPT-2's MLP: ``y = fc2(gelu_tanh(fc1(x)))`` with biased linears; ``x, y [..., dim]``, hidden
    ``[..., hidden]`` (each linear one addmm; GELU's tanh form, GPT-2's ``gelu_new``)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=True)
        self.fc2 = nn.Linear(hidden, dim, bias=True)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The GEMM output the activation reads: ``(f,)``, ``f = fc1(x)``."""
        return (self.fc1(x),)

    def tail(self, f: torch.Tensor) -> torch.Tensor:
        """The activation and the GEMM that reads it: ``fc2(gelu_tanh(f))``."""
        return self.fc2(F.gelu(f, approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(*self.heads(x))


#: How a backend makes its eager module: ``build(problem, device, dtype)`` (:func:`build_module`, or a user's file's).
Build = Callable[[Problem, torch.device, torch.dtype], nn.Module]


def build_module(
    problem: Problem, device: torch.device, dtype: torch.dtype, act_mul: ActMul | None = None
) -> nn.Module:
    """The case's module on ``device`` in ``dtype``, every parameter copied from the golden weights.

    ``act_mul`` replaces a gated model's eager ``act(g) * u`` (default: :data:`EAGER_ACT_MUL` of the model); it must
    compute that model's activation. Models without a gate take none."""
    s = problem.case.shape
    model = problem.case.model
    module: nn.Module
    if model == "linear":
        module = nn.Linear(s.dim, s.hidden, bias=True)
    elif model == "gelu-mlp":
        if act_mul is not None:
            raise ValueError(f"model {model!r} has no gated activation to replace (act_mul is for GLU models)")
        module = GeluMLP(s.dim, s.hidden)
    else:
        module = GatedMLP(s.dim, s.hidden, act_mul if act_mul is not None else EAGER_ACT_MUL[model])
    module = module.to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, path in PARAM_PATHS[model].items():
            w = torch.from_numpy(linear_weight(problem.params[name], "torch"))
            module.get_parameter(path).copy_(w.to(dtype))
    return module


def canonical_params(module: nn.Module, model: str) -> dict[str, nn.Parameter]:
    """The module's parameters under canonical names (torch layout is already canonical); a user's module
    (``MODULE_MODEL``) and a MoE block under their ``state_dict`` names, in their order."""
    if model == MODULE_MODEL or is_moe(model):  # a MoE block's names are the canonical ones (torch_impl.moe_ops)
        return {name: module.get_parameter(name) for name in module.state_dict()}
    return {name: module.get_parameter(path) for name, path in PARAM_PATHS[model].items()}
