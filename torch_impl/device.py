"""Where torch backends run, how they sync, and the precision settings they pin."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import torch
import torch.utils._pytree

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(_outputs: Any = None) -> None:
    """Block until all queued device work is done: ``torch.cuda.synchronize()`` on CUDA.

    CPU torch ops run synchronously on the calling thread, so on CPU there is nothing left to wait for.
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def output_arrays(output: Any) -> list[torch.Tensor]:
    """The arrays a step returned (``compare.backends.registry.OutputReader``): every leaf of ``output`` (tuples,
    lists and dicts, ``torch.utils._pytree``) must be a plain, materialised ``torch.Tensor`` (exactly that type: a
    subclass can compute when read), else a ``TypeError`` naming the first that is not."""
    leaves = torch.utils._pytree.tree_leaves(output)
    for leaf in leaves:
        if type(leaf) is not torch.Tensor:
            raise TypeError(f"its output holds a {type(leaf).__module__}.{type(leaf).__qualname__}, not a torch.Tensor")
    return leaves


def array_rows(a: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of ``a`` seen as ``[T, a.shape[-1]]``, copied to float64 host memory."""
    return a.detach().reshape(-1, a.shape[-1])[torch.from_numpy(rows).to(a.device)].to("cpu", torch.float64).numpy()


def pin_precision() -> dict[str, Any]:
    """Turn TF32 off everywhere (fp32 means fp32) and return the settings, for the results' environment."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {
        "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch_cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


#: Set by :func:`key_inductor_cache` (None until then): the vector ISA Inductor generates C++ for in this process.
_INDUCTOR_ISA: str | None = None
#: The variable in which :func:`key_inductor_cache` notes the folder it chose (so a child process that inherits
#: ``TORCHINDUCTOR_CACHE_DIR`` from it keys again, by its own ISA, rather than taking it for the user's choice).
_KEYED = "FUSION_COMPARE_INDUCTOR_CACHE"


def key_inductor_cache() -> dict[str, Any]:
    """Give Inductor's on-disk caches a folder per vector ISA, before anything is compiled; return what was chosen.

    Inductor (torch 2.13) does not key its caches on the vector ISA its C++ is generated for, which follows the
    CPU and ``ATEN_CPU_CAPABILITY``: a graph compiled under one and served from the cache under the other computes
    wrong values (measured on an AVX-512 CPU: code compiled there, replayed with ``ATEN_CPU_CAPABILITY=avx2``, gave a
    max error of 7 on a GeGLU whose outputs are of order 1, and the reverse order 5; ``tests/test_inductor_cache.py``).
    A cache folder shared by machines of different CPUs, or by runs under different caps, hits it. So, unless the
    user set ``TORCHINDUCTOR_CACHE_DIR`` (theirs is kept, and the record says so), the cache is torch's default folder
    plus ``isa-<ISA>``. Child processes inherit the variable."""
    global _INDUCTOR_ISA
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    if _INDUCTOR_ISA is None:
        _INDUCTOR_ISA = "-".join(str(cpu_vec_isa.pick_vec_isa()).split()) or "none"
    default = os.path.abspath(default_cache_dir())
    ours = os.path.join(default, f"isa-{_INDUCTOR_ISA}")
    # Inductor writes its default folder into the variable the first time it looks: that one, or one this function
    # chose (here or in a parent process), is not the user's.
    users = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if users in (None, default, os.environ.get(_KEYED)):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[_KEYED] = ours
        return {"inductor_vec_isa": _INDUCTOR_ISA, "inductor_cache": "a folder per vector ISA"}
    return {"inductor_vec_isa": _INDUCTOR_ISA, "inductor_cache": "TORCHINDUCTOR_CACHE_DIR as set (not keyed by ISA)"}


def threads() -> dict[str, Any]:
    return {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads()}


def triton_availability() -> Any:
    """The ``compare.backends.registry.Availability`` of a Triton backend: interpreted runs are parity only (not
    timed)."""
    from compare.backends.registry import Availability

    ok, reason, interpreted = triton_status()
    return Availability(ok, reason, timed=not interpreted, device=str(device()))


def require_triton_glu(backend: str, model: str) -> Any:
    """Check a Triton gated-MLP backend can run ``model`` (a GLU family: GeGLU, SwiGLU) here; return its
    availability, else raise saying why."""
    from compare.problem.cases import GLU_MODELS

    if model not in GLU_MODELS:
        raise ValueError(f"{backend} implements models {', '.join(GLU_MODELS)} only, not {model!r}")
    avail = triton_availability()
    if not avail.ok:
        raise RuntimeError(avail.reason)
    return avail


def triton_status() -> tuple[bool, str, bool]:
    """(usable, reason if not, interpreted) for Triton kernels on this machine."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return False, f"triton is not installed ({exc}); pip install triton", False
    if torch.cuda.is_available():
        return True, "", False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, "", True
    why = "imported before TRITON_INTERPRET=1 was set" if "triton" in sys.modules else "TRITON_INTERPRET is not 1"
    return False, f"no CUDA device and the Triton interpreter is off ({why})", False
