"""Where JAX backends run, how they sync, and the precision settings they pin."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

JAX_DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
PRECISION = jax.lax.Precision.HIGHEST


def platform() -> str:
    return jax.default_backend()


def sync(outputs: Any) -> None:
    """Block until every array in the output pytree is computed (JAX dispatch is asynchronous, CPU included)."""
    jax.block_until_ready(outputs)


def output_arrays(output: Any) -> list[jax.Array]:
    """The arrays a step returned (``compare.backends.registry.OutputReader``): every leaf of the pytree ``output``
    must be a live ``jax.Array``, else a ``TypeError`` naming the first that is not (a deleted array too)."""
    leaves = jax.tree_util.tree_leaves(output)
    for leaf in leaves:
        if not isinstance(leaf, jax.Array):
            raise TypeError(f"its output holds a {type(leaf).__module__}.{type(leaf).__qualname__}, not a jax.Array")
        if leaf.is_deleted():
            raise TypeError("its output holds a deleted jax.Array")
    return leaves


def array_rows(a: jax.Array, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of ``a`` seen as ``[T, a.shape[-1]]``, copied to float64 host memory."""
    return np.asarray(a).reshape(-1, a.shape[-1])[rows].astype(np.float64)


def pin_precision() -> dict[str, Any]:
    """fp32 matmuls at full precision (no TF32/bf16 passes): every layer also passes ``precision=HIGHEST``."""
    jax.config.update("jax_default_matmul_precision", "highest")
    precision = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]  # a flag, set just above
    return {"jax_default_matmul_precision": str(precision), "flax_linear_precision": PRECISION.name}


def threads() -> dict[str, Any]:
    """XLA's CPU client sizes its thread pool from the visible cores unless XLA_FLAGS says otherwise."""
    return {
        "jax_platform": platform(),
        "jax_device_count": jax.device_count(),
        "xla_cpu_threads": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
