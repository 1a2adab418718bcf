"""This machine's own ceilings, measured through the shared timer: matmul FLOP/s and copy bandwidth.

- FLOP/s: ``torch.mm(a, b, out=c)`` of square ``[n, n]`` matrices in the case dtype, ``2 * n^3`` FLOPs per call;
  each rate is that of the fastest sample (a ceiling is what the machine can do at best; a median would sink
  whenever other work shares the cores, and a step would then look faster than the machine); a few sizes are tried
  and the fastest rate is kept (on a 2-core AMX CPU a bf16 GEMM ran faster at 1024 than at
  1536 or 2048, so one size alone would understate the peak; 2048 would add 0.9 s per fp32 run for no higher
  rate). Precision is pinned as the backends pin it (no TF32 for fp32).
- bytes/s: ``dst.copy_(src)`` of one large buffer in the fastest sample, counted as ``2 * copy_bytes`` (every
  byte read once and written once). The buffer is far larger than the last-level cache, so this is memory bandwidth.

Defaults: matmul sizes 1024 and 1536 with a 256 MiB copy on CPU (about 1.2 s per dtype on 2 cores for fp32,
under 0.5 s for bf16 with AMX); 4096 and 8192 with a 1 GiB copy on CUDA. Tests pass small sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from compare import timing
from compare.cases import DTYPES, check_name
from torch_impl import device as dev

#: Matmul sizes ``n`` (``[n, n] @ [n, n]``) and the copied buffer's bytes, per device type.
DEFAULT_MATMUL_SIZES: dict[str, tuple[int, ...]] = {"cpu": (1024, 1536), "cuda": (4096, 8192)}
DEFAULT_COPY_BYTES: dict[str, int] = {"cpu": 256 * 2**20, "cuda": 2**30}


def _sync_for(device: torch.device) -> Any:
    if device.type == "cuda":
        return lambda _outs: torch.cuda.synchronize(device)
    return lambda _outs: None  # CPU torch ops are synchronous


def measure_ceilings(
    dtype: str,
    device: str,
    budget_s: float = 0.5,
    *,
    matmul_sizes: Sequence[int] | None = None,
    copy_bytes: int | None = None,
) -> dict[str, Any]:
    """Measure peak matmul FLOP/s (in ``dtype``) and copy bandwidth on ``device`` (``"cpu"`` or ``"cuda"``).

    ``budget_s`` is split between the matmul sizes and the copy as each measurement's sampling budget (at least
    5 samples are always taken). Returns ``{"flops_per_s", "bytes_per_s", "matmul_shape": [n, n, n] (the best
    size), "copy_bytes" (one buffer; each copy moves twice that), "dtype", "device", "timing": {"matmul":
    Timing dict of the best size, "matmul_all": {n: {"median_s", "flops_per_s"}}, "copy": Timing dict}}``.
    """
    check_name("dtype", dtype, DTYPES)
    dev_ = torch.device(device)
    if dev_.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings: device 'cuda' asked for, but torch sees no CUDA device")
    kind = "cuda" if dev_.type == "cuda" else "cpu"
    sizes = tuple(matmul_sizes or DEFAULT_MATMUL_SIZES[kind])
    nbytes = int(copy_bytes or DEFAULT_COPY_BYTES[kind])
    if not sizes or any(n <= 0 for n in sizes) or nbytes <= 0:
        raise ValueError(f"matmul sizes and copy bytes must be positive; got {sizes}, {nbytes}")
    precision = dev.pin_precision()
    tdtype = dev.TORCH_DTYPES[dtype]
    sync = _sync_for(dev_)
    share = budget_s / (len(sizes) + 1)

    per_size: dict[str, dict[str, float]] = {}
    best: tuple[float, int, dict[str, Any]] | None = None
    gen = torch.Generator(device=dev_).manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=gen, device=dev_, dtype=torch.float32).to(tdtype)
        b = torch.randn(n, n, generator=gen, device=dev_, dtype=torch.float32).to(tdtype)
        c = torch.empty(n, n, device=dev_, dtype=tdtype)

        def matmul(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
            return torch.mm(a, b, out=c)

        t = timing.measure(matmul, sync, warmup=1, budget_s=share)
        rate = 2 * n**3 / t.min_s  # 2 n^3 FLOPs per [n, n] @ [n, n], in the fastest sample: a peak
        per_size[str(n)] = {"median_s": t.median_s, "min_s": t.min_s, "flops_per_s": rate}
        if best is None or rate > best[0]:
            best = (rate, n, t.to_dict())
    assert best is not None

    numel = nbytes // tdtype.itemsize
    src = torch.ones(numel, device=dev_, dtype=tdtype)  # written once here, so its pages exist before timing
    dst = torch.empty_like(src)
    tc = timing.measure(lambda: dst.copy_(src), sync, warmup=1, budget_s=share)
    moved = 2 * numel * tdtype.itemsize  # every byte read from src and written to dst
    return {
        "flops_per_s": best[0],
        "bytes_per_s": moved / tc.min_s,
        "matmul_shape": [best[1]] * 3,
        "copy_bytes": numel * tdtype.itemsize,
        "dtype": dtype,
        "device": str(dev_),
        "precision": precision,
        "timing": {"matmul": best[2], "matmul_all": per_size, "copy": tc.to_dict()},
    }


def measure_all(dtypes: Sequence[str], budget_s: float = 0.5) -> dict[str, Any]:
    """The ``ceilings`` probe of ``compare.registry``: ``{"device": ..., dtype: measure_ceilings(...)}`` on the
    device the torch backends use."""
    from torch_impl import device as dev

    device = str(dev.device())
    return {"device": device, **{d: measure_ceilings(d, device, budget_s) for d in dtypes}}
