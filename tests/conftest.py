"""Shared fixtures: parity results are cached per (backend, case, mode) so each compile happens once a session.

First, before anything imports triton: this test process's one choice of how Triton kernels run (compiled where
CUDA exists, interpreted elsewhere; ``triton_impl.env.choose``). No test module sets
``TRITON_INTERPRET``; ``tests/test_triton_env.py`` proves that the choice does not leak.
"""

from __future__ import annotations

import functools
import os

import pytest

from triton_impl import env as triton_env

#: What the choice was, and the variable as it stood right after it (the leak test compares against both). Made
#: first, before any import below could import triton.
TRITON_INTERPRETED = triton_env.choose()
TRITON_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")

from compare.backends.registry import spec  # noqa: E402
from compare.gate import fresh  # noqa: E402
from compare.problem.cases import Case  # noqa: E402
from compare.results.document import Result  # noqa: E402
from compare.run.cell import plain_reference  # noqa: E402
from compare.run.harness import run_one  # noqa: E402
from compare.run.pipeline import CaseReference  # noqa: E402
from compare.timing.timer import TimingConfig  # noqa: E402

#: Every test's tier, one marker of these at least (the most severe one counts): ``quick`` runs in ``make check``
#: (in-process, well under a second, no compile at a new shape, no worker process), ``standard`` in ``make test``,
#: ``slow`` (more than about 10 s) in ``make test-slow``; ``make ci`` runs them all. A module marks its tier once
#: (``pytestmark``) and a heavier test of it marks its own.
TIERS: tuple[str, ...] = ("quick", "standard", "slow")


#: What each of several test worker processes (``pytest -n N``) gets, unless the caller set it: one thread for
#: OpenMP's pool (torch's), OpenBLAS's and MKL's. N workers of the default thread count on N cores oversubscribe
#: them, and OpenMP's spin-waiting threads then starve the other workers: on 2 cores, ``-n 2`` ran
#: tests/test_controls.py in 142 and 163 s with the default pools, in 33 and 30 s with one thread each (while other
#: work shared the machine). XLA keeps its pools: with its Eigen pool off a jitted call runs to completion before
#: it returns, and the timer's test of JAX's asynchronous dispatch would see no asynchrony. The TP launcher sets
#: its workers' own counts; a test that needs a count sets it itself.
ONE_THREAD_ENV: dict[str, str] = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def pytest_configure(config: pytest.Config) -> None:
    """In the controller of a run with several workers (pytest-xdist starts them after this hook, with this
    environment), one thread per pool (:data:`ONE_THREAD_ENV`), keeping whatever the caller set."""
    workers = getattr(config.option, "numprocesses", None)
    if not workers or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for name, value in ONE_THREAD_ENV.items():
        os.environ.setdefault(name, value)


#: The test modules that take longest on 2 cores, longest first (seconds of test time in `make ci`'s main session,
#: fresh caches, under the AVX2 caps): collected first, so that pytest-xdist, which hands each worker one module at a
#: time in collection order (the Makefile's ``--no-loadscope-reorder``: by default it orders modules by their number
#: of tests, which put the 40 s one-test TP modules last), starts them first and the short ones fill the gaps (longest
#: first keeps the last module to finish short). A stale list costs minutes, never a result.
LONG_FIRST: tuple[str, ...] = (
    "test_module_activations",  # 185 run alone with other work on the machine (not yet timed in `make ci`)
    "test_faults",  # 115
    "test_parity",  # 65
    "test_ray_sweep",  # 59
    "test_ab",  # 55
    "test_fastest",  # 46
    "test_parity_jax",  # 45
    "test_tp_torch",  # 45
    "test_parity_torch_compile",  # 43
    "test_inductor_cache",  # 43
    "test_tp_jax",  # 40
    "test_gpu_check",  # 39
    "test_seeds",  # 36
    "test_parity_torch_compile_odd",  # 33
    "test_parity_jax_odd",  # 29
    "test_robustness",  # 27
    "test_gpu_build",  # 27
    "test_triton_env",  # 26
    "test_tp_hosts",  # 23
    "test_cli",  # 22
    "test_controls",  # 22
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test without a tier (``make check`` selects by marker, so an unmarked test would silently leave
    it); put the :data:`LONG_FIRST` modules first (a stable sort: each module's tests keep their order);
    ``gpu``-marked tests skip, saying why, where torch sees no CUDA device (they run in the GPU check)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
    untiered = [item.nodeid for item in items if not any(t in item.keywords for t in TIERS)]
    if untiered:
        shown = "\n  ".join(untiered[:20]) + (f"\n  ... and {len(untiered) - 20} more" if len(untiered) > 20 else "")
        raise pytest.UsageError(f"tests without a tier marker ({', '.join(TIERS)}):\n  {shown}")
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (no CUDA device here); runs in scripts/gpu_check.sh")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@functools.cache
def case_reference(case: Case) -> CaseReference:
    """One fresh draw of ``case`` (with ``dy``) and its float64 reference for the session, as a run shares one
    between its cells of a case: the reference costs more than a parity-only step."""
    return CaseReference(case, fresh.new_seed())


@functools.cache
def parity_result(backend: str, case: Case, mode: str) -> Result:
    """Parity-only run of a registered backend (no timing), cached for the session."""
    plain = plain_reference(case)
    return run_one(spec(backend), case, mode, plain, TimingConfig(), {}, time_it=False, reference=case_reference(case))


def explain(r: Result) -> str:
    """A failure message with the numbers: status, reason and each tensor's error against its bound."""
    lines = [f"{r.backend} {r.case} {r.mode}: {r.status} {r.reason}"]
    for t in r.parity.tensors if r.parity is not None else ():
        lines.append(
            f"  {t.tensor}: max abs err {t.max_abs_err:.3g} bound {t.bound:.3g} ratio {t.ratio:.2f} at {t.worst_index}"
        )
    if r.extras.get("traceback"):
        lines.append(r.extras["traceback"])
    return "\n".join(lines)
