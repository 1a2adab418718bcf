"""``jax-triton``: the nnx gated MLP (GeGLU, SwiGLU) under ``jax.jit`` with ``act(g) * u`` computed by the *same*
Triton kernels as ``torch-triton`` (``triton_impl.glu_kernels``), launched from JAX through
``jax_triton.triton_call``, the activation the kernels' compile-time ``ACT`` (picked from the case's model).

``act_mul`` is a ``jax.custom_vjp``: the forward launches ``glu_fwd_kernel`` and saves only ``(g, u)``; the
backward launches ``glu_bwd_kernel``, which recomputes ``act(g)`` and ``act'(g)`` from ``g``. Both kernels
stream the flattened buffers (``g, u, dh: [..., hidden]``, any leading shape) over a 1-D grid of
``cdiv(numel, BLOCK_SIZE)`` programs with the torch launch's block size, warps and FMA setting.

GPU only: jax-triton lowers ``triton_call`` to a CUDA/ROCm custom call and has no CPU or interpreter path, so on a
machine without a GPU the backend is listed unavailable with the reason. ``jax_triton`` (and the kernels, hence
``triton``) are imported lazily, never when this module is imported. On a GPU platform the process's Triton choice
(``triton_impl.env.choose``: compiled where the CUDA driver reports a device) is made before ``jax_triton``, which
imports triton, is imported; the backend never sets ``TRITON_INTERPRET`` itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

from compare.backends.registry import Availability, Prepared
from compare.problem.cases import GLU_ACTIVATIONS, GLU_MODELS
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import ActMul, build_module

#: ``jax_triton.triton_call``'s calling convention: ``(*arrays, kernel=, out_shape=, grid=, name=, num_warps=,
#: enable_fp_fusion=, **constexprs)``; array inputs first, then one output buffer per ``out_shape`` entry.
TritonCall = Callable[..., Any]

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
NOT_GPU_REASON = "jax-triton runs Triton kernels on GPU only: JAX's default backend here is {platform!r}"
INTERPRETED_REASON = (
    "the Triton kernels were decorated for Triton's interpreter (TRITON_INTERPRET=1 when "
    "triton_impl.glu_kernels was imported), which jax-triton cannot launch"
)


def _choose() -> bool:
    """The process's one Triton choice (``triton_impl.env.choose``; True: interpreted), made here if not before."""
    from triton_impl import env

    return env.choose()


def _kernels() -> ModuleType:
    """The shared Triton kernel module (imports triton on first use; the import makes the choice if not made)."""
    from triton_impl import glu_kernels

    return glu_kernels


def _import_jax_triton() -> ModuleType:
    """``import jax_triton``, keeping ``TRITON_CACHE_DIR`` as it was.

    jax_triton's ``triton_lib`` sets ``os.environ["TRITON_CACHE_DIR"] = ""`` when first imported, even where the
    package import then fails (no GPU jaxlib). Triton (3.9 here, knobs-based since 3.4) reads that as "no cache dir"
    and every later compile in the process fails with ``RuntimeError: Could not create or locate cache dir``:
    torch-triton's and Inductor's kernels included. jax-triton's own compile path does not use that cache.
    """
    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before
    return jax_triton


def _jax_triton_call() -> TritonCall:
    return _import_jax_triton().triton_call


