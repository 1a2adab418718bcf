"""The backend registry: every implementation by name, loaded lazily.

A backend module (``torch_impl/backends/*.py``, ``jax_impl/backends/*.py``) exposes ``BACKEND``, an object with

- ``availability() -> Availability``: can it run here, and if not, why (imports its framework only now);
- ``prepare(problem, mode) -> Prepared``: builds the model from the weights of a :class:`~compare.golden.Problem`
  (the case, its inputs and weights, and no reference: a backend never sees the answer), moves inputs to the
  device once, and returns a zero-argument step plus how to sync and read its outputs.

Only ``compare.timing`` times anything; backends only build callables.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from compare.cases import MODELS, MODES, check_name

if TYPE_CHECKING:
    from compare.golden import Problem


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here. ``timed`` is False for interpreted (parity-only) execution."""

    ok: bool
    reason: str = ""
    timed: bool = True
    device: str = "cpu"


@dataclass
class Prepared:
    """A ready-to-run step of one backend on one case and mode.

    ``step()`` runs one forward / backward / forward+backward with inputs passed as arguments to the compiled
    function; ``sync(outputs)`` blocks until a (list of) outputs is complete; ``to_numpy(output)`` maps one
    output to named float64 arrays in the canonical layout (``y``, ``dx``, ``d<param>``).
    """

    step: Callable[[], Any]
    sync: Callable[[Any], None]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    timed: bool = True
    note: str = ""
    device: str = "cpu"
    threads: dict[str, Any] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    #: ``profile(trace_path)`` runs one more step under the framework's profiler and returns the kernel summary
    #: (schema in ``compare.kernels``); with a path it also writes a Chrome/Perfetto trace there.
    profile: Callable[[Path | None], dict[str, Any]] | None = None


class Backend(Protocol):
    name: str

    def availability(self) -> Availability: ...

    def prepare(self, problem: Problem, mode: str) -> Prepared: ...


@dataclass(frozen=True)
class BackendSpec:
    """Registry entry: where the backend lives and what it supports."""

    name: str
    framework: str
    target: str
    about: str
    models: tuple[str, ...] = MODELS
    modes: tuple[str, ...] = MODES

    def load(self) -> Backend:
        module = importlib.import_module(self.target)
        return module.BACKEND  # type: ignore[no-any-return]

    def availability(self) -> Availability:
        """Availability, with an import failure of the backend module reported as the reason."""
        try:
            return self.load().availability()
        except ImportError as exc:
            return Availability(False, f"cannot import {self.target}: {exc}")


BACKENDS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec("torch-eager", "torch", "torch_impl.backends.eager", "PyTorch eager nn.Modules (the baseline)"),
        BackendSpec("torch-compile", "torch", "torch_impl.backends.compiled",
                    "torch.compile (Inductor: fused C++ on CPU, Triton on GPU)"),
        BackendSpec("torch-triton", "torch", "torch_impl.backends.triton_geglu",
                    "eager GEMMs + hand-written Triton GeGLU elementwise kernel", models=("geglu",)),
        BackendSpec("torch-triton-fused", "torch", "torch_impl.backends.triton_fused",
                    "one Triton GEMM for gelu_tanh(x Wg^T) * (x Wu^T) (gate/up never stored) + Triton down GEMM",
                    models=("geglu",)),
        BackendSpec("jax-xla", "jax", "jax_impl.backends.xla", "flax.nnx modules under jax.jit (XLA fusion)"),
        BackendSpec("jax-pallas", "jax", "jax_impl.backends.pallas",
                    "nnx module under jax.jit with the GeGLU step as a Pallas kernel (custom VJP)", models=("geglu",)),
        BackendSpec("jax-triton", "jax", "jax_impl.backends.triton",
                    "nnx module with torch-triton's very Triton kernel called through jax_triton", models=("geglu",)),
    )
}
DEFAULT_BASELINE = "torch-eager"


def spec(name: str) -> BackendSpec:
    """Look up a backend; an unknown name raises ``InputError`` listing the known ones."""
    check_name("backend", name, list(BACKENDS))
    return BACKENDS[name]


def register(s: BackendSpec) -> None:
    """Add a backend (later issues and tests extend the registry through this, never by editing callers)."""
    BACKENDS[s.name] = s
