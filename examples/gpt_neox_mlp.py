"""A module file (``python -m compare run --module``): transformers' ``GPTNeoXMLP`` (Pythia's MLP) on the torch side
and a JAX port of it written by hand on the other.

``GPTNeoXMLP``: ``y = dense_4h_to_h(gelu(dense_h_to_4h(x)))`` with biases and the exact (erf) GELU, torch's default
``nn.GELU()`` (``hidden_act="gelu"``, as in Pythia and BERT-style models); ``x, y [batch, seq, dim]``,
``dense_h_to_4h`` ``[hidden, dim]`` and ``dense_4h_to_h`` ``[dim, hidden]`` in torch's ``(out, in)`` layout. Its
``state_dict`` names (``dense_h_to_4h.weight``, ``dense_h_to_4h.bias``, ``dense_4h_to_h.weight``,
``dense_4h_to_h.bias``) are the case's parameters, so a checkpoint's layer loads by name: ``--weights
model.safetensors --prefix gpt_neox.layers.0.mlp.``.

    python -m compare run --module examples/gpt_neox_mlp.py --dim 96 --hidden 328 --dtype float32 bfloat16 \\
        --mode fwd fwd+bwd
"""

from __future__ import annotations

from typing import Any


def torch_module(dim: int, hidden: int) -> Any:
    """transformers' own ``GPTNeoXMLP`` at this width. The attention's head count plays no part in the MLP; it must
    divide the width (the config checks it), so one head."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXMLP

    return GPTNeoXMLP(
        GPTNeoXConfig(hidden_size=dim, intermediate_size=hidden, hidden_act="gelu", num_attention_heads=1)
    )


def jax_function(params: dict[str, Any], x: Any) -> Any:
    """The same MLP in JAX: ``params`` holds the ``state_dict`` names, ``(out, in)`` layout, in the case dtype."""
    import jax

    h = x @ params["dense_h_to_4h.weight"].T + params["dense_h_to_4h.bias"]
    return jax.nn.gelu(h, approximate=False) @ params["dense_4h_to_h.weight"].T + params["dense_4h_to_h.bias"]
