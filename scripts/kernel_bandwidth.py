"""Bandwidth of the GeGLU elementwise step alone, against this GPU's copy bandwidth (issue target: >= 85%).

    python scripts/kernel_bandwidth.py [--tokens 8192] [--hidden 3072] [--dtype bfloat16] [--out DIR]

Times, through the shared timer, on ``g, u [tokens, hidden]``: the hand-written Triton kernel
(``torch_impl.ops.glu.glu_forward``: reads g and u, writes h = 3 * tokens * hidden * itemsize bytes),
Inductor's fused kernel for the same expression, eager's two kernels (GELU, then mul: 5 tensor passes), and a
``copy_`` of one [tokens, hidden] tensor (2 passes) as the ceiling. CUDA only: under the Triton interpreter
nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from compare.formats.codec import to_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--budget", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=None, help="folder for kernel_bandwidth.json/.md")
    a = p.parse_args()

    import torch
    import torch.nn.functional as F

    import torch_impl  # noqa: F401  (configures Triton before it is imported)
    from compare.formats.markdown import fmt_s, table
    from compare.timing import timer

    if not torch.cuda.is_available():
        print("error: needs a CUDA device; the Triton interpreter is for parity, never for timing", file=sys.stderr)
        return 2
    from torch_impl.ops.glu import glu_forward

    dt = getattr(torch, a.dtype)
    g = torch.randn(a.tokens, a.hidden, device="cuda", dtype=dt)
    u = torch.randn_like(g)
    dst = torch.empty_like(g)
    nbytes = g.numel() * g.element_size()  # one [tokens, hidden] tensor

    def sync(_outs: object) -> None:
        torch.cuda.synchronize()

    compiled = torch.compile(lambda g, u: F.gelu(g, approximate="tanh") * u, dynamic=False)
    candidates = {
        "copy_ (ceiling)": (lambda: dst.copy_(g), 2 * nbytes),
        "torch-triton glu_forward": (lambda: glu_forward(g, u), 3 * nbytes),
        "torch.compile fused gelu*mul": (lambda: compiled(g, u), 3 * nbytes),
        "eager gelu then mul": (lambda: F.gelu(g, approximate="tanh") * u, 5 * nbytes),
    }
    rows, doc = (
        [],
        {"tokens": a.tokens, "hidden": a.hidden, "dtype": a.dtype, "gpu": torch.cuda.get_device_name(0), "kernels": {}},
    )
    copy_bw = None
    for name, (fn, moved) in candidates.items():
        t = timer.measure(fn, sync, budget_s=a.budget)
        bw = moved / t.median_s
        copy_bw = copy_bw or bw
        doc["kernels"][name] = {"bytes": moved, "timing": to_json(t), "bytes_per_s": bw, "of_copy": bw / copy_bw}
        rows.append(
            [
                name,
                f"{moved / 1e6:.1f} MB",
                fmt_s(t.median_s),
                fmt_s(t.iqr_s),
                str(t.n),
                f"{bw / 1e9:.0f} GB/s",
                f"{bw / copy_bw:.0%}",
            ]
        )
    md = (
        f"GeGLU elementwise step on [{a.tokens}, {a.hidden}] {a.dtype}, {doc['gpu']}\n\n"
        + table(["kernel", "bytes moved", "median", "IQR", "n", "achieved", "of copy bandwidth"], rows)
        + "\n"
    )
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "kernel_bandwidth.json").write_text(json.dumps(doc, indent=1) + "\n")
        (a.out / "kernel_bandwidth.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
