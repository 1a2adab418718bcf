"""The GPU build's plan: every (kernel, launch, config, dtype, arch) to build, each with its cache key.

Planned from the triton side's catalogue (``compare.gpu_build.bridge.describe``): for each requested arch, kernel,
launch, dtype and config, one :class:`Job`. A kernel's configs are its autotune list or its one fixed launch
(``origin`` ``autotune`` / ``fixed``), its smallest tile only with ``quick``, or the command line's
(``override``). The key (:func:`job_key`) is a sha256 of everything the compile depends on: the builder's version,
the Triton version, the kernel's function and source hash, the launch and its integer arguments, the config, the
constexprs every launch passes, the dtype, the arch and ``enable_fp_fusion``; a kernel edit, a new config or
another Triton is a new key, so a cached build is never stale.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compare.problem.cases import InputError
from compare.results.gpu_build import ARCHS, config_label

__all__ = ["BUILDER_VERSION", "Job", "job_key", "plan"]

#: Bumped whenever a build record's content changes for the same compile: part of every cache key.
BUILDER_VERSION = 2


@dataclass(frozen=True)
class Job:
    """One build to do: ``kernel_id``'s ``function`` at ``launch`` with ``config`` in ``dtype`` for ``arch``."""

    key: str
    kernel_id: str
    function: str
    launch: str
    config: dict[str, Any]
    origin: str
    dtype: str
    arch: str

    def for_worker(self) -> dict[str, Any]:
        """The job as the triton side's worker reads it (``triton_impl.gpu_build.compiler.build``)."""
        return {
            "key": self.key,
            "kernel_id": self.kernel_id,
            "launch": self.launch,
            "config": self.config,
            "dtype": self.dtype,
            "capability": ARCHS[self.arch].capability,
        }

    def label(self) -> str:
        """``sm_90 _matmul_kernel [x @ W^T] 128x128x64 w8 s4 bfloat16``: the job in progress lines and errors."""
        return f"{self.arch} {self.function} [{self.launch}] {config_label(self.config)} {self.dtype}"

    def cost(self) -> float:
        """Rough relative compile cost, for spreading jobs over workers: fp32 GEMMs spill and take longest."""
        block = math.prod(v for k, v in self.config.items() if k.startswith("BLOCK"))
        return (4.0 if self.dtype == "float32" else 1.0) * max(block, 1) ** 0.5


def job_key(kernel: Mapping[str, Any], launch: str, config: Mapping[str, Any], origin: str, dtype: str, arch: str,
            triton_version: str) -> str:  # fmt: skip
    """The cache key (32 hex digits) of one build of ``kernel`` (its catalogue entry); see the module docstring."""
    payload = {
        "builder": BUILDER_VERSION,
        "triton": triton_version,
        "function": kernel["function"],
        "source_hash": kernel["source_hash"],
        "launch": launch,
        "launch_args": kernel["launch_args"][launch],
        "config": dict(config),
        "origin": origin,
        "fixed": kernel["fixed"],
        "dtype": dtype,
        "arch": arch,
        "fp_fusion": kernel["enable_fp_fusion"],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _smallest(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The config with the smallest tile (product of its ``BLOCK*`` constants): the cheapest to compile."""
    return min(configs, key=lambda c: math.prod(v for k, v in c.items() if "BLOCK" in k))


def _check(what: str, asked: Sequence[str], known: Sequence[str]) -> None:
    unknown = [x for x in asked if x not in known]
    if unknown:
        raise InputError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")


def plan(
    catalogue: Mapping[str, Any],
    archs: Sequence[str],
    kernel_ids: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    quick: bool = False,
    overrides: Mapping[str, list[dict[str, Any]]] | None = None,
) -> list[Job]:
    """Every job of the build, in table order: by arch, kernel (catalogue order), launch, dtype, config.

    Args:
        catalogue: the triton side's ``describe`` document.
        archs: keys of :data:`compare.results.gpu_build.ARCHS`.
        kernel_ids: the kernels to build (default: all of the catalogue).
        dtypes: the dtypes (default: all the catalogue offers).
        quick: one config per kernel (its smallest tile) instead of the whole autotune list.
        overrides: {kernel id: [config dict, ...]} replacing a kernel's configs (origin ``override``); each has
            ``num_warps`` and may leave ``num_stages`` out.

    Raises:
        InputError: an unknown arch, kernel or dtype.
    """
    kernels: Mapping[str, Any] = catalogue["kernels"]
    overrides = overrides or {}
    _check("arch", archs, list(ARCHS))
    _check("kernel", [*(kernel_ids or []), *overrides], list(kernels))
    _check("dtype", dtypes or [], catalogue["dtypes"])
    jobs = []
    for arch in archs:
        for kid in kernel_ids or kernels:
            kernel = kernels[kid]
            if kid in overrides:  # a config without num_stages gets Triton's default, as a launch would
                stages = catalogue["default_num_stages"]
                configs = [({**c, "num_stages": c.get("num_stages", stages)}, "override") for c in overrides[kid]]
            else:
                origin = "fixed" if kernel["autotune_list"] is None else "autotune"
                configs = [(c, origin) for c in ([_smallest(kernel["configs"])] if quick else kernel["configs"])]
            for launch in kernel["launches"]:
                for dtype in dtypes or catalogue["dtypes"]:
                    for config, origin in configs:
                        key = job_key(kernel, launch, config, origin, dtype, arch, catalogue["triton_version"])
                        jobs.append(Job(key, kid, kernel["function"], launch, dict(config), origin, dtype, arch))
    return jobs
