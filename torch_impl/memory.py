"""What a torch step holds in memory (``Prepared.memory``; the record's schema is ``compare.results.memory``), for
every backend built on ``torch_impl.runner``.

- **Saved for the backward**: one forward under ``torch.autograd.graph.saved_tensors_hooks``; every tensor autograd
  saves passes the pack hook, custom ``autograd.Function``'s ``ctx.save_for_backward`` (the Triton backends',
  AOTAutograd's compiled function under ``torch.compile``) included. Each storage is counted once, at its size
  (``untyped_storage().nbytes()``: a view is counted with the storage it views, so two views of one buffer are one
  buffer's bytes); the storages of the step's input ``x``, the module's parameters and buffers are left out (the
  cost model's convention: the activations the forward writes). In ``fwd`` the step's own forward runs (under
  ``no_grad``: the hooks see what it saves, which is nothing).
  Cross-checked against the allocator: the bytes still allocated after the forward returns, less its output's
  (the profiler's allocator events on a CPU, ``torch.cuda.memory_allocated`` on CUDA): a tensor kept alive outside
  autograd's saved tensors (a backend's own cache) shows there.
- **Peak**: on a CUDA device ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, less what was
  allocated before the step; on a CPU the allocator events of ``torch.profiler.profile(profile_memory=True)`` over
  one step: the most their running sum (allocations less frees, in time order) reached above where it started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from torch_impl.quiet_stderr import filtered_stderr

#: How a CPU peak is read, as the record names its source.
CPU_PEAK_SOURCE = "torch.profiler allocator events (profile_memory=True): the running sum's maximum over one step"
CUDA_PEAK_SOURCE = "torch.cuda.max_memory_allocated after reset_peak_memory_stats, less what was allocated before"


def _label(t: torch.Tensor) -> str:
    """What made a saved tensor: its autograd node's op (``Mm``, ``Gelu``, ``Mul``), else where it came from."""
    fn = t.grad_fn
    if fn is not None:
        name = fn.name()
        return name[: -len("Backward0")] if name.endswith("Backward0") else name
    return "leaf" if t.requires_grad else "no grad_fn (made inside an autograd.Function)"


