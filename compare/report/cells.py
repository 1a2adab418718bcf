"""What the report's per-result tables share: the columns they open with, and figures in MiB and signed seconds."""

from __future__ import annotations

from collections.abc import Mapping

from compare.formats.markdown import case_label, fmt_s
from compare.results.document import Result

#: The columns a per-result table opens with; :func:`lead` gives a result's cells in them.
LEAD = ["backend", "case", "dtype", "mode"]


def lead(r: Result) -> list[str]:
    """A result's backend as tables show it (``Result.label``), case, dtype and mode."""
    return [r.label, case_label(r), r.dtype, r.mode]


def mib(n: int) -> str:
    """Bytes as MiB, to 4 significant digits (``48 MiB``, ``0.1389 MiB``); exact bytes stay in results.json."""
    return f"{n / (1 << 20):.4g} MiB"


def signed_s(s: float | None) -> str:
    """Seconds with their sign (:func:`~compare.formats.markdown.fmt_s` shows none); None is ``-``."""
    return "-" if s is None else ("-" if s < 0 else "") + fmt_s(abs(s))


def changes(old: Mapping[str, str | None], new: Mapping[str, str | None]) -> tuple[str, ...]:
    """What differs between two records of versions or settings, by name: ``torch 2.12.0 -> 2.13.0``, ``$FOO - ->
    1`` (``-``: not there)."""
    return tuple(
        f"{k} {old.get(k) or '-'} -> {new.get(k) or '-'}" for k in sorted({*old, *new}) if old.get(k) != new.get(k)
    )
