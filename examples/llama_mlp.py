"""A module file (``python -m compare run --module``): transformers' ``LlamaMLP`` on the torch side and a JAX port of
it written by hand on the other, the pair a user brings when they port a model.

``LlamaMLP``: ``y = down_proj(silu(gate_proj(x)) * up_proj(x))``, bias-free; ``x, y [batch, seq, dim]``, the gate
and up projections ``[hidden, dim]`` and the down projection ``[dim, hidden]`` in torch's ``(out, in)`` layout. Its
``state_dict`` names (``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight``) are the case's parameters,
so a checkpoint's layer loads by name: ``--weights model.safetensors --prefix model.layers.0.mlp.``.

    python -m compare run --module examples/llama_mlp.py --dim 96 --hidden 328 --dtype float32 bfloat16 \\
        --mode fwd fwd+bwd
"""

from __future__ import annotations

from typing import Any


def torch_module(dim: int, hidden: int) -> Any:
    """transformers' own ``LlamaMLP`` at this width (SiLU, no biases, as in Llama 2 and 3)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    return LlamaMLP(LlamaConfig(hidden_size=dim, intermediate_size=hidden, hidden_act="silu", mlp_bias=False))


def jax_function(params: dict[str, Any], x: Any) -> Any:
    """The same MLP in JAX: ``params`` holds the ``state_dict`` names, ``(out, in)`` layout, in the case dtype."""
    import jax

    g = x @ params["gate_proj.weight"].T
    u = x @ params["up_proj.weight"].T
    return (jax.nn.silu(g) * u) @ params["down_proj.weight"].T
