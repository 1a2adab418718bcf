"""What a run ran on: machine, versions, precision settings, and what decides its ceilings and its bits: the CPU's
instruction sets, numpy's BLAS and the kernel it picked, and the environment variables that cap them. Versions come
from package metadata, so collecting them imports no framework; the GPU name is read only if torch is already loaded
by a backend (torch's own ATen CPU capability is the torch ceilings probe's to report, in ``Ceiling``)."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from compare.formats.codec import LATER, Setting, to_json
from compare.formats.markdown import si
from compare.timing import nvml

#: Distribution names (normalised: importlib.metadata treats - and _ alike).
PACKAGES: tuple[str, ...] = ("numpy", "torch", "jax", "jaxlib", "flax", "triton", "jax_triton", "safetensors")

#: The x86 instruction sets (``/proc/cpuinfo`` flag names) that decide the matmul ceilings and some bits: AVX2 and FMA
#: (8-wide float32 FMA GEMM kernels; FMA also changes rounding), F16C (hardware float16 <-> float32 conversion),
#: AVX-512F (16-wide kernels), AVX512-BF16 / AVX512-FP16 (native 16-bit dot products) and AMX (tile GEMMs in bf16/fp16).
#: Without one of the 16-bit ones, torch's native bfloat16/float16 matmul is emulated (far below float32).
ISA_FLAGS: tuple[str, ...] = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
)

#: Environment variables that cap the instruction sets a library uses (so its kernels, its speed and its bits), each
#: under the key the ``isa_caps`` field stores it: OpenBLAS's kernel, XLA's ``--xla_cpu_max_isa`` (inside
#: ``XLA_FLAGS``), ATen's CPU dispatch and MKL's conditional bitwise reproducibility.
ISA_CAP_VARS: tuple[str, ...] = ("OPENBLAS_CORETYPE", "xla_cpu_max_isa", "ATEN_CPU_CAPABILITY", "MKL_CBWR")

#: What a library's kernel is when it cannot be read cheaply here.
UNKNOWN = "unknown"


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_isa_from_cpuinfo(cpuinfo: str) -> tuple[str, ...] | None:
    """The :data:`ISA_FLAGS` a ``/proc/cpuinfo`` text lists in its first ``flags`` line, in :data:`ISA_FLAGS` order;
    None when the text has no ``flags`` line (not x86 Linux: unknown). A pure function of the text."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            present = set(value.split())
            return tuple(f for f in ISA_FLAGS if f in present)
    return None


def cpu_isa() -> tuple[str, ...] | None:
    """This CPU's :data:`ISA_FLAGS`, from ``/proc/cpuinfo`` where it exists; None elsewhere (unknown)."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpu_isa_from_cpuinfo(cpuinfo.read_text(errors="replace")) if cpuinfo.is_file() else None


def xla_max_isa(xla_flags: str) -> str:
    """The value of ``--xla_cpu_max_isa`` in an ``XLA_FLAGS`` string (the last one wins, as XLA reads them), or
    ``""``."""
    found = re.findall(r"--xla_cpu_max_isa=(\S+)", xla_flags)
    return found[-1] if found else ""


def isa_caps(environ: Mapping[str, str]) -> dict[str, str]:
    """Every :data:`ISA_CAP_VARS` cap as ``environ`` sets it (``""``: unset, the library picks the widest it can)."""
    caps = {var: environ.get(var, "") for var in ISA_CAP_VARS}
    caps["xla_cpu_max_isa"] = xla_max_isa(environ.get("XLA_FLAGS", ""))
    return caps


def _openblas_paths() -> list[str]:
    """Paths of OpenBLAS libraries numpy may be running: the ones its wheel bundles next to it (``numpy.libs``,
    ``numpy/.dylibs``) first, then any this process has loaded (Linux: ``/proc/self/maps``; a numpy linked to a
    system OpenBLAS)."""
    import numpy

    root = Path(numpy.__file__).parent
    dirs = (root.parent / "numpy.libs", root / ".dylibs")
    bundled = [str(p) for d in dirs if d.is_dir() for p in d.glob("*openblas*")]
    maps = Path("/proc/self/maps")
    lines = maps.read_text(errors="replace").splitlines() if maps.is_file() else []
    loaded = {ln.split()[-1] for ln in lines if "openblas" in ln and ln.split()[-1].startswith("/")}
    return sorted(bundled) + sorted(loaded - set(bundled))


def _openblas_core(path: str) -> str:
    """The kernel (core type) the OpenBLAS library at ``path`` picked at load, by its ``get_corename`` (named with
    the prefix and suffix of its build: ``openblas_get_corename``, ``scipy_openblas_get_corename64_``), or ``""``."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return ""
    for prefix in ("scipy_openblas", "openblas"):
        for suffix in ("64_", "", "_64"):
            fn = getattr(lib, f"{prefix}_get_corename{suffix}", None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                name = fn()
                return name.decode(errors="replace") if isinstance(name, bytes) else ""
    return ""


def numpy_blas() -> tuple[str, str]:
    """numpy's BLAS (``name version`` from its build configuration) and the kernel it runs (OpenBLAS's core type, e.g.
    ``Haswell``, ``SkylakeX``, ``Zen``), each :data:`UNKNOWN` where it cannot be read cheaply."""
    import numpy

    try:
        blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]
        name = f"{blas['name']} {blas.get('version', '')}".strip()
    except (AttributeError, KeyError, TypeError):
        name = UNKNOWN
    if "openblas" not in name.lower():
        return name, UNKNOWN
    core = next((c for c in map(_openblas_core, _openblas_paths()) if c), "")
    return name, core or UNKNOWN


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


