"""What the backend x committed-case parity tests share: which backends run here, which tensors must (or may)
deviate and why, and the three tests themselves, made per group of backends (:func:`backend_parity_tests`).

The tests live in one module per group (``test_parity_torch_compile.py``,
``test_parity_torch_compile_max_autotune.py``, ``test_parity_torch.py``, ``test_parity_jax.py``) so that
pytest-xdist, which keeps a module on one worker, runs the groups side by side; ``tests/test_parity.py`` checks
that the groups cover every backend that runs here, once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest

from compare.backends.registry import BACKENDS
from compare.problem.cases import PRESETS, Case, committed_cases
from tests.conftest import explain, parity_result

CASES = committed_cases()

#: Registered backends that say they can run here (read from the registry: a backend added there is tested here).
#: Tensor-parallel backends (a registry line with a ``runtime``) run in worker groups, not in this process: their
#: parity is tested through the launcher (``test_tp_torch``, and the JAX side's own).
RUN_HERE = [name for name, s in BACKENDS.items() if s.availability().ok and not s.runtime]
#: The only reason a registered backend may give for not running on a machine with torch and jax installed.
GPU_ONLY = "GPU only"
#: Every (backend, committed case) pair the backend implements.
PAIRS = [(b, c) for b in RUN_HERE for c in CASES if c.model in BACKENDS[b].models]
TRAIN_PAIRS = PAIRS
#: Real findings, pinned by cause and tier (``deviates``: a real, measured difference an honest implementation can
#: have; never ``fail``). Observed on XLA:CPU; on another JAX platform (a GPU) nothing is known yet and every tensor
#: must pass: a deviation there is a new finding to look at.
#:
#: 1. Token sums in the low dtype. JAX's transpose of a bias broadcast (a bias gradient: a sum over every token)
#:    reduces in bf16/fp16 itself, where a plain computation (and jnp.sum) accumulates in float32: the rms error is
#:    1.1 to 2.6 times the pass line (2.5x the plain computation's) on a hundred tokens, on every seed
#:    (tests/test_seeds.py), and grows with the token count. ``dbias`` of every 16-bit linear case, ``db1`` and
#:    ``db2`` of every 16-bit GPT-2 MLP case. Must deviate. No twin computation of the gate sums the tokens in the low
#:    dtype, so the gate names no cause: it reports an unexplained deviation with the rms error and its ratio to the
#:    plain computation's (:func:`unexplained_rms`); the cause above is what looking into it found.
UNEXPLAINED_RMS = re.compile(
    r"^unexplained deviation: (max error [^;]+; )?rms error [0-9.e+-]+, [0-9.]+x the plain computation's [0-9.e+-]+$"
)


def unexplained_rms(cause: str) -> bool:
    """The gate's cause of finding 1: an unexplained deviation of the rms (and perhaps the max), in numbers."""
    return UNEXPLAINED_RMS.match(cause) is not None


#: 2. XLA:CPU's float32 transcendentals. With its instruction set capped (``--xla_cpu_max_isa=AVX``, as CI reruns
#:    these tests) XLA's float32 tanh is less accurate than with AVX2/AVX-512, and on the heavy-tailed ``odd`` inputs
#:    the gradients behind GELU's ill-conditioned derivative (``1 - tanh^2`` near tanh = -1) deviate (within what a
#:    float32 tanh 4 ulp off gives); with AVX2 they pass. May deviate, ISA-dependent: the one place a tier differs
#:    between CPUs.
XLA_FLOAT32_TRANSCENDENTAL: dict[str, set[str]] = {"geglu": {"dx", "dgate"}, "gelu-mlp": {"dx", "dfc1"}}


def known_deviations(backend: str, case: Case) -> tuple[set[str], set[str]]:
    """(must, may): the tensors of a committed case (fwd+bwd) that must deviate, and that may, on this platform.
    A recomputation variant (``remat_of``) computes its twin's arithmetic, so it has its twin's findings."""
    twin = BACKENDS[backend].remat_of if backend in BACKENDS and BACKENDS[backend].remat_of else backend
    if twin not in ("jax-xla", "jax-unfused") or jax_platform() != "cpu":  # the unfused one: the same module
        return set(), set()
    must: set[str] = set()
    if case.dtype != "float32":
        must = {"linear": {"dbias"}, "gelu-mlp": {"db1", "db2"}}.get(case.model, set())
    may = (
        XLA_FLOAT32_TRANSCENDENTAL.get(case.model, set())
        if case.dtype == "float32" and case.dist != "normal"
        else set()
    )
    return must, may


