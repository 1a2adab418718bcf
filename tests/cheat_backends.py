"""Cheats: backends that answer from memory instead of computing, each right on the golden inputs and faster than any
real step. Only the harness's own inputs (``compare.run.pipeline.Feed``: every call after the first on values no
call has seen, some of them judged, chosen after the fact) can see them.

From the :class:`~compare.problem.golden.Problem` alone (the answer of the golden inputs, at every call, on any
inputs):

- ``cheat-golden``: ``golden_for(problem.case).ref``;
- ``cheat-file``: the committed golden file itself (``compare.problem.golden.load_file``);
- ``cheat-compute``: ``compare.problem.reference.compute(..., Arith.exact())`` on the problem's own inputs and weights.

Built on the shared torch runner (``torch_impl.runner``), honest on every input they have not seen:

- ``cheat-cache``: its forward keeps each output under its input tensor's identity (``data_ptr``, ``_version``,
  shape) and returns it when that identity comes again, after two throwaway ``F.linear`` calls, so that its time
  stays under the machine's ceilings; ``cheat-cache-bare`` without them;
- ``cheat-lazy``: its step returns a lazy object that computes only when read (``to_numpy``), outside every timed
  block.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.problem.golden import Problem, golden_for, load_file
from compare.problem.reference import Arith, compute, round_to_dtype
from compare.run.cell import MODE_TENSORS
from torch_impl import device as dev
from torch_impl import runner
from torch_impl.models import build_module


def _from_golden(problem: Problem) -> dict[str, np.ndarray]:
    return dict(golden_for(problem.case).ref)


def _from_file(problem: Problem) -> dict[str, np.ndarray]:
    return dict(load_file(problem.case).ref)


def _computed(problem: Problem) -> dict[str, np.ndarray]:
    return compute(problem.case.model, problem.x, problem.params, problem.dy, Arith.exact())


class Cheat:
    def __init__(self, name: str, answer: Callable[[Problem], dict[str, np.ndarray]]) -> None:
        self.name = name
        self.answer = answer

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        want = MODE_TENSORS[mode]
        dtype = problem.case.dtype
        stored = {k: round_to_dtype(v, dtype) for k, v in self.answer(problem).items() if want(k)}

        def step() -> dict[str, np.ndarray]:
            return stored

        return Prepared(
            step=step,
            sync=lambda _outs: None,
            to_numpy=lambda out: {k: np.asarray(v, dtype=np.float64) for k, v in out.items()},
            bind=lambda _inputs, _slot: step,  # it implements the interface, and still answers from memory
        )


class CacheCheat:
    """``cheat-cache`` (``throwaway`` 2) and ``cheat-cache-bare`` (0): see the module docstring."""

    def __init__(self, name: str, throwaway: int) -> None:
        self.name, self.throwaway = name, throwaway

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        seen: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
        w = next(module.parameters())

        def forward(x: torch.Tensor) -> torch.Tensor:
            key = (x.data_ptr(), x._version, tuple(x.shape))
            if key in seen:
                for _ in range(self.throwaway):  # work the size of one projection, thrown away
                    F.linear(x, w[:, : x.shape[-1]]).sum()
                return seen[key]
            seen[key] = y = module(x)
            return y

        return runner.prepare(problem, mode, module, forward)


class _Lazy:
    """An output that is not computed yet: ``run()`` computes it."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run


class LazyCheat:
    """``cheat-lazy``: the eager step, deferred until its output is read."""

    name = "cheat-lazy"

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        p = runner.prepare(problem, mode, module)
        step, read, bind = p.step, p.to_numpy, p.bind
        assert bind is not None

        def lazy_bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], _Lazy]:
            run = bind(inputs, slot)
            return lambda: _Lazy(run)

        return Prepared(
            step=lambda: _Lazy(step),
            sync=lambda _outs: None,
            to_numpy=lambda out: read(out.run()),
            bind=lazy_bind,
        )


CHEATS: dict[str, Any] = {
    "cheat-golden": Cheat("cheat-golden", _from_golden),
    "cheat-file": Cheat("cheat-file", _from_file),
    "cheat-compute": Cheat("cheat-compute", _computed),
    "cheat-cache": CacheCheat("cheat-cache", 2),
    "cheat-cache-bare": CacheCheat("cheat-cache-bare", 0),
    "cheat-lazy": LazyCheat(),
}


def spec(name: str) -> BackendSpec:
    """A registry line for one cheat (``BackendSpec.load`` imports this module and reads ``CHEATS[name]``)."""
    return _CheatSpec(
        name=name, framework="torch", target="tests.cheat_backends", about="a cheat: returns the stored answer"
    )


