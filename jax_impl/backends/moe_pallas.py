"""``jax-moe-pallas``: a mixture-of-experts case's routed block with its experts as Pallas grouped GEMMs
(``jax_impl.ops.moe_pallas.moe_pallas``: the ``gate_up`` GEMM over the assignments sorted by expert with the gated
activation in its epilogue, then the ``down`` grouped GEMM; router, sort and combine in ``jax.numpy``) under
``jax.jit``. Backward: ``jax.vjp`` of a ``jax.numpy`` reference of the experts (``ragged_dot``), through a
``jax.custom_vjp``; no Pallas backward. Without a GPU the kernels run with ``interpret=True``: parity only, not
timed."""

from __future__ import annotations

from compare.backends.registry import Prepared
from compare.problem.golden import Problem
from jax_impl import runner
from jax_impl.backends.pallas import INTERPRETED_NOTE, PallasBackend, _on_gpu


class MoePallasBackend(PallasBackend):
    """``jax-pallas``'s availability (Pallas imports; timed on a GPU only), the MoE block's step."""

    name = "jax-moe-pallas"

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        from jax_impl.ops.moe_pallas import moe_pallas

        timed = _on_gpu()
        note = "first call includes XLA compile" + ("" if timed else f"; {INTERPRETED_NOTE}")
        return runner.prepare_moe(problem, mode, moe_pallas, timed=timed, note=note)


BACKEND = MoePallasBackend()
