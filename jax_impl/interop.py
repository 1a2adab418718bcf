"""Zero-copy exchange of tensors between PyTorch and JAX through DLPack.

:func:`torch_to_jax` and :func:`jax_to_torch` hand over the *same* device buffer: nothing is copied when the
buffer can be shared, and :func:`shares_memory` tells whether it was. Shapes and dtypes are kept (any shape
``S``; float32, bfloat16 and float16 are the supported dtypes). torch is imported lazily, inside the functions,
so this module is importable where torch is not installed.

When a copy happens instead (checked with torch 2.13 / jax 0.10 on CPU):

- a different device is asked for (``device=`` of :func:`torch_to_jax`, e.g. a CPU tensor to a GPU device); with
  no ``device``, the JAX array lands on the tensor's own device (a CPU tensor stays on JAX's CPU device even where
  JAX's default backend is a GPU; a CUDA tensor lands on the matching JAX GPU device);
- the tensor's strides are not compact (a step slice ``t[:, ::2]``, a broadcast ``expand``): XLA refuses those
  buffers, so :func:`torch_to_jax` makes the tensor contiguous first (a torch copy). Compact strides in any order
  (``t.T``, ``permute``) are shared as they are;
- the data pointer is not aligned to XLA's minimum (64 bytes on CPU, e.g. a view with a storage offset): JAX
  copies silently;
- a dtype that JAX canonicalises: float64 (and int64) become 32-bit copies unless ``jax_enable_x64`` is on. bool and
  the integer dtypes are shared here, but only the three float dtypes are promised;
- a tensor that requires grad is detached first (DLPack cannot export it; the data is still shared, the autograd
  history is not).

A shared buffer has two owners that do not know of each other. JAX arrays are immutable: writing through the
torch side of a shared buffer changes the JAX array's value behind XLA's back (undefined behaviour for
computations that already read it), and donating the JAX array (``donate_argnums``) frees memory the torch tensor
still points at. Keep the JAX array alive and unwritten while the torch tensor is in use, and the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    import torch

__all__ = ["SUPPORTED_DTYPES", "is_compact", "jax_to_torch", "shares_memory", "torch_to_jax"]

#: The dtypes whose exchange is promised (and tested) to be zero-copy, by name (same in torch and JAX).
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

# JAX platform -> torch device type (torch names ROCm devices "cuda" too).
_TORCH_DEVICE_TYPE = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "cuda"}


def is_compact(t: torch.Tensor) -> bool:
    """Whether ``t`` (shape ``S``) covers its buffer densely, in some dimension order: row-major strides of a
    permutation of ``S``. Those are the strides XLA accepts through DLPack; size-1 dimensions may have any stride.
    """
    dims = sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=lambda d: t.stride(d), reverse=True)
    expected = 1
    for d in reversed(dims):
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def torch_to_jax(t: torch.Tensor, device: jax.Device | None = None) -> jax.Array:
    """The tensor ``t`` (shape ``S``, dtype ``D``) as a ``jax.Array`` of shape ``S`` and dtype ``D``, sharing its
    buffer when it can (see the module docstring for when it copies; :func:`shares_memory` tells).

    ``device``: where the array should live; None keeps the tensor's own device (no transfer).
    """
    src = t.detach()
    if not is_compact(src):
        src = src.contiguous()
    return jax.dlpack.from_dlpack(src, device=device)


def jax_to_torch(a: jax.Array) -> torch.Tensor:
    """The array ``a`` (shape ``S``, dtype ``D``, one device) as a torch tensor of shape ``S`` and dtype ``D`` on
    the matching torch device, sharing its buffer (JAX buffers are dense row-major, so the tensor is contiguous).

    The result aliases an immutable JAX buffer: do not write to it in place.
    """
    import torch

    return torch.from_dlpack(a)


def _device_type(a: jax.Array) -> str:
    (dev,) = a.devices()
    return _TORCH_DEVICE_TYPE.get(dev.platform, dev.platform)


def shares_memory(t: torch.Tensor, a: jax.Array) -> bool:
    """Whether tensor ``t`` and array ``a`` start at the same buffer on the same kind of device: the proof that an
    exchange did not copy. Empty tensors and arrays own no memory and share none (False)."""
    if t.numel() == 0 or a.size == 0 or len(a.devices()) != 1:
        return False
    return t.device.type == _device_type(a) and t.data_ptr() == a.unsafe_buffer_pointer()
