"""Counting the collectives a torch TP step issues, and their bytes: what ``TPParts.collectives`` reports and what
the comm-only twin (``torch_impl.tp_common.replay``) issues alone.

Two counters, one record:

- :func:`count_eager`: ``CommDebugMode`` (without its module tracker) around one call of the step; every
  collective it dispatches is a :class:`Call` (its kind, the payload bytes of its input tensors, their dtype);
- :func:`count_profiled`: the outermost all-reduce events of ``torch.profiler`` around one call, for the compiled
  steps (``CommDebugMode`` cannot see into a compiled graph);

both give a :class:`Counted`: the calls in the order issued and one :class:`~compare.backends.tp.Collective` line per
kind (:func:`summarise`, :func:`collective_line`). Kinds are named as JAX's HLO names them (``all-reduce``,
``all-gather``, ...; :func:`collective_kind`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor.debug import CommDebugMode

from compare.backends.tp import Collective
from torch_impl import device as dev
from torch_impl.quiet_stderr import filtered_stderr


class _NoModuleTracker:
    """Stands in for ``CommDebugMode``'s module tracker, whose backward hooks refuse ``torch.autograd.grad`` (the
    steps' backward): every collective is then counted under one module, ``Global``."""

    name = "Global"
    is_bw = False
    activation_checkpointing = False
    module_parents_dict: dict[str, set[str]] = {"Global": set()}  # noqa: RUF012 (read-only)

    def __enter__(self) -> _NoModuleTracker:
        return self

    def __exit__(self, *args: object) -> None:
        return None


#: Fragments of a collective op's name and the kind ``compare.backends.tp.Collective`` names it by (JAX's HLO names).
_KINDS: tuple[tuple[str, str], ...] = (
    ("all_reduce", "all-reduce"),
    ("allreduce", "all-reduce"),
    ("all_gather", "all-gather"),
    ("allgather", "all-gather"),
    ("reduce_scatter", "reduce-scatter"),
    ("all_to_all", "all-to-all"),
    ("alltoall", "all-to-all"),
    ("broadcast", "broadcast"),
)
#: c10d collectives that work in place on their first argument (every other c10d one reads its input second).
_IN_PLACE = frozenset({"allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_"})


def collective_kind(op: str) -> str:
    """The kind of the collective op named ``op`` (e.g. ``"c10d.allreduce_"`` is ``"all-reduce"``); the op's own
    name where it is none of :data:`_KINDS`."""
    return next((kind for fragment, kind in _KINDS if fragment in op), op)


def _tensors(a: Any) -> list[torch.Tensor]:
    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, list | tuple):
        return [t for x in a for t in _tensors(x)]
    return []


@dataclass(frozen=True)
class Call:
    """One collective call of a step, as counted: its ``kind`` (``compare.backends.tp.Collective.kind``), the payload
    bytes of its input tensors (``nbytes``: the tensors reduced, gathered from, scattered or sent) and their
    ``dtype``."""

    kind: str
    nbytes: int
    dtype: torch.dtype


@dataclass(frozen=True)
class Counted:
    """The collectives of one step: every ``calls`` in the order issued (what ``torch_impl.tp_common.replay`` issues
    alone) and one :class:`~compare.backends.tp.Collective` line per kind (what ``TPParts.collectives`` reports; an
    all-reduce line always, with count 0 when the step issued none)."""

    calls: tuple[Call, ...]
    collectives: tuple[Collective, ...]


def summarise(calls: Sequence[Call], source: str, ops: Mapping[str, int] | None = None) -> Counted:
    """``calls`` with their per-kind lines; ``ops`` (op name: calls), where known, goes into each line's detail."""
    kinds = list(dict.fromkeys(["all-reduce", *(c.kind for c in calls)]))
    lines = []
    for kind in kinds:
        named = ", ".join(f"{k} x{v}" for k, v in (ops or {}).items() if collective_kind(k) == kind)
        lines.append(collective_line(kind, [c.nbytes for c in calls if c.kind == kind], source, named))
    return Counted(tuple(calls), tuple(lines))


class _SizedCommMode(CommDebugMode):
    """``CommDebugMode`` (without its module tracker) that also records every collective it counts as a
    :class:`Call`: its kind, the bytes of its input tensors and their dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.advanced_module_tracker = _NoModuleTracker()  # type: ignore[assignment]
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = sum(self.comm_counts.values())
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and sum(self.comm_counts.values()) > before:  # CommDebugMode counted it
            name = str(getattr(func, "_overloadpacket", func))
            space, _, op = name.rpartition(".")
            first = 0 if space != "c10d" or op in _IN_PLACE else 1
            tensors = _tensors(args[first]) if len(args) > first else []
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            dtype = tensors[0].dtype if tensors else torch.float32
            self.calls.append(Call(collective_kind(name), nbytes, dtype))
        return out


def count_eager(run: Callable[[], Any]) -> Counted:
    """The collectives of one call of ``run``, counted by ``CommDebugMode`` (sizes from the input tensors)."""
    with _SizedCommMode() as mode:
        dev.sync(run())
    return summarise(mode.calls, "CommDebugMode", {str(k): v for k, v in mode.get_comm_counts().items()})


#: Profiler events of one all-reduce call each (``c10d::allreduce_`` nested in a functional one is the same call).
_ALLREDUCE_EVENTS = frozenset({"_c10d_functional::all_reduce", "_c10d_functional::all_reduce_", "c10d::allreduce_"})


def count_profiled(run: Callable[[], Any], dtype: torch.dtype) -> Counted:
    """The all-reduces of one call of ``run``, counted from ``torch.profiler`` events (``CommDebugMode`` cannot see
    into a compiled graph: under a dispatch mode the compiled code is not what runs). Each outermost all-reduce
    event is one call, its payload the recorded shape in ``dtype``; ``detail`` says how many ran inside a compiled
    graph (``## Call CompiledFxGraph``) and how many outside it (eager DTensor redistributes). Only all-reduces are
    looked for (the compiled TP steps issue nothing else)."""
    from torch.profiler import ProfilerActivity, profile

    with filtered_stderr(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dev.sync(run())
    sizes, inside = [], 0
    for e in prof.events():
        if e.name not in _ALLREDUCE_EVENTS:
            continue
        chain = []
        p = e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        if any(n in _ALLREDUCE_EVENTS for n in chain):
            continue
        sizes.append(int(np.prod(e.input_shapes[0])) * dtype.itemsize if e.input_shapes and e.input_shapes[0] else 0)
        inside += any(n.startswith("## Call CompiledFxGraph") for n in chain)
    detail = f"{inside} inside a compiled graph, {len(sizes) - inside} outside (eager)"
    line = collective_line("all-reduce", sizes, "torch.profiler", detail)
    return Counted(tuple(Call("all-reduce", n, dtype) for n in sizes), (line,))


def collective_line(kind: str, sizes: Sequence[int], source: str, detail: str) -> Collective:
    """One :class:`Collective` line for the ``kind`` calls of ``sizes`` bytes each."""
    each = sorted(set(sizes))
    return Collective(kind, len(sizes), int(sum(sizes)), source, f"{detail}; bytes each: {', '.join(map(str, each))}")
