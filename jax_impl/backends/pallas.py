"""``jax-pallas``: the nnx GeGLU module under ``jax.jit`` with ``gelu_tanh(g) * u`` as a Pallas kernel (custom VJP
with a Pallas backward). Compiled through Triton on GPU; ``interpret=True`` elsewhere (parity only, not timed)."""

from __future__ import annotations

import jax

from compare.golden import Problem
from compare.registry import Availability, Prepared
from jax_impl import device as dev
from jax_impl import runner
from jax_impl.models import build_module

INTERPRETED_NOTE = "Pallas interpret mode (no GPU): parity only, not timed"


def _on_gpu() -> bool:
    return dev.platform() in ("gpu", "cuda", "rocm")


def pallas_geglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """``gelu_tanh(g) * u`` for ``[..., hidden]`` activations, flattened to 2-D ``[tokens, hidden]`` for the kernel."""
    from jax_impl.ops.geglu_pallas import geglu

    lead = g.shape[:-1]
    h = geglu(g.reshape(-1, g.shape[-1]), u.reshape(-1, u.shape[-1]), interpret=not _on_gpu())
    return h.reshape(*lead, g.shape[-1])


class PallasBackend:
    name = "jax-pallas"

    def availability(self) -> Availability:
        try:
            from jax.experimental import pallas  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"jax.experimental.pallas cannot be imported: {exc}")
        return Availability(True, timed=_on_gpu(), device=dev.platform())

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        if problem.case.model != "geglu":
            raise ValueError(f"{self.name} implements model 'geglu' only, not {problem.case.model!r}")
        timed = _on_gpu()
        module = build_module(problem, act_mul=pallas_geglu)
        return runner.prepare(problem, mode, module, timed=timed, note="" if timed else INTERPRETED_NOTE)


BACKEND = PallasBackend()