class _CheatSpec(BackendSpec):
    def load(self) -> Any:
        return {**CHEATS, **ADVERSARIAL}[self.name]


# --- the cheats an adversarial user wrote against values seen before (each on the shared torch runner) -------------


class RowCacheCheat:
    """``cheat-row-cache`` (``pad`` 0) and ``cheat-row-cache-padded`` (2 throwaway projections a hit): its forward keeps
    each token's output under its row's first four values and answers a call whose rows it has all seen from memory.
    ``hits`` counts the calls answered so (the golden inputs' second call is one)."""

    def __init__(self, name: str, pad: int) -> None:
        self.name, self.pad, self.hits = name, pad, 0

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        rows: dict[tuple[float, ...], torch.Tensor] = {}
        w = next(module.parameters())

        def forward(x: torch.Tensor) -> torch.Tensor:
            flat = x.detach().reshape(-1, x.shape[-1])
            keys = [tuple(r[:4].tolist()) for r in flat]
            if all(k in rows for k in keys):
                self.hits += 1
                for _ in range(self.pad):
                    F.linear(x, w[:, : x.shape[-1]]).sum()
                return torch.stack([rows[k] for k in keys]).reshape(*x.shape[:-1], -1)
            y = module(x)
            for k, r in zip(keys, y.detach().reshape(len(keys), -1), strict=True):
                rows[k] = r
            return y

        return runner.prepare(problem, mode, module, forward)


class CopyCheat:
    """``cheat-copy``: its step copies ``x`` and ``dy`` (a memcpy, all the timed window sees) and returns the copies;
    its ``to_numpy`` computes the answer from them when read."""

    name = "cheat-copy"

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        p = runner.prepare(problem, mode, module)
        assert p.bind is not None
        bind = p.bind
        dtype = dev.TORCH_DTYPES[problem.case.dtype]

        def copying_bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
            x, dy = (torch.from_numpy(inputs[k]).to(dtype) for k in ("x", "dy"))

            def step() -> tuple[torch.Tensor, torch.Tensor]:
                return x.clone(), dy.clone()

            return step

        def to_numpy(out: tuple[torch.Tensor, torch.Tensor]) -> dict[str, np.ndarray]:
            x, dy = (t.to(torch.float32).numpy() for t in out)
            return p.to_numpy(bind({"x": x, "dy": dy}, 99)())

        golden = copying_bind({"x": problem.x, "dy": problem.dy}, 0)
        return Prepared(step=golden, sync=p.sync, to_numpy=to_numpy, bind=copying_bind)


class ThreadCheat:
    """``cheat-thread``: its forward returns an empty tensor at once and computes into it on a thread of its own
    (20 ms later); its sync returns at once."""

    name = "cheat-thread"

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])

        def forward(x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(*x.shape[:-1], problem.case.output_shape()[-1], dtype=x.dtype)

            def later() -> None:
                time.sleep(0.02)
                with torch.no_grad():
                    out.copy_(module(x))

            threading.Thread(target=later, daemon=True).start()
            return out

        return replace(runner.prepare(problem, "fwd", module, forward), sync=lambda _outs: None)


class StaleCheat:
    """``cheat-stale-10`` and ``cheat-stale-50``: on a share ``f`` of its calls (drawn per call) its forward returns
    the previous call's output instead of computing."""

    def __init__(self, name: str, share: float) -> None:
        self.name, self.share = name, share

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, problem: Problem, mode: str) -> Prepared:
        module = build_module(problem, dev.device(), dev.TORCH_DTYPES[problem.case.dtype])
        last: list[torch.Tensor] = []
        rng = random.Random()

        def forward(x: torch.Tensor) -> torch.Tensor:
            if last and rng.random() < self.share:
                return last[0]
            last[:] = [module(x)]
            return last[0]

        return runner.prepare(problem, "fwd", module, forward)


#: The cheats of an adversarial user against inputs seen before (``tests/test_fastest.py``): by name.
ADVERSARIAL: dict[str, Any] = {
    "cheat-row-cache": RowCacheCheat("cheat-row-cache", 0),
    "cheat-row-cache-padded": RowCacheCheat("cheat-row-cache-padded", 2),
    "cheat-copy": CopyCheat(),
    "cheat-thread": ThreadCheat(),
    "cheat-stale-10": StaleCheat("cheat-stale-10", 0.1),
    "cheat-stale-50": StaleCheat("cheat-stale-50", 0.5),
}
