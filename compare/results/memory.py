"""What a step holds in memory, measured from its framework (issue 19): the tensors its forward saves for the
backward, and its peak above its inputs and weights. A result's ``memory`` (``compare.results.document.Result``).

Two figures, each either measured (with the source it was read from) or absent with the reason, never 0 for "not
measured":

- **saved for backward** (:class:`Saved`): the tensors a step's forward keeps alive for its backward, each once (a
  view is counted with the storage it views, at the storage's size), without the step's inputs and weights (the cost
  model's convention, ``compare.cost.model``: the activations the forward writes that the backward reads). In
  ``fwd`` mode what an inference forward keeps for a backward: torch's forward runs under ``no_grad`` and the hooks
  see nothing saved (a measured 0), JAX's forward takes no ``vjp`` (nothing to keep).
- **peak** (:class:`Peak`): the most a step allocates above what was live before it (its inputs and weights), from
  the allocator where there is one (``torch.cuda.max_memory_allocated``, the torch profiler's allocator events on a
  CPU, a JAX device's ``memory_stats``) or from XLA's compiled program (``memory_analysis``: a static figure).
  ``bound`` marks a figure that can only be larger than the step's own (a device peak since the process started).

The backends' runners (``torch_impl.memory``, ``jax_impl.memory``) make the record as a dict
(``Prepared.memory``); the codec (``compare.formats.codec``) types it. The cost model's saved tensors of the same
step (``compare.cost.records.Cost.saved``) are compared with it byte for byte by :func:`model_check`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from compare.cost.records import Cost
from compare.formats.codec import LATER
from compare.problem.cases import InputError

#: The reason a backend's result carries when its ``Prepared`` has no memory hook.
NO_HOOK = "its Prepared has no memory hook (a backend not built on the shared torch or JAX runner)"


@dataclass(frozen=True)
class SavedTensor:
    """One tensor (one storage) kept for the backward: what made it (``label``: the op that wrote it, or JAX's own
    description of a residual), its shape, dtype and bytes (the storage's: a view counts its whole storage)."""

    label: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclass(frozen=True)
class Saved:
    """The tensors saved for the backward (:class:`SavedTensor`, each storage once), how they were counted
    (``source``), what was left out (``excluded``: inputs, weights) and the second count's verdict where there is
    one (``cross_check``: JAX's residuals counted two ways)."""

    tensors: tuple[SavedTensor, ...]
    source: str
    excluded: str = ""
    cross_check: str = ""
    #: written after the fields (``compare.formats.codec``): a stored one must be the sum of the tensors'
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("bytes",)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)


@dataclass(frozen=True)
class Peak:
    """The most a step allocated above what was live before it (its inputs and weights), in bytes, with its
    ``source``; ``detail`` the figures it was made of (XLA's temporary, argument, output and alias bytes); ``bound``
    when it can only be larger than the step's own peak."""

    bytes: int
    source: str
    detail: dict[str, int] = field(default_factory=dict)
    bound: bool = field(default=False, metadata=LATER)


@dataclass(frozen=True)
class Memory:
    """A step's memory record: what it saved for the backward and its peak, each None with its reason when it was
    not measured (never 0)."""

    saved: Saved | None = field(default=None, metadata=LATER)
    saved_reason: str = field(default="", metadata=LATER)
    peak: Peak | None = field(default=None, metadata=LATER)
    peak_reason: str = field(default="", metadata=LATER)

    def __post_init__(self) -> None:
        for name, got, why in (("saved", self.saved, self.saved_reason), ("peak", self.peak, self.peak_reason)):
            if got is None and not why:
                raise ValueError(f"a memory record without {name} must say why ({name}_reason)")

    @staticmethod
    def not_measured(reason: str) -> Memory:
        """Neither figure, for ``reason``."""
        return Memory(None, reason, None, reason)


def model_saved(cost: Cost) -> list[tuple[str, int]]:
    """The cost model's saved tensors of a step (``Cost.saved``: written by the forward, read by the backward; no
    inputs, no weights), each ``(name, bytes)``."""
    size = {t.name: t.bytes for t in cost.tensors}
    return [(n, size[n]) for n in cost.saved]


@dataclass(frozen=True)
class Check:
    """A measured saved-for-backward count against the cost model's plan: ``verdict`` is ``= model``, ``differs``,
    ``not modelled`` or ``not measured``; ``difference`` the measured bytes minus the model's (None unless both
    exist); ``text`` says it in a table cell (a difference names both sides' tensors)."""

    verdict: str
    text: str
    difference: int | None = None
    #: a table cell's form: ``text`` unless it differs, then the difference and the tensor counts only
    short: str = ""

    @property
    def finding(self) -> bool:
        return self.verdict == "differs"

    @property
    def cell(self) -> str:
        return self.short or self.text


def _spell_model(saved: Sequence[tuple[str, int]]) -> str:
    return " + ".join(f"{n} {b:,} B" for n, b in saved) or "nothing"


def _spell_measured(s: Saved) -> str:
    """The measured tensors, alike ones (label, shape, bytes) once with their count (``2 x Mm 1024x3072 8 B``)."""
    alike = Counter((t.label, "x".join(map(str, t.shape)), t.bytes) for t in s.tensors)
    return " + ".join(f"{f'{n} x ' if n > 1 else ''}{lab} {shape} {b:,} B" for (lab, shape, b), n in alike.items()) or (
        "nothing"
    )


def model_check(memory: Memory | None, cost: Cost | None) -> Check:
    """The measured saved tensors against the cost model's, byte for byte (the way collectives are checked against
    the communication model): ``= model`` when they hold the same bytes in the same sizes; else both sides spelled
    out and the difference in bytes (a backend whose plan keeps g and u out of memory and saves them shows them)."""
    if memory is None or memory.saved is None:
        why = "no memory record" if memory is None else memory.saved_reason
        return Check("not measured", f"not measured ({why})")
    if cost is None:
        return Check("not modelled", "not modelled (no cost-model plan)")
    want = model_saved(cost)
    got = memory.saved
    diff = got.bytes - sum(b for _, b in want)
    if sorted(t.bytes for t in got.tensors) == sorted(b for _, b in want):
        return Check("= model", "= model", 0)
    sign = "+" if diff >= 0 else "-"
    names = ", ".join(n for n, _ in want) or "none"
    how = "same bytes in other tensors" if diff == 0 else f"{sign}{abs(diff):,} B"
    return Check(
        "differs",
        f"**{_spell_measured(got)} != model ({cost.plan}) {_spell_model(want)}** ({how})",
        diff,
        f"**differs: {how}** ({len(got.tensors)} tensors, model {len(want)}: {names})",
    )


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6}
_UNITS |= {"gb": 10**9, "tb": 10**12}


def parse_size(value: str, option: str) -> int:
    """A size in bytes from ``80GiB``, ``512MiB``, ``1.5GB``, ``4096`` (bytes; binary and decimal units, any case);
    anything else, a negative or a non-finite size, is an :class:`~compare.problem.cases.InputError` naming
    ``option``."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise InputError(
            f"{option}: {value!r} is not a size; give a number with a unit, e.g. 80GiB, 512MiB, 1.5GB or 4096 "
            f"(bytes); units: {', '.join(u for u in ('B', 'KiB', 'MiB', 'GiB', 'TiB', 'kB', 'MB', 'GB', 'TB'))}"
        )
    return int(float(m.group(1)) * _UNITS[unit])
