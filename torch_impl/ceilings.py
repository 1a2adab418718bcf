"""This machine's own ceilings, measured through the shared timer: matmul FLOP/s and copy bandwidth.

- FLOP/s: square ``[n, n] @ [n, n]`` matmuls, ``2 * n^3`` FLOPs per call. A rate is that of the fastest sample (a
  ceiling is what the machine can do at best; a median would sink whenever other work shares the cores, and a step
  would then look faster than the machine). Precision is pinned as the backends pin it (no TF32 for fp32).
- Two routes for a 16-bit dtype (bfloat16, float16): ``native`` (:func:`native_matmul`, ``torch.mm`` in the dtype)
  and ``float32`` (:func:`float32_matmul`: both operands converted to float32, a float32 ``torch.mm``, the result
  converted back; still counted as ``2 * n^3`` FLOPs, the conversions' time included). The dtype's ceiling is the
  faster route. Where the CPU has no 16-bit GEMM instructions (an AVX2 CPU: no AVX512-BF16, no AMX) the native route
  is emulated, about 50x below float32 (0.93 against ~50 GFLOP/s on 2 cores), while a backend may compute bf16
  through float32 (XLA does): a ceiling from the native route alone flagged every real bf16 step implausible.
  A 32-bit dtype has the native route only.
- Sizes: a ladder from small to large, each size tried only while the route's share of the budget allows. The
  next size's call is predicted from the last one's fastest (times ``(n' / n)^3``; a small size's call is mostly
  overhead, so this overestimates) and made only when it fits in what is left; then :data:`MIN_CALLS` of the call
  as it really took (the shared timer's first call, a warm-up and 5 samples) must fit, else it is tried once more
  when two fit (other work on the cores delays one call by milliseconds) and the ladder stops there when it does
  not. So a route overruns its share by at most one call, one whose prediction was wrong. A route's unused share
  goes to the next; what the ladders leave is spent sampling the ceiling's size again (more samples, a truer peak).
  Several sizes matter: on a 2-core AMX CPU a bf16 GEMM ran faster at 1024 than at 1536 or 2048, so one size alone
  would understate the peak.
- bytes/s: ``dst.copy_(src)`` of one large buffer in the fastest sample, counted as ``2 * copy_bytes`` (every
  byte read once and written once). The buffer is far larger than the last-level cache, so this is memory bandwidth.

Budget: ``budget_s`` bounds the whole probe of one dtype (allocations, the copy, every route), plus at most one
over-long call per route. Defaults: 1.5 s on CPU (sizes 128 to 2048, a 128 MiB copy), 1 s on CUDA (1024 to 8192,
a 1 GiB copy). Tests pass small sizes and budgets, and may replace :func:`native_matmul` with a slow one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from compare.cost.records import FLOAT32_ROUTE, NATIVE_ROUTE
from compare.formats.codec import to_json
from compare.problem.cases import DTYPES, check_name
from compare.timing import timer
from torch_impl import device as dev

#: Matmul sizes ``n`` (``[n, n] @ [n, n]``) tried per device type, smallest first: each step at most 8x the FLOPs
#: of the last, so a ladder's smaller sizes cost about as much as its last one at most (1/8 + 1/64 + ... < 1/7).
DEFAULT_MATMUL_SIZES: dict[str, tuple[int, ...]] = {
    "cpu": (128, 256, 512, 1024, 1536, 2048),
    "cuda": (1024, 2048, 4096, 8192),
}
#: The copy's buffer: 128 MiB on CPU (source and destination, 256 MiB, are 8x a 32 MiB L3 and 2.7x a 96 MiB stacked
#: one; 7 copies of it take ~0.15 s on 2 cores, half of what 256 MiB took out of a 1.5 s budget).
DEFAULT_COPY_BYTES: dict[str, int] = {"cpu": 128 * 2**20, "cuda": 2**30}
#: The whole probe's seconds per dtype when the caller gives none.
DEFAULT_BUDGET_S: dict[str, float] = {"cpu": 1.5, "cuda": 1.0}
#: Calls one size costs at the least through the shared timer: the first call, one warm-up, 5 samples.
MIN_CALLS = 7
#: The share of the dtype's budget kept for the copy, measured after the matmuls: at least :data:`MIN_CALLS` copies
#: (7 x 256 MiB moved, ~0.15 s on 2 cores, plus first touching 256 MiB) and one buffer size needs no more. The
#: matmul routes come first and get the rest for sure: the FLOP/s ceiling is the one a step is flagged against.
COPY_SHARE = 0.25

#: A matmul route: ``(a, b, out) -> out``, ``a``, ``b``, ``out`` square ``[n, n]`` in the measured dtype.
Matmul = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def native_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The native route: one ``torch.mm`` in the operands' dtype into ``out``. Module-level so that a test can put a
    slow route in its place (as a CPU without 16-bit GEMM instructions has); looked up at each probe."""
    return torch.mm(a, b, out=out)


