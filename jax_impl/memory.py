"""What a JAX step holds in memory (``Prepared.memory``; the record's schema is ``compare.results.memory``), for
every backend built on ``jax_impl.runner``.

- **Saved for the backward**: the residuals of ``jax.vjp`` of the forward, what a forward keeps for a backward that
  runs as its own computation: ``jax.ad_checkpoint.saved_residuals`` (the jaxpr's residual list, each with JAX's
  description of what made it), without those that are the step's arguments (the input ``x``, the weights) and
  literals (scalar constants). Cross-checked against the arrays a jitted ``jax.vjp`` returns in its closure
  (``jax.tree_util.tree_leaves`` of the ``vjp`` function it returns: what XLA materializes when the forward ends
  there): the two lists must hold the same shapes and dtypes. Under one ``jax.jit`` of forward and backward together
  XLA may fuse some residuals away (recomputing them in the backward's fusions) or keep others: the peak's detail
  holds what that program allocates. In ``fwd`` the step takes no ``vjp``: nothing is kept for a backward.
- **Peak**: XLA's compiled ``memory_analysis()`` of the step's program (a static figure from its buffer
  assignment): temporaries plus outputs less what aliases the arguments, the bytes it allocates above its
  arguments (inputs and weights); on a GPU also the device allocator's ``memory_stats()["peak_bytes_in_use"]`` above
  the bytes in use before the step, a bound (JAX cannot reset the peak: it is the process's so far). A step of
  op-by-op dispatch (``outer_jit=False``) has no single program: its peak is absent with the reason.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

#: The record's source of the saved tensors.
SAVED_SOURCE = "jax.ad_checkpoint.saved_residuals of jax.vjp of the forward (the jaxpr's residuals)"
PEAK_SOURCE = "XLA memory_analysis() of the compiled step: temporaries + outputs - aliased (static)"
DEVICE_PEAK_SOURCE = (
    "jax device memory_stats(): peak_bytes_in_use after the step less bytes_in_use before (the process's peak so far: "
    "a bound)"
)


def _short(description: str) -> str:
    """JAX's description of a residual without the file and line it names (``output of mul (xla_geglu)``)."""
    return re.sub(r" from \S+:\d+(:\d+)?", "", description)


def _entry(shape: tuple[int, ...], dtype: Any, label: str) -> dict[str, Any]:
    dt = np.dtype(dtype)
    return {
        "label": label,
        "shape": list(shape),
        "dtype": str(dt),
        "bytes": int(np.prod(shape, dtype=np.int64)) * dt.itemsize,
    }


def _kept(description: str) -> bool:
    """Whether a residual of ``saved_residuals`` is an activation the step made (not an argument, not a literal)."""
    return not (description.startswith("from the argument") or description == "from a literal")


def saved_for_backward(apply: Callable[..., Any], state: Any, x: jax.Array) -> dict[str, Any]:
    """The residuals ``jax.vjp(apply, state, x)`` keeps, without arguments and literals, each with JAX's own
    description (as ``compare.results.memory.Saved``'s dict), and the cross-check against a jitted ``jax.vjp``'s
    closure."""
    # the list jax.ad_checkpoint.print_saved_residuals prints (its public form); the function itself is JAX's own
    from jax._src.ad_checkpoint import saved_residuals

    residuals: list[tuple[Any, str]] = saved_residuals(apply, state, x)  # (ShapedArray, description)
    tensors = [_entry(tuple(a.shape), a.dtype, _short(d)) for a, d in residuals if _kept(d)]
    closure = jax.jit(lambda st, xx: jax.vjp(apply, st, xx)[1])(state, x)
    leaves = [a for a in jax.tree_util.tree_leaves(closure) if hasattr(a, "shape")]
    listed = Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a, _ in residuals)
    held = Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a in leaves)
    if listed == held:
        check = f"agrees with the {len(leaves)} arrays of a jitted jax.vjp's closure (arguments and literals included)"
    else:
        only_listed, only_held = listed - held, held - listed
        check = (
            f"DIFFERS from a jitted jax.vjp's closure: only in the jaxpr's list {dict(only_listed)}, only in the "
            f"closure {dict(only_held)}"
        )
    del closure, leaves
    return {
        "tensors": tensors,
        "source": SAVED_SOURCE,
        "excluded": "arguments (the input x, the weights) and literals (scalar constants)",
        "cross_check": check,
        "bytes": sum(t["bytes"] for t in tensors),
    }


def compiled_peak(jitted: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """XLA's ``memory_analysis()`` of ``jitted`` compiled for ``args`` (as ``compare.results.memory.Peak``'s dict)."""
    ma = jitted.lower(*args).compile().memory_analysis()
    if ma is None:
        raise RuntimeError("XLA's compiled program has no memory_analysis on this platform")
    temp, out, alias = int(ma.temp_size_in_bytes), int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes)
    detail = {
        "temp_bytes": temp,
        "output_bytes": out,
        "alias_bytes": alias,
        "argument_bytes": int(ma.argument_size_in_bytes),
    }
    xla_peak = getattr(ma, "peak_memory_in_bytes", None)
    if isinstance(xla_peak, int):
        detail["xla_peak_memory_bytes"] = xla_peak
    return {"bytes": temp + out - alias, "source": PEAK_SOURCE, "detail": detail}


def device_peak(step: Callable[[], Any], sync: Callable[[Any], None], device: Any) -> dict[str, Any] | None:
    """The device allocator's peak over ``step()`` (GPU): ``peak_bytes_in_use`` after it less ``bytes_in_use``
    before, a bound; None where the device keeps no statistics (a CPU)."""
    before = device.memory_stats()
    if not before:
        return None
    out = step()
    sync([out])
    after = device.memory_stats()
    del out
    in_use, peak = int(before["bytes_in_use"]), int(after["peak_bytes_in_use"])
    return {
        "bytes": peak - in_use,
        "source": DEVICE_PEAK_SOURCE,
        "detail": {"bytes_in_use_before": in_use, "peak_bytes_in_use": peak},
        "bound": True,
    }


def record(
    mode: str,
    apply: Callable[..., Any],
    state: Any,
    x: jax.Array,
    step: Callable[[], Any],
    sync: Callable[[Any], None],
    jitted: Any,
    args: tuple[Any, ...],
    compiled: bool,
    device: Any = None,
) -> dict[str, Any]:
    """The memory record (``compare.results.memory.Memory``'s dict) of a prepared JAX step. ``compiled``: the step is
    one jitted program (``jitted`` on ``args``), else op-by-op dispatch with no single program."""
    out: dict[str, Any] = {}
    if mode == "fwd":
        out["saved"] = {
            "tensors": [],
            "source": "a fwd step takes no jax.vjp: it keeps nothing for a backward",
            "excluded": "",
            "bytes": 0,
        }
    else:
        out["saved"] = saved_for_backward(apply, state, x)
    device = device if device is not None else jax.devices()[0]
    on_device = device_peak(step, sync, device) if device.platform != "cpu" else None
    if on_device is not None:
        out["peak"] = on_device
        if compiled:
            out["peak"]["detail"].update({f"xla_{k}": v for k, v in compiled_peak(jitted, args)["detail"].items()})
    elif compiled:
        out["peak"] = compiled_peak(jitted, args)
    else:
        out["peak_reason"] = (
            "op-by-op dispatch: no single compiled program to analyse, and XLA's CPU client keeps no allocator "
            "statistics"
        )
    return out
