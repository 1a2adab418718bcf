"""The interpreted backends' parity, kept on disk: a rerun on the same code reuses it instead of interpreting again.

A backend whose ``availability().timed`` is False runs in an interpreter (Triton's ``TRITON_INTERPRET=1``, Pallas's
``interpret=True``): parity only, and its steps cost seconds where a compiled one costs milliseconds (on ``cpu-mlp``
each interpreted cell runs three steps: the first call, the profile and the step on fresh inputs). The interpreter is
exact and deterministic, so the cell's result is a function of what the key holds:

- the backend's registry line, the case (model, dtype, shape, distribution, seed) and the mode;
- the source of every module that can change the answer or the record (``compare/`` whole, the backend's framework
  package and ``triton_impl/``): a changed kernel, launcher, gate or record misses the cache;
- the versions of Python and of the numerical packages (``compare.results.environment.versions``), the CPU model and
  its instruction sets, and the variables that pick other kernels or another mode (:data:`ENV_VARS`): numpy's BLAS
  computes the interpreter's dots, and its bits follow the CPU and ``OPENBLAS_CORETYPE``.

An entry is the result as ``results.json`` holds it, less its trace path (the trace was written into the earlier run's
folder), under the data cache's folder (``compare.problem.datacache``: ``FUSION_COMPARE_CACHE=off`` turns it off,
and ``--no-parity-cache`` skips it for a run). A reused row says so (``extras["parity_cache"]``: when it was made and
its key), and the report names those rows. Only a finished verdict is kept (``ok``, ``deviates``, ``parity-fail``):
an error may be transient. What it cannot see: a change outside the hashed sources and versions (a system library
under numpy, say) reuses a stale entry; the verdict on fresh inputs is the one of the run that made the entry, on that
run's seed (the same code on another seed was not run again).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from compare.backends.registry import BackendSpec
from compare.formats.codec import FieldError, from_json, to_json
from compare.problem import datacache
from compare.problem.cases import Case
from compare.results import environment
from compare.results.document import Result

#: Variables that choose other kernels (and bits) or another execution mode.
ENV_VARS: tuple[str, ...] = (
    "TRITON_INTERPRET",
    "OPENBLAS_CORETYPE",
    "XLA_FLAGS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_CBWR",
    "JAX_PLATFORMS",
)
#: Statuses worth keeping: a verdict. An error or a skip is not cached.
KEPT: frozenset[str] = frozenset({"ok", "deviates", "parity-fail"})
_KIND = "interpreted-parity"


def key(spec: BackendSpec, case: Case, mode: str) -> str:
    """The cache entry's name for one interpreted cell (module docstring: what it holds)."""
    what = {
        "backend": to_json(spec),
        "case": to_json(case),
        "mode": mode,
        "source": datacache.source_digest(["compare", "triton_impl"]),
        "package": _package_digest(spec.target.split(".")[0]),
        "versions": environment.versions(),
        "cpu": environment.cpu_model(),
        "isa": list(environment.cpu_isa() or ()),
        "env": {k: os.environ.get(k, "") for k in ENV_VARS},
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]
    return f"{_KIND}-{spec.name}-{digest}"


def _package_digest(package: str) -> str:
    """A sha256 of every ``.py`` file of the backend's top package, wherever it was imported from (a framework
    package of this project, a test's, an extension's outside it)."""
    module = importlib.import_module(package)
    roots = [Path(p) for p in getattr(module, "__path__", [])] or [Path(str(module.__file__)).parent]
    h = hashlib.sha256()
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def lookup(spec: BackendSpec, case: Case, mode: str) -> Result | None:
    """The cached result of the cell, marked as reused (``extras["parity_cache"]``); None on a miss (the cache off,
    no entry, or one that does not read as a result of this cell)."""
    name = key(spec, case, mode)
    doc = datacache.load_json(name)
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
        return None
    try:
        r = from_json(Result, doc["result"])
    except (FieldError, TypeError, ValueError):  # an entry of another layout: a miss
        return None
    if (r.backend, r.case, r.mode) != (spec.name, case.name, mode) or r.status not in KEPT:
        return None
    made = doc.get("created") if isinstance(doc.get("created"), str) else "?"
    return replace(r, extras={**r.extras, "parity_cache": {"created": made, "key": name}})


def save(spec: BackendSpec, case: Case, mode: str, result: Result) -> None:
    """Keep ``result`` (a verdict of this very run, not a reused one) for later runs."""
    if result.status not in KEPT or "parity_cache" in result.extras:
        return
    kernels = result.kernels if result.kernels is None else replace(result.kernels, trace=None)
    doc: dict[str, Any] = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "result": to_json(replace(result, kernels=kernels)),
    }
    datacache.save_json(key(spec, case, mode), doc)
