"""Inductor's one-time set-up on a machine, done by ``make setup`` rather than inside the report's first compile.

The first ``torch.compile`` that Inductor lowers to C++ on a machine (with an empty cache folder) also builds what
every later compile reuses from its on-disk cache: the probe programs that pick the vector ISA, and the compiled
kernel prelude. Measured on a 2-core AVX2 EPYC (torch 2.13): a trivial graph took 16 s that way, and 6.5 s in a new
process once the cache held it (most of it importing Dynamo and Inductor); after that set-up, the ``cpu-mlp``
GeGLU's own first compile took about 6 s instead of 17 s. That set-up is not a cost of the report's models, so the
report's first compile should not carry it; this module pays it once, with a graph none of the backends compiles
(an elementwise expression on a 7x5 tensor), in the folder the backends use (``torch_impl.device
.key_inductor_cache``: one per vector ISA). The backends' own graphs are not compiled here: their first call is a
real compile of their graph (Inductor's FX graph cache still hits on a rerun, as the report's compile-cost note
says).

Run as ``python -m torch_impl.inductor_warmup``; prints the seconds it took and the cache folder.
"""

from __future__ import annotations

import os
import time


def warm_up() -> float:
    """Compile and run one small graph unlike any backend's; return the seconds it took (compile included)."""
    start = time.perf_counter()
    import torch

    from torch_impl import device, profiling

    device.key_inductor_cache()  # the folder the backends compile into: one per vector ISA
    profiling.enable_inductor_kernel_profile()  # the backends compile with it on: the same prelude is cached
    f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + 1.0, dynamic=False, fullgraph=True)
    x = torch.linspace(-3.0, 3.0, 35).reshape(7, 5)
    out = f(x)
    want = torch.nn.functional.gelu(x) * 2.0 + 1.0
    if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):  # a compiler that computes this wrong must be seen
        raise RuntimeError(f"Inductor's warm-up graph computed wrong values (max error {(out - want).abs().max()})")
    return time.perf_counter() - start


def main() -> int:
    took = warm_up()
    print(f"Inductor set up in {took:.1f} s (cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
