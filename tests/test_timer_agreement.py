"""The shared timer against the frameworks' own: ``torch.utils.benchmark`` for a torch step, ``timeit`` with
``jax.block_until_ready`` for a jitted JAX step, in one process, interleaved (the methods alternate, round after
round, so load drift hits them alike). In warm mode their medians agree to 5%. The control: a step that does twice
the work is told apart by the same comparison (the check can fail)."""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable
from typing import Any

import pytest

from compare.timing import timer

pytestmark = [pytest.mark.slow, pytest.mark.compile]  # about 12 s each: the slow tier (make ci)
ROUNDS = 7
TOLERANCE = 0.05


def _ours(step: Callable[[], Any], sync: Callable[[Any], None]) -> float:
    return timer.measure(step, sync, warmup=2, min_samples=7, budget_s=0.15).median_s


def _interleaved(a: Callable[[], float], b: Callable[[], float]) -> float:
    """The median over :data:`ROUNDS` rounds of the ratio of two methods' per-call seconds, each round timing both
    (who goes first alternates): a round's two figures share its load, so their ratio is what is compared."""
    ratios = []
    for r in range(ROUNDS):
        if r % 2:
            y = b()
            x = a()
        else:
            x = a()
            y = b()
        ratios.append(x / y)
    return statistics.median(ratios)


def _torch_step(n: int) -> tuple[Callable[[], Any], Any, Any]:
    import torch

    torch.manual_seed(7)
    x, w = torch.randn(n, 773), torch.randn(773, 517)
    return (lambda: x @ w), x, w


def _torch_benchmark(n: int) -> Callable[[], float]:
    from torch.utils import benchmark

    _, x, w = _torch_step(n)
    t = benchmark.Timer(stmt="x @ w", globals={"x": x, "w": w}, num_threads=1)
    return lambda: t.blocked_autorange(min_run_time=0.15).median


@pytest.fixture
def one_torch_thread() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # torch.utils.benchmark times with num_threads=1: both methods on one thread
    yield
    torch.set_num_threads(before)


def test_the_timer_agrees_with_torch_utils_benchmark(one_torch_thread: Any) -> None:
    step, _, _ = _torch_step(1031)
    ratio = _interleaved(lambda: _ours(step, lambda outs: None), _torch_benchmark(1031))
    assert abs(ratio - 1) <= TOLERANCE, ratio
    # control: twice the rows is twice the work, and the same comparison says so
    double, _, _ = _torch_step(2062)
    ratio = _interleaved(lambda: _ours(double, lambda outs: None), _torch_benchmark(1031))
    assert ratio > 1 + 3 * TOLERANCE, ratio


def test_the_timer_agrees_with_timeit_and_block_until_ready() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    f = jax.jit(lambda x, w: jnp.tanh(x @ w))
    rng = np.random.default_rng(7)
    x = jax.device_put(rng.standard_normal((1031, 773), dtype=np.float32))
    w = jax.device_put(rng.standard_normal((773, 517), dtype=np.float32))
    jax.block_until_ready(f(x, w))

    def step() -> Any:
        return f(x, w)

    def with_timeit() -> float:
        t = timeit.Timer(lambda: jax.block_until_ready(f(x, w)))
        number, _ = t.autorange()  # calls per repeat lasting at least 0.2 s
        return statistics.median(t.repeat(repeat=5, number=number)) / number

    ratio = _interleaved(lambda: _ours(step, jax.block_until_ready), with_timeit)
    assert abs(ratio - 1) <= TOLERANCE, ratio
