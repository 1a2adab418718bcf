"""What a run ran on: machine, versions, precision settings. Versions come from package metadata, so collecting
them imports no framework; the GPU name is read only if torch is already loaded by a backend."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from compare.jsonfields import Obj, Setting, mapping, opt_integer, opt_text, record_dict, text

#: Distribution names (normalised: importlib.metadata treats - and _ alike).
PACKAGES: tuple[str, ...] = ("numpy", "torch", "jax", "jaxlib", "flax", "triton", "jax_triton", "safetensors")


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return None


def available_memory_bytes() -> tuple[int, str] | None:
    """Memory a new allocation can get without swapping, and where the number came from; None if unknown.

    Linux's ``MemAvailable`` (``/proc/meminfo``) first, else ``os.sysconf``'s free physical pages (which leave out
    reclaimable caches, so they understate it).
    """
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                value, *unit = line.split(":", 1)[1].split()
                return int(value) * (1024 if unit == ["kB"] else 1), "MemAvailable in /proc/meminfo"
    names = getattr(os, "sysconf_names", {})
    if "SC_AVPHYS_PAGES" in names and "SC_PAGE_SIZE" in names:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and size > 0:
            return pages * size, "free physical pages (os.sysconf)"
    return None


@dataclass(frozen=True)
class Environment:
    """The ``environment`` of a results document: platform, CPU model and logical cores, the GPU (None without one),
    package versions (None: not installed), the thread settings and the precision settings the backends reported,
    and ``TRITON_INTERPRET`` as it was set."""

    platform: str = ""
    cpu: str = ""
    cpu_count: int | None = None
    gpu: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    threads: dict[str, Setting] = field(default_factory=dict)
    precision: dict[str, Setting] = field(default_factory=dict)
    triton_interpret: str = ""

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @staticmethod
    def from_dict(d: Obj) -> Environment:
        """The inverse of :meth:`to_dict`; an absent field takes its default."""
        return Environment(
            platform=text(d, "platform", ""),
            cpu=text(d, "cpu", ""),
            cpu_count=opt_integer(d, "cpu_count"),
            gpu=opt_text(d, "gpu"),
            versions=mapping(d, "versions"),
            threads=mapping(d, "threads"),
            precision=mapping(d, "precision"),
            triton_interpret=opt_text(d, "triton_interpret") or "",
        )


def collect(precision: Mapping[str, Setting], threads: Mapping[str, Setting]) -> dict[str, Any]:
    """The ``environment`` object of ``results.json``, collected here and now (:func:`current` as JSON data)."""
    return current(precision, threads).to_dict()


def current(precision: Mapping[str, Setting], threads: Mapping[str, Setting]) -> Environment:
    """The :class:`Environment` of a run, collected here and now."""
    return Environment(
        platform=platform.platform(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        gpu=gpu(),
        versions=versions(),
        threads=dict(threads),
        precision=dict(precision),
        triton_interpret=os.environ.get("TRITON_INTERPRET", ""),
    )
