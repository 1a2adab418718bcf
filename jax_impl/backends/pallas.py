"""``jax-pallas``: the nnx gated MLP (GeGLU, SwiGLU) under ``jax.jit`` with ``act(g) * u`` as a Pallas kernel (custom
VJP with a Pallas backward; the activation a static argument, picked from the case's model). Compiled through Triton
on GPU; ``interpret=True`` elsewhere (parity only, not timed)."""

from __future__ import annotations

import jax

from compare.backends.registry import Availability, Prepared
from compare.problem.cases import GLU_ACTIVATIONS, GLU_MODELS
from compare.problem.golden import Problem
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import ActMul, build_module

INTERPRETED_NOTE = "Pallas interpret mode (no GPU): parity only, not timed"


def _on_gpu() -> bool:
    return dev.platform() in ("gpu", "cuda", "rocm")


def pallas_act_mul(act: str = "gelu_tanh") -> ActMul:
    """``act_mul(g, u) = act(g) * u`` for ``[..., hidden]`` activations, flattened to 2-D ``[tokens, hidden]`` for
    the kernel; ``act`` is ``"gelu_tanh"`` (GeGLU) or ``"silu"`` (SwiGLU)."""
    from jax_impl.ops.glu_pallas import glu

    def act_mul(g: jax.Array, u: jax.Array) -> jax.Array:
        lead = g.shape[:-1]
        h = glu(g.reshape(-1, g.shape[-1]), u.reshape(-1, u.shape[-1]), act=act, interpret=not _on_gpu())
        return h.reshape(*lead, g.shape[-1])

    return act_mul


class PallasBackend:
    name = "jax-pallas"

    def availability(self) -> Availability:
        try:
            from jax.experimental import pallas  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"jax.experimental.pallas cannot be imported: {exc}")
        return Availability(True, timed=_on_gpu(), device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        model = problem.case.model
        if model not in GLU_MODELS:
            raise ValueError(f"{self.name} implements models {', '.join(GLU_MODELS)} only, not {model!r}")
        timed = _on_gpu()
        module = build_module(problem, act_mul=pallas_act_mul(GLU_ACTIVATIONS[model]))
        return runner.prepare(problem, mode, module, timed=timed, note="" if timed else INTERPRETED_NOTE)


BACKEND = PallasBackend()
