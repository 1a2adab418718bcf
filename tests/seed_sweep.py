"""What the seed sweeps share (``tests/test_seeds.py``, ``tests/test_seeds_odd.py``: one module per preset, so that
pytest-xdist, which keeps a module on one worker, runs the two side by side): the backends swept, the seeds, the
sweep itself and JAX's compilation cache for it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from compare.backends.registry import BACKENDS, spec
from compare.gate import fresh
from compare.problem.cases import DTYPES, PRESETS
from compare.run.cell import plain_reference
from compare.run.harness import run_one
from compare.run.pipeline import CaseReference
from compare.timing.timer import TimingConfig

SEEDS = range(10)
BACKENDS_SWEPT = ("torch-eager", "jax-xla")


@pytest.fixture(scope="module", autouse=True)
def compiled_once_per_shape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """JAX's persistent compilation cache, for this module only: each seed builds a new jitted step of the same
    program (the weights are arguments), which XLA would compile again, 20 times per case; with the cache the later
    seeds load the first one's executable (0.24 s to compile a tiny GeGLU fwd+bwd here, 0.03 s to load it). Off
    again after this module, so no other test sees a compile turned into a cache load (the compile-cost sweep counts
    compiles)."""
    try:
        import jax
        from jax._src import compilation_cache
    except ImportError:  # no JAX: nothing to cache
        yield
        return
    folder: Path = tmp_path_factory.mktemp("jax-cache")
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()  # the cache is set up at the first compile after this
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache.reset_cache()


@functools.cache
def _tiers(preset: str, model: str, dtype: str) -> dict[tuple[str, str], dict[int, tuple[str, str]]]:
    """(backend, tensor) -> seed -> (tier, why) for one preset, model and dtype."""
    out: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
    for seed in SEEDS:
        case = PRESETS[preset].case(dtype, model=model, seed=seed)
        plain = plain_reference(case)
        shared = CaseReference(case, fresh.new_seed())  # one fresh draw per case, as a run shares it
        for b in BACKENDS_SWEPT:
            if model not in BACKENDS[b].models:
                continue
            r = run_one(spec(b), case, "fwd+bwd", plain, TimingConfig(), {}, time_it=False, reference=shared)
            assert r.parity is not None, f"{b} {case.name}: {r.status} {r.reason}"
            for t in r.parity.tensors:
                out.setdefault((b, t.tensor), {})[seed] = (t.tier, t.why)
    return out


def seed_test(preset: str) -> Callable[..., None]:
    """The test over every model and dtype of ``preset`` (a module binds it to a test name)."""
    grid = [(preset, m, d) for m in ("linear", "geglu", "swiglu", "gelu-mlp") for d in DTYPES]

    @pytest.mark.slow
    @pytest.mark.parametrize(("preset", "model", "dtype"), grid, ids=[f"{p}-{m}-{d}" for p, m, d in grid])
    def every_seed(preset: str, model: str, dtype: str) -> None:
        for (backend, tensor), by_seed in _tiers(preset, model, dtype).items():
            tiers = {t for t, _ in by_seed.values()}
            failing = {s: why for s, (t, why) in by_seed.items() if t == "fail"}
            assert not failing, f"{backend} fails {tensor} on {preset} {model} {dtype}: {failing}"
            assert len(tiers) == 1, (
                f"{backend} {tensor} on {preset} {model} {dtype}: the verdict depends on the seed: "
                + ", ".join(f"seed {s} {t}" for s, (t, _) in sorted(by_seed.items()))
            )

    return every_seed
