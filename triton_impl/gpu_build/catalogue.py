"""What the GPU build compiles: the kernel modules it is given, loaded in compiled mode, and their ``GPU_BUILD``.

Each module passed in (the compare side passes the union of the registry's ``BackendSpec.kernels``) must declare
``GPU_BUILD: tuple[BuildEntry, ...]`` (:mod:`triton_impl.gpu_build.entry`). :func:`load` imports the modules,
checks every entry against the module (the function is a compiled ``JITFunction``; the autotune list is a list of
``triton.Config``) and resolves it into a :class:`Kernel`: the function, its configs as plain dicts, its source
hash. :func:`describe` is the same as JSON, without compiling anything.

The kernels must be real ``@triton.jit`` functions, not the interpreter's: the process must run with
``FUSION_COMPARE_TRITON=compile`` and without ``TRITON_INTERPRET`` (the compare side's workers do). Without the
switch, importing a kernel module on a machine without CUDA chooses the interpreter (:func:`triton_impl.env.choose`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from triton_impl import env
from triton_impl.gpu_build.entry import DEFAULT_NUM_STAGES, DTYPES, SPECIALIZATION, BuildEntry
from triton_impl.gpu_build.sources import kernel_source_hash

__all__ = ["COMPILED_MODE_HELP", "Kernel", "describe", "load"]

COMPILED_MODE_HELP = (
    "the Triton kernels were decorated for the CPU interpreter; run with FUSION_COMPARE_TRITON=compile and "
    "TRITON_INTERPRET unset (python -m compare gpu-build does)"
)


@dataclass(frozen=True)
class Kernel:
    """One build entry resolved against its module: ``fn`` is the ``JITFunction``, ``info`` its :func:`describe`
    entry (``function``, ``module``, ``file``, ``source_hash``, ``autotune_list``, ``launches``, ``launch_args``,
    ``configs``, ``fixed``, ``enable_fp_fusion``)."""

    entry: BuildEntry
    fn: Any
    info: dict[str, Any]


def _config_dict(cfg: Any) -> dict[str, Any]:
    """A ``triton.Config`` as a plain dict: its constexprs plus num_warps/num_stages (and num_ctas/maxnreg if set)."""
    out = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if getattr(cfg, "num_ctas", 1) != 1:
        out["num_ctas"] = cfg.num_ctas
    if getattr(cfg, "maxnreg", None):
        out["maxnreg"] = cfg.maxnreg
    return out


def _configs(module: Any, entry: BuildEntry) -> list[dict[str, Any]]:
    import triton

    if entry.config is not None:
        return [{**entry.config, "num_stages": entry.config.get("num_stages", DEFAULT_NUM_STAGES)}]
    configs = getattr(module, str(entry.autotune_list), None)
    if not isinstance(configs, list) or not configs or not all(isinstance(c, triton.Config) for c in configs):
        raise TypeError(f"{module.__name__}.{entry.autotune_list} (kernel {entry.id}) is not a list of triton.Config")
    return [_config_dict(c) for c in configs]


def _file(module: Any) -> str:
    """The module's file relative to the folder on ``sys.path`` it is imported from: ``triton_impl/x.py``."""
    tail = module.__name__.replace(".", "/")
    return f"{tail}/__init__.py" if module.__file__.endswith("__init__.py") else f"{tail}.py"


def load(modules: Iterable[str]) -> dict[str, Kernel]:
    """Import ``modules`` in compiled mode and resolve their ``GPU_BUILD`` entries: {kernel id: :class:`Kernel`}.

    Raises:
        RuntimeError: the process chose Triton's interpreter (see the module docstring).
        TypeError, ValueError: a module has no ``GPU_BUILD``, an entry names something that is not a compiled
            kernel or an autotune list, or two entries share an id.
    """
    if env.choose():  # before any kernel module imports triton: the choice is this process's
        raise RuntimeError(COMPILED_MODE_HELP)
    from triton.runtime.jit import JITFunction

    out: dict[str, Kernel] = {}
    for name in dict.fromkeys(modules):  # in order, once each
        module = importlib.import_module(name)
        entries = getattr(module, "GPU_BUILD", None)
        if not isinstance(entries, tuple) or not all(isinstance(e, BuildEntry) for e in entries):
            raise TypeError(f"{name} names no GPU_BUILD tuple of BuildEntry: a kernel module declares its builds")
        for entry in entries:
            if entry.id in out:
                raise ValueError(f"kernel id {entry.id!r} is declared by {out[entry.id].info['module']} and {name}")
            fn = getattr(module, entry.function, None)
            if not isinstance(fn, JITFunction):
                raise TypeError(f"{name}.{entry.function} is a {type(fn).__name__}, not a JITFunction")
            info = {
                "function": entry.function,
                "module": name,
                "file": _file(module),
                "source_hash": kernel_source_hash(name, entry.function),
                "autotune_list": entry.autotune_list,
                "launches": list(entry.launches),
                "launch_args": {launch: dict(ints) for launch, ints in entry.launches.items()},
                "configs": _configs(module, entry),
                "fixed": dict(entry.fixed),
                "enable_fp_fusion": entry.enable_fp_fusion,
            }
            out[entry.id] = Kernel(entry, fn, info)
    return out


def describe(modules: Iterable[str]) -> dict[str, Any]:
    """The kernels of ``modules`` as this checkout defines them, without compiling anything.

    Returns ``{"triton_version", "modules": [...], "dtypes": [...], "default_num_stages", "specialization": text,
    "kernels": {id: info}}``, ``dtypes`` the ones a build may be for, ``info`` as
    :attr:`Kernel.info`; ``configs`` are the autotune list's entries as dicts (a fixed-launch kernel: its one).
    """
    import triton

    modules = list(dict.fromkeys(modules))
    kernels: Mapping[str, Kernel] = load(modules)
    return {
        "triton_version": triton.__version__,
        "modules": modules,
        "dtypes": list(DTYPES),
        "default_num_stages": DEFAULT_NUM_STAGES,
        "specialization": SPECIALIZATION,
        "kernels": {kid: k.info for kid, k in kernels.items()},
    }