def available_memory_bytes(cgroup: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """Memory a new allocation can get without swapping or meeting its control group's limit, and where the number
    came from; None if unknown.

    Linux's ``MemAvailable`` (``/proc/meminfo``) first, else ``os.sysconf``'s free physical pages (which leave out
    reclaimable caches, so they understate it); then, where the process's control group has a memory limit (cgroup
    v2's ``memory.max`` less ``memory.current`` of the group in ``/proc/self/cgroup``; v1's ``memory.limit_in_bytes``
    less ``memory.usage_in_bytes``), the smaller of the two: a container's limit, not the host's free memory."""
    host = _host_available(proc)
    limit = _cgroup_room(cgroup, proc)
    if limit is not None and (host is None or limit[0] < host[0]):
        return limit
    return host


def _host_available(proc: Path) -> tuple[int, str] | None:
    meminfo = proc / "meminfo"
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


def _cgroup_room(cgroup: Path, proc: Path) -> tuple[int, str] | None:
    """``limit - usage`` of this process's memory control group, or None without a limit (or where unreadable)."""
    try:
        lines = (proc / "self" / "cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            where, limit_name, usage_name = cgroup / rel.lstrip("/"), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            where, limit_name, usage_name = (
                cgroup / "memory" / rel.lstrip("/"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        try:
            raw = (where / limit_name).read_text(encoding="utf-8").strip()
            usage = int((where / usage_name).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= 1 << 60:  # no limit (v1 writes a huge number)
            continue
        return max(0, int(raw) - usage), f"the memory limit of its control group ({where / limit_name})"
    return None


@dataclass(frozen=True)
class DataCacheUse:
    """What a run did to the data cache (``compare.problem.datacache``, its ``run_use``), in bytes: the entries it
    added, the older entries gone by its end (trimmed to the bound, least recently used first), the cache's size at
    the end and its bound; ``off``: the cache was off (``FUSION_COMPARE_CACHE=off``), nothing kept. A write by a
    command running beside it counts as the run's."""

    added: int = 0
    removed: int = 0
    size: int = 0
    bound: int = 0
    off: bool = False

    def describe(self) -> str:
        """In words, e.g. ``+2.1 GB this run, 5.3 GB of its 20 GB bound``."""
        if self.off:
            return "off (FUSION_COMPARE_CACHE=off): nothing kept"
        added = f"+{si(self.added, 'B')}" if self.added else "nothing added"
        text = f"{added} this run, {si(self.size, 'B')} of its {si(self.bound, 'B')} bound"
        if self.removed:
            text += f", {si(self.removed, 'B')} of older entries removed"
        if self.size > self.bound:
            text += "; over the bound: this run's own entries are kept (a later run trims them)"
        return text


@dataclass(frozen=True)
class Environment:
    """The ``environment`` of a results document: platform, CPU model and logical cores, the GPU (None without one),
    package versions (None: not installed), the thread settings and the precision settings the backends reported,
    and ``TRITON_INTERPRET`` as it was set. What decides the ceilings and the bits: ``cpu_isa``, the
    :data:`ISA_FLAGS` present (None: unknown, no ``/proc/cpuinfo``), numpy's ``blas`` and the kernel it picked
    (``blas_core``), and ``isa_caps``, the :data:`ISA_CAP_VARS` as set (``""``: unset). What the run did to the data
    cache: ``data_cache`` (None: not recorded). An older document lacks them: they take their defaults, and are left
    out of its JSON while they hold them."""

    platform: str = ""
    cpu: str = ""
    cpu_count: int | None = None
    gpu: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    threads: dict[str, Setting] = field(default_factory=dict)
    precision: dict[str, Setting] = field(default_factory=dict)
    triton_interpret: str = ""
    cpu_isa: tuple[str, ...] | None = field(default=None, metadata=LATER)
    blas: str = field(default="", metadata=LATER)
    blas_core: str = field(default="", metadata=LATER)
    isa_caps: dict[str, str] = field(default_factory=dict, metadata=LATER)
    data_cache: DataCacheUse | None = field(default=None, metadata=LATER)


def collect(precision: Mapping[str, Setting], threads: Mapping[str, Setting]) -> dict[str, Any]:
    """The ``environment`` object of ``results.json``, collected here and now (:func:`current` as JSON data)."""
    return to_json(current(precision, threads))


def current(precision: Mapping[str, Setting], threads: Mapping[str, Setting]) -> Environment:
    """The :class:`Environment` of a run, collected here and now."""
    blas, blas_core = numpy_blas()
    return Environment(
        platform=platform.platform(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        gpu=gpu(),
        versions=versions(),
        threads=dict(threads),
        precision=dict(precision),
        triton_interpret=os.environ.get("TRITON_INTERPRET", ""),
        cpu_isa=cpu_isa(),
        blas=blas,
        blas_core=blas_core,
        isa_caps=isa_caps(os.environ),
    )


@dataclass(frozen=True)
class Node:
    """The machine that measured one result (a sweep row's ``node``): its host name, CPU model and instruction sets
    (:data:`ISA_FLAGS`), GPU and NVIDIA driver (None without one), the package versions, and the Ray node id when a
    Ray worker measured it (``""`` elsewhere). Two rows share a *machine type* (:meth:`machine_type`) when their
    CPU model, instruction sets and GPU are the same: timings compare within a machine type only."""

    host: str = ""
    cpu: str = ""
    cpu_isa: tuple[str, ...] | None = None
    gpu: str | None = None
    driver: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    node_id: str = ""

    def machine_type(self) -> str:
        """The hardware the timing depends on, in words: ``CPU (ISA flags), GPU`` (``no GPU`` without one)."""
        isa = "ISA unknown" if self.cpu_isa is None else ", ".join(self.cpu_isa) or "no listed ISA extension"
        return f"{self.cpu or 'unknown CPU'} ({isa}); {self.gpu or 'no GPU'}"


@functools.cache
def _gpu_driver() -> str | None:
    return nvml.driver_version()


@functools.cache
def _machine() -> tuple[str, str, tuple[str, ...] | None]:
    return platform.node(), cpu_model(), cpu_isa()


def node(node_id: str = "") -> Node:
    """This process's :class:`Node`, collected now (the host, CPU and driver once per process; the GPU as
    :func:`gpu` reads it, so after a backend has loaded torch; the versions from package metadata)."""
    host, cpu, isa = _machine()
    try:
        engine = {"ray": metadata.version("ray")}
    except metadata.PackageNotFoundError:
        engine = {}
    return Node(
        host=host,
        cpu=cpu,
        cpu_isa=isa,
        gpu=gpu(),
        driver=_gpu_driver(),
        versions={**versions(), **engine},
        node_id=node_id,
    )