def float32_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The float32 route: ``a`` and ``b`` converted to float32 (reads 2 n^2 16-bit elements, writes 2 n^2 float32
    ones), one float32 ``torch.mm``, its result converted into ``out`` (n^2 float32 read, n^2 16-bit written)."""
    return out.copy_(torch.mm(a.to(torch.float32), b.to(torch.float32)))


@dataclass(frozen=True)
class RoutePeak:
    """One route's peak: ``flops_per_s`` at the best size ``n`` (its :class:`~compare.timing.timer.Timing`), and every
    size
    tried, ``{str(n): {"median_s", "min_s", "flops_per_s"}}``."""

    flops_per_s: float
    n: int
    timing: timer.Timing
    sizes: dict[str, dict[str, float]]


def _sync_for(device: torch.device) -> Any:
    if device.type == "cuda":
        return lambda _outs: torch.cuda.synchronize(device)
    return lambda _outs: None  # CPU torch ops are synchronous


def _size_entry(n: int, t: timer.Timing) -> dict[str, float]:
    return {"median_s": t.median_s, "min_s": t.min_s, "flops_per_s": 2 * n**3 / t.min_s}  # 2 n^3 FLOPs per call


def _fits(call_s: float, calls: int, deadline: float) -> bool:
    return calls * call_s <= deadline - timer.CLOCK()


def ladder(
    matmul: Matmul,
    tdtype: torch.dtype,
    device: torch.device,
    sizes: Sequence[int],
    deadline: float,
) -> tuple[RoutePeak, Callable[[], torch.Tensor]]:
    """The peak FLOP/s of ``matmul`` over the ladder ``sizes`` (smallest first, 5 samples each), within ``deadline``
    (a :data:`compare.timing.timer.CLOCK` time) but for at most one call (module docstring), and the call of its best
    size
    (for :func:`resample`). The smallest size is always measured. A first call too slow to fit is tried once more
    when two fit (other work on the cores delays one call by milliseconds, and a new size's first call may set up its
    kernel), so that one slow call does not end the ladder; a route that is truly slow stops there."""
    sync = _sync_for(device)
    gen = torch.Generator(device=device).manual_seed(0)
    per_size: dict[str, dict[str, float]] = {}
    best: tuple[float, int, timer.Timing, Callable[[], torch.Tensor]] | None = None
    prev: tuple[int, float] | None = None  # the last size measured, and its fastest seconds per call
    for n in sizes:
        if prev is not None and not _fits(prev[1] * (n / prev[0]) ** 3, 1, deadline):
            break  # its first call is predicted not to fit
        a = torch.randn(n, n, generator=gen, device=device, dtype=torch.float32).to(tdtype)
        b = torch.randn(n, n, generator=gen, device=device, dtype=torch.float32).to(tdtype)
        c = torch.empty(n, n, device=device, dtype=tdtype)

        def call(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
            return matmul(a, b, c)

        first, _ = timer.first_call(call, sync)
        if prev is not None and not _fits(first, MIN_CALLS - 1, deadline):
            if not _fits(first, 2, deadline):
                break  # too slow for even one more: that call was the one overrun
            again, _ = timer.first_call(call, sync)
            if not _fits(again, MIN_CALLS - 1, deadline):
                break  # slow twice: this size does not fit
        t = timer.measure(call, sync, first_call_s=first, warmup=1, budget_s=0.0)  # 5 samples
        per_size[str(n)] = _size_entry(n, t)
        rate = per_size[str(n)]["flops_per_s"]
        if best is None or rate > best[0]:
            best = (rate, n, t, call)
        prev = (n, t.min_s)
    assert best is not None  # the first size is always measured
    rate, n, t, best_call = best
    return RoutePeak(rate, n, t, per_size), best_call


def resample(peak: RoutePeak, call: Callable[[], torch.Tensor], device: torch.device, deadline: float) -> RoutePeak:
    """``peak`` sampled again at its size until ``deadline`` (a warm-up and 5 samples at the least, one sample over
    at most; nothing when they do not fit): the faster of the two measurements is the peak."""
    t = peak.timing
    sample_s = t.calls_per_sample * t.median_s
    left = deadline - timer.CLOCK()
    if left < t.median_s + 6 * sample_s:
        return peak
    again = timer.measure(
        call, _sync_for(device), first_call_s=t.first_call_s, warmup=1, budget_s=left - t.median_s - sample_s
    )
    if again.min_s >= t.min_s:
        return peak
    entry = _size_entry(peak.n, again)
    return RoutePeak(entry["flops_per_s"], peak.n, again, {**peak.sizes, str(peak.n): entry})


def route_peaks(
    tdtype: torch.dtype, device: torch.device, sizes: Sequence[int], deadline: float
) -> tuple[dict[str, RoutePeak], str]:
    """Every route's peak (:func:`ladder`; the float32 route for a 16-bit dtype only), the routes sharing the time to
    ``deadline`` in turn (what one leaves unused, the next gets), the faster one sampled again with what is left
    (:func:`resample`); and the faster one's name. The matrices are freed on return."""
    routes: list[tuple[str, Matmul]] = [(NATIVE_ROUTE, native_matmul)]  # looked up now: a test may have replaced it
    if tdtype.itemsize == 2:
        routes.append((FLOAT32_ROUTE, float32_matmul))
    ladders: dict[str, tuple[RoutePeak, Callable[[], torch.Tensor]]] = {}
    for i, (name, matmul) in enumerate(routes):
        share = max(0.0, deadline - timer.CLOCK()) / (len(routes) - i)
        ladders[name] = ladder(matmul, tdtype, device, sizes, timer.CLOCK() + share)
    peaks = {name: peak for name, (peak, _) in ladders.items()}
    route = max(peaks, key=lambda k: peaks[k].flops_per_s)
    peaks[route] = resample(*ladders[route], device, deadline)
    return peaks, route


