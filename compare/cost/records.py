"""The cost model's records as a result stores them (``result.cost``, ``cost.achieved``) and the machine's measured
ceilings (``results.json``'s ``ceilings``). ``compare.cost.model`` computes them; this module only holds and
(de)serialises them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from compare.formats.codec import INLINE, LATER
from compare.timing.timer import Timing

#: Native 16-bit matmul counts as emulated when it runs below this fraction of the float32 route (both operands
#: converted to float32, a float32 GEMM, the result converted back). Hardware 16-bit GEMM (AVX512-BF16, AMX, tensor
#: cores) runs at least as fast as that route, usually 2x or more; software emulation on an AVX2 CPU ran ~1/50 of it
#: (0.93 GFLOP/s against ~50 GFLOP/s on 2 cores). A factor of 4 sits far from both, so neither sampling noise nor a
#: slow conversion on a small matrix flips the verdict.
EMULATED_BELOW = 0.25

#: The two matmul routes a 16-bit dtype's ceiling is measured by (``Ceiling.route`` names the faster one).
NATIVE_ROUTE, FLOAT32_ROUTE = "native", "float32"


@dataclass(frozen=True)
class CostTensor:
    """One tensor a modelled step touches: its 2-D ``shape`` (tokens flattened), ``bytes`` (its size), its
    ``role`` (input, weight, intermediate, output, gradient) and how many kernels read and write it."""

    name: str
    shape: tuple[int, ...]
    bytes: int
    role: str
    reads: int
    writes: int


@dataclass(frozen=True)
class Achieved:
    """A measured step against this machine's ceilings (``compare.cost.model.roofline``): achieved FLOP/s and
    bytes/s, their fractions of the ceilings, the roofline-predicted time and its ``bound`` (``compute`` or
    ``memory``), ``roofline_fraction = predicted_s / median_s`` and the ridge intensity (FLOP/byte)."""

    flops_per_s: float
    bytes_per_s: float
    flops_fraction: float
    bytes_fraction: float
    predicted_s: float
    bound: str
    roofline_fraction: float
    ridge_intensity: float


@dataclass(frozen=True)
class Cost:
    """The cost model's entry for one (backend, case, mode): GEMM ``flops``, elementwise ``ew_flops``, ``bytes``
    moved, ``arithmetic_intensity`` (FLOP/byte), every tensor touched, the intermediates' traffic and names
    (``materialized``), the activations ``saved`` for the backward, the model's kernels, the ``assumption`` the
    backend's plan rests on (``""`` where it was read off the framework) and, when the run measured its ceilings,
    the ``achieved`` rates."""

    backend: str
    plan: str
    mode: str
    dtype: str
    flops: int
    ew_flops: int
    bytes: int
    arithmetic_intensity: float
    tensors: tuple[CostTensor, ...]
    intermediate_bytes: int
    materialized: tuple[str, ...]
    saved: tuple[str, ...]
    model_kernels: tuple[str, ...]
    model_kernels_per_step: int
    assumption: str = ""
    achieved: Achieved | None = field(default=None, metadata=LATER)

    def tensor(self, name: str) -> CostTensor:
        """The entry of tensor ``name``."""
        return next(t for t in self.tensors if t.name == name)


@dataclass(frozen=True)
class CeilingTimings:
    """How a dtype's ceilings were measured: the matmul timing of the ceiling (the winning route's best size) and the
    copy's (the shared timer's), and every matmul size tried, ``{size: {"median_s", "min_s", "flops_per_s"}}`` (the
    rate of the fastest sample): ``matmul_all`` by the native route, ``float32_route_all`` by the float32 route (a
    16-bit dtype only; empty otherwise and in older documents, and then left out of its JSON)."""

    matmul: Timing | None = None
    matmul_all: dict[str, Any] = field(default_factory=dict)
    copy: Timing | None = None
    float32_route_all: dict[str, Any] = field(default_factory=dict, metadata=LATER)


@dataclass(frozen=True)
class Ceiling:
    """This machine's measured matmul FLOP/s and copy bandwidth for one dtype (the roofline's roofs), with how they
    were measured: the matmul shape, the bytes copied, the device, its precision settings and the timings.

    The matmul ceiling is the faster of two routes: ``native_flops_per_s`` (``torch.mm`` in the dtype) and, for a
    16-bit dtype, ``float32_route_flops_per_s`` (converted to float32 and back, the conversions' time included);
    ``route`` names the one ``flops_per_s`` is (:data:`NATIVE_ROUTE`, :data:`FLOAT32_ROUTE`, or ``xla`` where XLA's
    own probe, ``jax_impl.ceilings``, was faster than both: :meth:`merged`). Also
    ``aten_cpu_capability``, the CPU kernels torch dispatched to (``AVX2``, ``AVX512``; ``""``: not read) and
    ``probe_s``, the probe's wall time for this dtype. An older document lacks these: it measured the native route
    only, so they default to that, and are left out of its JSON while they hold their defaults."""

    flops_per_s: float
    bytes_per_s: float
    matmul_shape: tuple[int, ...] = ()
    copy_bytes: int = 0
    dtype: str = ""
    device: str = ""
    precision: dict[str, Any] = field(default_factory=dict)
    timing: CeilingTimings | None = None
    native_flops_per_s: float | None = field(default=None, metadata=LATER)
    float32_route_flops_per_s: float | None = field(default=None, metadata=LATER)
    route: str = field(default=NATIVE_ROUTE, metadata=LATER)
    aten_cpu_capability: str = field(default="", metadata=LATER)
    probe_s: float | None = field(default=None, metadata=LATER)

    @property
    def matmul_emulated(self) -> bool:
        """True when native matmul in this dtype runs below :data:`EMULATED_BELOW` of the float32 route: no
        hardware 16-bit GEMM here (e.g. bfloat16 on an AVX2 CPU). False where either rate was not measured."""
        native, f32 = self.native_flops_per_s, self.float32_route_flops_per_s
        return native is not None and f32 is not None and native < EMULATED_BELOW * f32

    def merged(self, other: Ceiling) -> Ceiling:
        """This probe's record with ``other``'s (another library's probe of the same dtype and device, e.g. XLA's)
        where that is higher: the matmul ceiling, its shape, route and timing from the faster one, the copy
        bandwidth the higher one, the routes this probe measured kept (so "emulated" still reads torch's routes)."""
        out = self
        if other.flops_per_s > self.flops_per_s:
            out = replace(
                out,
                flops_per_s=other.flops_per_s,
                matmul_shape=other.matmul_shape,
                route=other.route,
                timing=other.timing,
            )
        if other.bytes_per_s > out.bytes_per_s:
            out = replace(out, bytes_per_s=other.bytes_per_s, copy_bytes=other.copy_bytes)
        return out


@dataclass(frozen=True)
class Ceilings:
    """The ceilings of a run: the ``device`` they were measured on and one :class:`Ceiling` per dtype. Stored as
    ``{"device": ..., "<dtype>": {...}, ...}``."""

    device: str
    by_dtype: dict[str, Ceiling] = field(metadata=INLINE)

    def get(self, dtype: str) -> Ceiling | None:
        """The ceiling of ``dtype`` when it has positive FLOP/s and bandwidth, else None."""
        c = self.by_dtype.get(dtype)
        return c if c is not None and c.flops_per_s and c.bytes_per_s else None

    def peak(self, other: Ceilings) -> Ceilings:
        """Per dtype, the higher of this probe's and ``other``'s (:meth:`Ceiling.merged`: a second probe made later,
        or another library's on the same device): a ceiling is the best the machine did with any library, and load
        only ever lowers a probe."""
        out = dict(self.by_dtype)
        for k, c in other.by_dtype.items():
            out[k] = out[k].merged(c) if k in out else c
        return Ceilings(self.device, out)