def check_findings(r: Any, case: Case, names: list[str] | None = None) -> None:
    """``r`` never fails; exactly the pinned tensors deviate (those that may, may), each as the gate reads it."""
    assert r.status in ("ok", "deviates"), explain(r)
    must, may = known_deviations(r.backend, case)
    if names is not None:
        must, may = must & set(names), may & set(names)
    deviating = {t.tensor: t for t in r.parity.tensors if t.tier == "deviates"}
    assert must <= set(deviating) <= must | may, explain(r)
    for name in must:
        assert unexplained_rms(deviating[name].cause), deviating[name].cause
    assert r.status == ("deviates" if deviating else "ok"), explain(r)


#: The gradients each model returns after ``y``, in the order a backend reports them.
GRADIENTS = {
    "linear": ["dx", "dweight", "dbias"],
    "geglu": ["dx", "dgate", "dup", "ddown"],
    "swiglu": ["dx", "dgate", "dup", "ddown"],
    "gelu-mlp": ["dx", "dfc1", "db1", "dfc2", "db2"],
}


@functools.cache
def jax_platform() -> str:
    from jax_impl import device

    return device.platform()


def heavy_tailed(case: Case) -> bool:
    """The committed ``odd`` cases: heavy-tailed (Student-t) inputs at an odd shape."""
    return case.dist != "normal"


#: (backend, model) pairs for the backward alone, on tiny in bf16: every MLP family a backend implements.
BWD_PAIRS = [(b, m) for b in RUN_HERE for m in ("geglu", "swiglu", "gelu-mlp") if m in BACKENDS[b].models]

#: The groups of backends, one test module each (a backend of a framework not named here falls in ``other``).
GROUPS: dict[str, Callable[[str], bool]] = {
    "torch-compile": lambda b: b == "torch-compile",
    "torch-compile-max-autotune": lambda b: b == "torch-compile-max-autotune",
    "torch": lambda b: BACKENDS[b].framework == "torch" and b not in ("torch-compile", "torch-compile-max-autotune"),
    "jax": lambda b: BACKENDS[b].framework == "jax",
    "other": lambda b: BACKENDS[b].framework not in ("torch", "jax"),
}


def backend_parity_tests(
    group: str, cases: Callable[[Case], bool] | None = None, isa: bool = True
) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """The forward, forward+backward and backward-alone parity tests of the backends of ``group``
    (:data:`GROUPS`) on every committed case they implement (bwd alone: tiny bf16, every MLP family), against the
    float64 golden; a module binds them to test names. ``cases`` keeps fewer committed cases (a group whose every
    case is a long compile), ``isa=False`` leaves the group out of the capped-ISA pass."""
    mine = GROUPS[group]
    pairs = [(b, c) for b, c in PAIRS if mine(b) and (cases is None or cases(c))]
    bwd_pairs = [(b, m) for b, m in BWD_PAIRS if mine(b)]
    isa_mark = pytest.mark.isa if isa else pytest.mark.standard  # standard twice is standard once

    @pytest.mark.standard
    @isa_mark
    @pytest.mark.parametrize(("backend", "case"), pairs, ids=[f"{b}-{c.name}" for b, c in pairs])
    def forward(backend: str, case: Case) -> None:
        r = parity_result(backend, case, "fwd")
        assert r.status == "ok", explain(r)
        assert r.parity is not None and r.parity.passed
        assert [t.tensor for t in r.parity.tensors] == ["y"]

    @pytest.mark.standard
    @isa_mark
    @pytest.mark.parametrize(("backend", "case"), pairs, ids=[f"{b}-{c.name}" for b, c in pairs])
    def fwd_bwd(backend: str, case: Case) -> None:
        """Output and every gradient (dx and each weight, db for linear) against the golden gradients."""
        r = parity_result(backend, case, "fwd+bwd")
        names = [t.tensor for t in r.parity.tensors]
        check_findings(r, case)
        assert names == ["y", *GRADIENTS[case.model]]

    @pytest.mark.standard
    @isa_mark
    @pytest.mark.parametrize(("backend", "model"), bwd_pairs, ids=[f"{b}-{m}" for b, m in bwd_pairs])
    def bwd_alone(backend: str, model: str) -> None:
        case = PRESETS["tiny"].case("bfloat16", model=model)
        r = parity_result(backend, case, "bwd")
        check_findings(r, case, GRADIENTS[model])
        assert [t.tensor for t in r.parity.tensors] == GRADIENTS[model]

    return forward, fwd_bwd, bwd_alone