def _check(names: tuple[str, ...], arrays: tuple[jax.Array, ...]) -> None:
    """Raise ValueError unless every array has the first one's shape and dtype, and that dtype is supported."""
    ref = arrays[0]
    for name, a in zip(names, arrays, strict=True):
        if a.shape != ref.shape or a.dtype != ref.dtype:
            raise ValueError(
                f"{name} must match {names[0]} in shape and dtype; got {name}: {a.shape} {a.dtype}, "
                f"{names[0]}: {ref.shape} {ref.dtype}"
            )
    if jnp.dtype(ref.dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {ref.dtype}; allowed: float32, bfloat16, float16")


def make_act_mul(triton_call: TritonCall | None = None, act: str = "gelu_tanh") -> ActMul:
    """``act_mul(g, u) = act(g) * u`` for ``g, u: S`` (any shape, same dtype) -> ``h: S``, differentiable; ``act``
    is ``"gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU).

    ``triton_call`` launches a kernel with ``jax_triton.triton_call``'s convention; None (the default) resolves to
    ``jax_triton.triton_call`` at trace time. Tests pass a stand-in to run the same wiring without a GPU.

    Launches: array arguments are the kernel's pointer inputs and the outputs follow them (the kernels put their
    outputs right after their inputs); ``n_elements``, ``BLOCK``, ``EXACT_BF16`` and ``ACT`` go by keyword, as
    compile-time constants (jax-triton appends the output pointers after every positional argument).
    """
    if act not in GLU_ACTIVATIONS.values():
        raise ValueError(f"unknown activation {act!r}; known: {', '.join(GLU_ACTIVATIONS.values())}")

    def launch(kernel_name: str, name: str, arrays: tuple[jax.Array, ...], n_out: int) -> tuple[jax.Array, ...]:
        """Launch kernel ``kernel_name`` of the kernel module on ``arrays`` (all of shape ``S``, one dtype); returns
        ``n_out`` new arrays of that shape and dtype."""
        shape, dtype = arrays[0].shape, arrays[0].dtype
        out = jax.ShapeDtypeStruct(shape, dtype)
        n = arrays[0].size
        if n == 0:  # an empty grid is no launch
            return tuple(jnp.zeros(shape, dtype) for _ in range(n_out))
        k = _kernels()
        call = triton_call if triton_call is not None else _jax_triton_call()
        res = call(
            *arrays,
            kernel=getattr(k, kernel_name),
            out_shape=(out,) * n_out,
            grid=(-(-n // k.BLOCK_SIZE),),
            name=name,
            num_warps=k.NUM_WARPS,
            enable_fp_fusion=k.FP_FUSION,
            n_elements=n,
            BLOCK=k.BLOCK_SIZE,
            EXACT_BF16=k.EXACT_BF16_CAST,
            ACT=act,
        )
        return tuple(res)

    def forward(g: jax.Array, u: jax.Array) -> jax.Array:
        """``[S], [S] -> [S]``: reads g, u, writes h (3 * numel * itemsize bytes)."""
        _check(("g", "u"), (g, u))
        (h,) = launch("glu_fwd_kernel", "glu_fwd", (g, u), 1)
        return h

    def backward(dh: jax.Array, g: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``dh, g, u: [S] -> (dg, du): [S]``: reads dh, g, u, writes dg, du (5 * numel * itemsize bytes)."""
        _check(("g", "dh", "u"), (g, dh, u))
        dg, du = launch("glu_bwd_kernel", "glu_bwd", (dh, g, u), 2)
        return dg, du

    @jax.custom_vjp
    def triton_glu(g: jax.Array, u: jax.Array) -> jax.Array:
        return forward(g, u)

    def vjp_fwd(g: jax.Array, u: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        return forward(g, u), (g, u)  # residuals: g and u only, never act(g)

    def vjp_bwd(res: tuple[jax.Array, jax.Array], dh: jax.Array) -> tuple[jax.Array, jax.Array]:
        g, u = res
        return backward(dh.astype(g.dtype), g, u)

    triton_glu.defvjp(vjp_fwd, vjp_bwd)
    return triton_glu


class JaxTritonBackend:
    """The ``jax-triton`` backend; ``triton_call`` replaces ``jax_triton.triton_call`` (tests: a CPU stand-in,
    whose runs are parity only, never timed)."""

    name = "jax-triton"

    def __init__(self, triton_call: TritonCall | None = None) -> None:
        self.triton_call = triton_call

    def availability(self) -> Availability:
        platform = dev.platform()
        if platform not in GPU_PLATFORMS:
            # checked first: on a CPU the backend imports nothing (neither the choice nor jax_triton)
            return Availability(False, NOT_GPU_REASON.format(platform=platform), device=platform)
        _choose()  # before jax_triton imports triton: the kernels' mode is chosen, never inherited from that import
        try:
            _import_jax_triton()
        except ImportError as exc:
            return Availability(False, str(exc), device=platform)
        try:
            kernels = _kernels()
        except ImportError as exc:
            return Availability(
                False, f"cannot import the Triton kernels (triton_impl.glu_kernels): {exc}", device=platform
            )
        if kernels.INTERPRETED:
            return Availability(False, INTERPRETED_REASON, device=platform)
        return Availability(True, device=platform)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        model = problem.case.model
        if model not in GLU_MODELS:
            raise ValueError(f"{self.name} implements models {', '.join(GLU_MODELS)} only, not {model!r}")
        stand_in = self.triton_call is not None
        if not stand_in:
            avail = self.availability()
            if not avail.ok:
                raise RuntimeError(avail.reason)
        module = build_module(problem, act_mul=make_act_mul(self.triton_call, GLU_ACTIVATIONS[model]))
        note = (
            "kernels launched through a stand-in for jax_triton.triton_call: parity only, not timed"
            if stand_in
            else "first call includes XLA and Triton compiles"
        )
        return runner.prepare(problem, mode, module, timed=not stand_in, note=note)


BACKEND = JaxTritonBackend()