def saved_for_backward(forward: Callable[[], Any], exclude: Iterable[torch.Tensor]) -> dict[str, Any]:
    """The tensors autograd saves while ``forward()`` runs, each storage once, without those of ``exclude``; as
    ``compare.results.memory.Saved``'s dict. The forward's output is dropped before returning (its graph with it)."""
    left_out = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, dict[str, Any]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in left_out and ptr not in seen:
            whole = t.numel() * t.element_size() == storage.nbytes()
            shape = list(t.shape) if whole else [storage.nbytes() // t.element_size()]
            seen[ptr] = {
                "label": _label(t),
                "shape": shape,
                "dtype": str(t.dtype).removeprefix("torch."),
                "bytes": int(storage.nbytes()),
            }
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    tensors = list(seen.values())
    return {
        "tensors": tensors,
        "source": "torch.autograd.graph.saved_tensors_hooks over one forward (unique storages, at storage size)",
        "excluded": "the input x, the module's parameters and buffers",
        "bytes": sum(t["bytes"] for t in tensors),
    }


def _memory_events(run: Callable[[], Any]) -> tuple[Any, list[int]]:
    """``run()`` under the torch profiler with ``profile_memory=True``: its result and its CPU allocator events'
    byte counts (allocations positive, frees negative) in time order."""
    from torch.profiler import ProfilerActivity, profile

    with filtered_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    return out, [int(e.nbytes()) for e in events if e.device_type() == torch.autograd.DeviceType.CPU]


def _output_bytes(out: Any) -> int:
    """The bytes of the storages of the tensors in ``out`` (a tensor or a nest of tuples and lists), each once."""
    seen: dict[int, int] = {}
    stack = [out]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            seen[st.data_ptr()] = int(st.nbytes())
        elif isinstance(x, tuple | list):
            stack.extend(x)
    return sum(seen.values())


def outliving(forward: Callable[[], Any], device: str, cuda: CudaMemory | None = None) -> int | None:
    """The bytes the allocator still holds after ``forward()`` returns, less its output's: what the forward keeps
    alive for its backward, by any means (autograd's saved tensors, a checkpoint's inputs, a cache of the backend's
    own); None on a device without a reader here."""
    if device.startswith("cuda"):
        cuda = cuda if cuda is not None else CudaMemory()
        cuda.synchronize()
        before = cuda.allocated()
        out = forward()
        cuda.synchronize()
        held = cuda.allocated() - before - _output_bytes(out)
        del out
        return held
    if device != "cpu":
        return None
    out, events = _memory_events(forward)
    held = sum(events) - _output_bytes(out)
    del out
    return held


def cpu_peak(step: Callable[[], Any]) -> dict[str, Any]:
    """One ``step()`` under the torch profiler with ``profile_memory=True``: the most the running sum of its CPU
    allocator events reached above its start (as ``compare.results.memory.Peak``'s dict)."""
    out, cpu = _memory_events(step)
    del out
    if not cpu:
        raise RuntimeError("the profiler recorded no CPU allocator event over the step")
    running = peak = 0
    for nbytes in cpu:
        running += nbytes
        peak = max(peak, running)
    return {
        "bytes": peak,
        "source": CPU_PEAK_SOURCE,
        "detail": {"events": len(cpu), "live_after_bytes": running},
    }


class CudaMemory:
    """The CUDA allocator's counters a peak is read from (a seam: the tests script a fake device)."""

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated())

    def max_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated())

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def cuda_peak(step: Callable[[], Any], cuda: CudaMemory | None = None) -> dict[str, Any]:
    """One ``step()`` on a CUDA device: ``max_memory_allocated`` after ``reset_peak_memory_stats``, less what was
    allocated before it (its inputs and weights)."""
    cuda = cuda if cuda is not None else CudaMemory()
    cuda.synchronize()
    before = cuda.allocated()
    cuda.reset_peak()
    out = step()
    cuda.synchronize()
    peak = cuda.max_allocated()
    del out
    return {
        "bytes": peak - before,
        "source": CUDA_PEAK_SOURCE,
        "detail": {"allocated_before_bytes": before, "max_allocated_bytes": peak},
    }


def record(
    mode: str,
    device: str,
    step: Callable[[], Any],
    forward: Callable[[], Any],
    exclude: Sequence[torch.Tensor],
    cuda: CudaMemory | None = None,
) -> dict[str, Any]:
    """The memory record (``compare.results.memory.Memory``'s dict) of a prepared torch step: ``step`` the step
    itself, ``forward`` a forward that builds its autograd graph (for ``fwd``: the step, under ``no_grad``)."""
    saved = saved_for_backward(step if mode == "fwd" else forward, exclude)
    if mode == "fwd":
        saved["source"] += ", the fwd step itself (under no_grad)"
    held = outliving(step if mode == "fwd" else forward, device, cuda)
    if held is None:
        saved["cross_check"] = f"no allocator reader for torch device {device!r}: not cross-checked"
    elif held == saved["bytes"]:
        saved["cross_check"] = f"agrees with the allocator: {held:,} B outlive the forward beside its output"
    else:
        saved["cross_check"] = (
            f"DIFFERS from the allocator: {held:,} B outlive the forward beside its output, the hooks saw "
            f"{saved['bytes']:,} B ({held - saved['bytes']:+,} B held outside autograd's saved tensors, or freed "
            "with them)"
        )
    if device.startswith("cuda"):
        peak = cuda_peak(step, cuda)
    elif device == "cpu":
        peak = cpu_peak(step)
    else:
        return {"saved": saved, "peak_reason": f"no peak reader for torch device {device!r}"}
    return {"saved": saved, "peak": peak}
