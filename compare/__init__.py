"""fusion-compare's framework-agnostic core: what a script needs to run cases on backends, load results and render a
report. Importing it imports neither torch nor jax; backends load lazily through the registry.

Typical use::

    from compare import BACKENDS, Case, Shape, run_cases, render_report, load_results
    case = Case("geglu", Shape(batch=3, seq=37, dim=96, hidden=328), "bfloat16")   # x [3, 37, 96] -> y [3, 37, 96]
    doc = run_cases([case], list(BACKENDS), modes=["fwd", "fwd+bwd"])     # every registered backend
    print(render_report(doc))
    print(doc.results[0].timing.median_s, doc.results[0].parity.tier)   # "pass", "deviates" or "fail"

Everything else lives in the submodules (``compare.gate.parity``, ``compare.timing.timer``,
``compare.backends.registry``, ...).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compare.backends.registry import BACKENDS, BackendSpec, register, spec
    from compare.formats.codec import from_json, to_json
    from compare.gate.parity import Parity, TensorParity, check_all
    from compare.problem.cases import DTYPES, MODELS, MODES, PRESETS, Case, InputError, Shape, preset
    from compare.problem.golden import Golden, Problem, golden_for
    from compare.results.document import Result, Results
    from compare.timing.timer import Timing, measure

#: Where each name of the surface lives. Imported on first use (PEP 562), so ``import compare`` itself is quick and
#: ``python -m compare`` sets its signal handlers (``compare.run.stop``) before anything heavy loads.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("BACKENDS", "BackendSpec", "register", "spec"), "compare.backends.registry"),
    **dict.fromkeys(("from_json", "to_json"), "compare.formats.codec"),
    **dict.fromkeys(("Parity", "TensorParity", "check_all"), "compare.gate.parity"),
    **dict.fromkeys(
        ("DTYPES", "MODELS", "MODES", "PRESETS", "Case", "InputError", "Shape", "preset"), "compare.problem.cases"
    ),
    **dict.fromkeys(("Golden", "Problem", "golden_for"), "compare.problem.golden"),
    **dict.fromkeys(("Result", "Results"), "compare.results.document"),
    **dict.fromkeys(("Timing", "measure"), "compare.timing.timer"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'compare' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "BACKENDS",
    "DTYPES",
    "MODELS",
    "MODES",
    "PRESETS",
    "BackendSpec",
    "Case",
    "Golden",
    "InputError",
    "Parity",
    "Problem",
    "Result",
    "Results",
    "Shape",
    "TensorParity",
    "Timing",
    "check_all",
    "from_json",
    "golden_for",
    "load_results",
    "measure",
    "module_case",
    "preset",
    "register",
    "render_report",
    "run_cases",
    "spec",
    "to_json",
]


def run_cases(
    cases: Iterable[Case],
    backends: Iterable[str],
    modes: Iterable[str] = ("fwd",),
    budget_s: float = 1.0,
    ceilings: bool = False,
    profile: bool = False,
) -> Results:
    """Run each backend (by registry name) on each case in each mode: parity against the float64 golden, then
    timing through the shared timer. Returns the typed results document (:class:`~compare.results.document.Results`;
    ``to_json(doc)`` is ``results.json``'s content): one :class:`~compare.results.document.Result` per (backend, case,
    mode)
    with ``parity`` (every tensor: ``y [batch, seq, out]`` and, in ``bwd`` modes, ``dx`` and each weight gradient
    ``d<param> [out, in]``), ``timing`` (seconds per call) and ``cost``. A failing backend is an ``error`` result;
    the others still run."""
    from compare.backends.registry import spec
    from compare.run import harness
    from compare.run.options import RunOptions

    options = RunOptions(cfg=harness.TimingConfig(budget_s=budget_s), ceilings=ceilings, profile=profile)
    return harness.run(list(cases), [spec(b) for b in backends], list(modes), options)


def module_case(
    path: str | Path,
    dim: int,
    hidden: int,
    dtype: str = "float32",
    *,
    batch: int = 3,
    seq: int = 37,
    seed: int = 0,
    weights: str | Path | None = None,
    prefix: str = "",
) -> Case:
    """A user's own MLP file as a case (``--module``; the README's "Your own MLP" says what the file defines), for
    :func:`run_cases` with the backends of module files (``python -m compare list`` names them): ``x [batch, seq,
    dim]``, ``torch_module(dim, hidden)``, parameters drawn from ``seed`` or read from the safetensors file
    ``weights`` (or a sharded checkpoint's ``model.safetensors.index.json``) by ``prefix`` + ``state_dict`` name.
    Checked as the command line checks it (the file, its functions, the weights' names, shapes and dtypes, a rule in
    the plain computation for every op of its forward, the file's ``reference`` against the golden); bad input
    raises :class:`InputError` naming it (an op of the backward without a rule: when :func:`run_cases` first needs
    the gradients). Needs torch."""
    from compare.backends.registry import module_file
    from compare.problem import checkpoint
    from compare.problem.cases import MODULE_MODEL, Case, Shape
    from compare.run import preflight

    record = module_file().describe(str(path), batch, seq, dim, hidden)
    names = checkpoint.bare_names(MODULE_MODEL, record)  # a sharded checkpoint's case is identified by them
    read = checkpoint.weights(str(weights), prefix, names) if weights is not None else None
    case = Case(MODULE_MODEL, Shape(batch, seq, dim, hidden), dtype, "normal", seed, read, record)
    preflight.check_cases([case], backward=False)
    return case


def load_results(path: str | Path) -> Results:
    """A ``results.json`` (validated: an old, foreign or broken file raises :class:`InputError` naming the row and
    field), or a sweep's ``results.jsonl`` / its folder, as a typed results document."""
    from compare.results import document
    from compare.run import store

    p = Path(path)
    if p.is_dir() or p.suffix == ".jsonl":
        return store.load_sweep(p)
    return document.read_json(p)


def render_report(doc: Results) -> str:
    """The markdown report of a results document (a pure function of it: it measures nothing)."""
    from compare.report.render import render

    return render(doc)
