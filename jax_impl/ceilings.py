"""XLA's own matmul ceiling, measured through the shared timer: the second ceiling probe
(``compare.backends.registry.PROBES``).

torch's probe (``torch_impl.ceilings``) measures torch's GEMM library; XLA brings its own, and on one machine the
two can differ by far: with ``MKL_CBWR=COMPATIBLE`` torch's float32 GEMM ran at 31 GFLOP/s here while XLA's (capped
at AVX) ran at 182. A ceiling is what the machine can do with any library, so the harness keeps, per dtype, the
higher of the probes (``compare.cost.records.Ceiling.merged``); a step of an XLA backend is then never "faster than the
machine" only because torch's library is slow.

Per dtype: ``jnp.dot`` of two ``[n, n]`` arrays in the dtype under ``jax.jit`` (``preferred_element_type`` the dtype,
precision HIGHEST, as the backends pin it), ``2 n^3`` FLOPs per call, over the sizes 128, 256, 512, 1024 while the
next size's predicted call fits the budget; the rate of the fastest sample of the best size. Copy bandwidth: a
jitted ``x + 0`` of a 64 MiB buffer (every byte read once and written once; XLA cannot elide the add of an argument
that is not donated), counted as twice the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from compare.formats.codec import to_json
from compare.problem.cases import DTYPES, check_name
from compare.timing import timer
from jax_impl import device as dev

SIZES: tuple[int, ...] = (128, 256, 512, 1024)
COPY_BYTES = 64 * 2**20
BUDGET_S = 1.5
#: The route name this probe's ceilings carry (``compare.cost.records.Ceiling.route``).
ROUTE = "xla"


def measure(dtype: str, budget_s: float = BUDGET_S, sizes: Sequence[int] = SIZES) -> dict[str, Any]:
    """One dtype's ceiling record (the fields of ``compare.cost.records.Ceiling``) measured through XLA."""
    check_name("dtype", dtype, DTYPES)
    precision = dev.pin_precision()
    jdtype = dev.JAX_DTYPES[dtype]
    deadline = timer.CLOCK() + budget_s * 0.75  # a quarter for the copy
    dot = jax.jit(lambda a, b: jnp.dot(a, b, precision=dev.PRECISION, preferred_element_type=jdtype))
    key = jax.random.PRNGKey(0)
    best: tuple[float, int, timer.Timing] | None = None
    per_size: dict[str, dict[str, float]] = {}
    prev: tuple[int, float] | None = None
    for n in sizes:
        if prev is not None and prev[1] * (n / prev[0]) ** 3 * 7 > deadline - timer.CLOCK():
            break  # a warm-up and 5 samples of this size would not fit
        a = jax.random.normal(key, (n, n), jnp.float32).astype(jdtype)
        b = jax.random.normal(jax.random.fold_in(key, n), (n, n), jnp.float32).astype(jdtype)
        share = max(0.0, deadline - timer.CLOCK()) / 4

        def call(a: jax.Array = a, b: jax.Array = b) -> jax.Array:
            return dot(a, b)

        t = timer.measure(call, dev.sync, warmup=1, budget_s=share)
        rate = 2 * n**3 / t.min_s  # 2 n^3 FLOPs per [n, n] @ [n, n], in the fastest sample: a peak
        per_size[str(n)] = {"median_s": t.median_s, "min_s": t.min_s, "flops_per_s": rate}
        if best is None or rate > best[0]:
            best = (rate, n, t)
        prev = (n, t.min_s)
    assert best is not None  # the first size is always measured
    numel = COPY_BYTES // jnp.dtype(jdtype).itemsize
    src = jnp.ones(numel, jdtype)
    copy = jax.jit(lambda x: x + jnp.zeros((), jdtype))
    tc = timer.measure(lambda: copy(src), dev.sync, warmup=1, budget_s=max(0.0, budget_s * 0.25))
    rate, n, t = best
    return {
        "flops_per_s": rate,
        "bytes_per_s": 2 * numel * jnp.dtype(jdtype).itemsize / tc.min_s,  # read once, written once
        "matmul_shape": [n, n, n],
        "copy_bytes": numel * jnp.dtype(jdtype).itemsize,
        "dtype": dtype,
        "device": dev.platform(),
        "precision": precision,
        "route": ROUTE,
        "timing": {"matmul": to_json(t), "matmul_all": per_size, "copy": to_json(tc)},
    }


def measure_all(dtypes: Sequence[str], budget_s: float | None = None) -> dict[str, Any]:
    """The ``ceilings-xla`` probe of ``compare.backends.registry``: ``{"device": ..., dtype: measure(...)}``."""
    return {"device": dev.platform(), **{d: measure(d, budget_s or BUDGET_S) for d in dtypes}}