def copy_timing(numel: int, tdtype: torch.dtype, device: torch.device, budget_s: float) -> timer.Timing:
    """The shared timer's timing of ``dst.copy_(src)``, two ``[numel]`` buffers of ``tdtype`` (their memory is
    freed on return)."""
    src = torch.ones(numel, device=device, dtype=tdtype)  # written once here, so its pages exist before timing
    dst = torch.empty_like(src)
    return timer.measure(lambda: dst.copy_(src), _sync_for(device), warmup=1, budget_s=budget_s)


def aten_cpu_capability() -> str:
    """The CPU kernels ATen dispatches to here (``AVX2``, ``AVX512``, ``DEFAULT``; capped by ``ATEN_CPU_CAPABILITY``),
    or ``""`` where this torch cannot say."""
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return str(get()) if get is not None else ""


def measure_ceilings(
    dtype: str,
    device: str,
    budget_s: float | None = None,
    *,
    matmul_sizes: Sequence[int] | None = None,
    copy_bytes: int | None = None,
) -> dict[str, Any]:
    """Measure peak matmul FLOP/s (in ``dtype``) and copy bandwidth on ``device`` (``"cpu"`` or ``"cuda"``).

    ``budget_s`` (default :data:`DEFAULT_BUDGET_S`) bounds the whole probe (module docstring); ``matmul_sizes`` is
    the ladder, tried smallest first. Returns ``{"flops_per_s"`` (the faster route's), ``"bytes_per_s"``,
    ``"matmul_shape": [n, n, n]`` (the faster route's best size), ``"copy_bytes"`` (one buffer; each copy moves
    twice that), ``"dtype"``, ``"device"``, ``"precision"``, ``"native_flops_per_s"``, ``"float32_route_flops_per_s"``
    (None for a 32-bit dtype), ``"route"`` (``native`` or ``float32``: which is ``flops_per_s``),
    ``"aten_cpu_capability"``, ``"probe_s"`` (this probe's wall seconds), ``"timing": {"matmul":`` Timing dict of the
    ceiling's size, ``"matmul_all": {n: {"median_s", "min_s", "flops_per_s"}}`` (native route), ``"copy":`` Timing
    dict, and for a 16-bit dtype ``"float32_route_all"`` (as ``matmul_all``)``}}``.
    """
    start = timer.CLOCK()
    check_name("dtype", dtype, DTYPES)
    dev_ = torch.device(device)
    if dev_.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings: device 'cuda' asked for, but torch sees no CUDA device")
    kind = "cuda" if dev_.type == "cuda" else "cpu"
    sizes = tuple(sorted(matmul_sizes or DEFAULT_MATMUL_SIZES[kind]))
    nbytes = int(copy_bytes or DEFAULT_COPY_BYTES[kind])
    budget = DEFAULT_BUDGET_S[kind] if budget_s is None else budget_s
    if not sizes or any(n <= 0 for n in sizes) or nbytes <= 0 or budget < 0:
        raise ValueError(f"matmul sizes, copy bytes and budget must be positive; got {sizes}, {nbytes}, {budget}")
    deadline = start + (1 - COPY_SHARE) * budget  # for the matmuls; the copy's share comes after
    precision = dev.pin_precision()
    tdtype = dev.TORCH_DTYPES[dtype]

    peaks, route = route_peaks(tdtype, dev_, sizes, deadline)
    best, native, f32 = peaks[route], peaks[NATIVE_ROUTE], peaks.get(FLOAT32_ROUTE)
    numel = nbytes // tdtype.itemsize
    # sampled for what is left of the copy's share, 5 samples at the least
    tc = copy_timing(numel, tdtype, dev_, max(0.0, start + budget - timer.CLOCK()) / 2)
    moved = 2 * numel * tdtype.itemsize  # every byte read from src and written to dst
    timings: dict[str, Any] = {"matmul": to_json(best.timing), "matmul_all": native.sizes, "copy": to_json(tc)}
    if f32 is not None:
        timings["float32_route_all"] = f32.sizes
    return {
        "flops_per_s": best.flops_per_s,
        "bytes_per_s": moved / tc.min_s,
        "matmul_shape": [best.n] * 3,
        "copy_bytes": numel * tdtype.itemsize,
        "dtype": dtype,
        "device": str(dev_),
        "precision": precision,
        "native_flops_per_s": native.flops_per_s,
        "float32_route_flops_per_s": None if f32 is None else f32.flops_per_s,
        "route": route,
        "aten_cpu_capability": aten_cpu_capability(),
        "probe_s": timer.CLOCK() - start,
        "timing": timings,
    }


def measure_all(dtypes: Sequence[str], budget_s: float | None = None) -> dict[str, Any]:
    """The ``ceilings`` probe of ``compare.backends.registry``: ``{"device": ..., dtype: measure_ceilings(...)}`` on the
    device the torch backends use; ``budget_s`` per dtype (None: :data:`DEFAULT_BUDGET_S`)."""
    device = str(dev.device())
    return {"device": device, **{d: measure_ceilings(d, device, budget_s) for d in dtypes}}
