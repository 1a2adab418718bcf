"""A negative control for the torch TP backends: ``torch-tp-manual`` whose step skips its all-reduces (its
compute-only twin, a partial output on each rank), judged by the gate as if it were the real step. It must fail.
Its ``bind`` is the twin's too (the same wrong function on fresh inputs), and its collectives are the twin's own
count (none), which its comm-only twin replays."""

from __future__ import annotations

import dataclasses

from compare.backends.registry import Availability, BackendSpec, Prepared
from compare.backends.tp import Group
from compare.problem.cases import TP_MODELS
from compare.problem.golden import Problem
from torch_impl import collectives as counting
from torch_impl import device as dev
from torch_impl import tp_common as tc
from torch_impl.backends.tp_manual import BACKEND as MANUAL

NAME = "torch-tp-skip-reduce"
SPEC = BackendSpec(
    name=NAME,
    framework="torch",
    target="tests.torch_tp_skip_backend",
    about="torch-tp-manual without its all-reduces (a negative control: must fail parity)",
    models=TP_MODELS,
    runtime="torch_impl.tp_runtime",
)


class SkipReduce:
    name = NAME

    def availability(self) -> Availability:
        return MANUAL.availability()

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared:
        p = MANUAL.prepare(problem, mode, group)
        assert p.tp is not None
        skip = tc.local_twin(problem, mode, group)
        collectives, comm = tc.counted_twins(lambda: counting.count_eager(skip.run), dev.device())
        tp = dataclasses.replace(p.tp, collectives=collectives, comm_only=comm)
        return dataclasses.replace(p, step=skip.run, bind=skip.bind, tp=tp)


BACKEND = SkipReduce()
