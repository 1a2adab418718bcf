"""The options the commands share (a case: preset, model and sizes; the grid: dtypes, backends, modes, seed,
sampling and time budgets, how much to print), their checks, and the inputs every measuring command refuses at the door
(:func:`check_inputs`), before anything is measured or written."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compare.backends.registry import BACKENDS, module_file, spec
from compare.cost.comm import check_world_size_value
from compare.gate.parity import check_judgeable, judged_shapes
from compare.problem import checkpoint
from compare.problem.cases import (
    DTYPES,
    MODELS,
    MODES,
    MODULE_MODEL,
    MOE_MODELS,
    PRESETS,
    Case,
    InputError,
    ModuleFile,
    Shape,
    Weights,
    check_finite,
    check_name,
    check_seed,
    check_unique,
    is_moe,
    preset,
    resolve_shape,
)
from compare.problem.moe import ROUTINGS
from compare.run import exitcodes, preflight
from compare.run.cell import MODE_TENSORS
from compare.run.tp_hosts import check_addr, check_port
from compare.timing.llc import CACHE_MODES


def sub(subparsers: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
    """A subcommand's parser, its help ending with the exit statuses (``compare.run.exitcodes.EPILOG``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        name, epilog=exitcodes.EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
    )
    return p


def add_case_args(r: argparse.ArgumentParser) -> None:
    """The case options: a preset, its model and sizes."""
    r.add_argument("--preset", help=f"one of: {', '.join(PRESETS)}")
    r.add_argument("--model", help=f"one of: {', '.join(MODELS + MOE_MODELS)} (default: the preset's)")
    for dim in ("batch", "seq", "dim", "hidden"):
        r.add_argument(f"--{dim}", type=int, help=f"override the preset's {dim}")
    r.add_argument(
        "--routing",
        nargs="+",
        metavar="ROUTING",
        help=f"a mixture-of-experts case's routing distribution, one case each: {', '.join(ROUTINGS)} (default: "
        "uniform; docs/moe.md)",
    )
    add_module_args(r)
    add_weights_args(r)


#: The batch and sequence length of a ``--module`` case given neither nor a preset: the ``tiny`` preset's.
MODULE_TOKENS = (PRESETS["tiny"].shape.batch, PRESETS["tiny"].shape.seq)


def add_module_args(r: argparse.ArgumentParser) -> None:
    """``--module FILE.py``: a user's own MLP as the case's model."""
    r.add_argument(
        "--module",
        metavar="FILE.py",
        help="your own MLP as the case: a Python file defining torch_module(dim, hidden) -> torch.nn.Module and "
        "jax_function(params, x) -> y (params: a dict named and shaped as the module's state_dict), optionally "
        "reference(params, x) -> y in numpy float64; sizes from --dim and --hidden (or a --preset), --batch and "
        f"--seq default to {MODULE_TOKENS[0]} and {MODULE_TOKENS[1]}; no --model",
    )


def module_from_args(a: argparse.Namespace, shape: Shape) -> ModuleFile | None:
    """The :class:`~compare.problem.cases.ModuleFile` of ``--module`` at ``shape`` (the file loaded, checked and
    hashed, its module built and run once: the registry's ``module-file`` probe), or None without ``--module``."""
    path = getattr(a, "module", None)
    if path is None:
        return None
    if not path.strip():
        raise InputError("--module must name a Python file, got an empty path")
    try:
        probe = module_file()
    except ImportError as exc:
        raise InputError(f"--module needs torch to read its file, and it cannot be imported: {exc}") from exc
    record: ModuleFile = probe.describe(path, shape.batch, shape.seq, shape.dim, shape.hidden)
    return record


def add_weights_args(r: argparse.ArgumentParser) -> None:
    """``--weights FILE``, ``--prefix P`` and ``--layers L``: the case's parameters from a safetensors checkpoint, one
    case per layer with ``--layers``."""
    names = "; ".join(f"{m}: {', '.join(checkpoint.expected_names(m))}" for m in MODELS)
    names += "; a MoE block's router and experts.{e}.gate_proj/up_proj/down_proj (Mixtral: w1/w3/w2) per expert, or "
    names += "transformers' fused experts.gate_up_proj and experts.down_proj (docs/moe.md)"
    r.add_argument(
        "--weights",
        metavar="FILE",
        help="read the case's parameters from this safetensors checkpoint (one .safetensors file, or a sharded "
        f"one's model.safetensors.index.json), by their Hugging Face names ({names}; GPT-2's c_fc/c_proj weights "
        "transposed, as its Conv1D stores them) instead of drawing them; the inputs are drawn from the seed as "
        "always. BF16 or F16 weights serve a float32 case, widened exactly",
    )
    r.add_argument(
        "--prefix",
        default="",
        help="with --weights: put before each name, e.g. model.layers.0.mlp.; with --layers a template with {i} "
        "where the layer index goes, e.g. model.layers.{i}.mlp. (default: none)",
    )
    r.add_argument(
        "--layers",
        metavar="LAYERS",
        help="with --weights and a --prefix template: one case per layer, each with its own golden: all (every "
        "layer the checkpoint holds), a range 0-3, or a list 0,5,7",
    )


def weights_from_args(a: argparse.Namespace, model: str, module: ModuleFile | None = None) -> list[Weights]:
    """The :class:`~compare.problem.cases.Weights` of ``--weights``/``--prefix``/``--layers`` for a case of ``model``
    (and ``module``: its names): one (the checkpoint made absolute, checked and hashed), one per layer with
    ``--layers`` (``compare.problem.checkpoint.layer_weights``), none without ``--weights``. ``--prefix`` or
    ``--layers`` alone is refused, and so is a template (``{i}``) without ``--layers`` or ``--layers`` without one."""
    path, prefix = getattr(a, "weights", None), getattr(a, "prefix", "") or ""
    layers = getattr(a, "layers", None)
    if path is None:
        if prefix:
            raise InputError(f"--prefix {prefix!r} needs --weights (the checkpoint its names are looked up in)")
        if layers is not None:
            raise InputError(f"--layers {layers} needs --weights (the checkpoint its layers are read from)")
        return []
    if not path.strip():
        raise InputError("--weights must name a safetensors file, got an empty path")
    present: list[str] = []
    if is_moe(model):  # which of its block's layouts the checkpoint holds (checkpoint.pick)
        with checkpoint.Checkpoint(str(Path(path).expanduser().resolve())) as ck:
            present = ck.names()
    names = checkpoint.bare_names(model, module, present)
    if layers is None:
        if checkpoint.LAYER in prefix:
            raise InputError(
                f"--prefix {prefix!r} is a layer template ({checkpoint.LAYER}): give --layers (all, a range like 0-3 "
                "or a list like 0,5,7) to say which layers, or a prefix without it"
            )
        return [checkpoint.weights(path, prefix, names)]
    return checkpoint.layer_weights(path, prefix, layers, names)


def resolve_case(a: argparse.Namespace, own_sizes: bool = True) -> tuple[str, Shape, str]:
    """``--preset``, ``--model`` and the sizes (``run``, ``profile``, ``prepare``, ``tp-job``, ``sweep``): the model,
    the shape and the input distribution. Without a preset every size must be given; a command whose batch and
    sequence come from elsewhere (``sweep``: its token counts; ``own_sizes`` False) gives ``--dim`` and ``--hidden``
    only (the shape's batch and seq are then 1). Bad input raises InputError."""
    base = preset(a.preset) if a.preset else None
    if getattr(a, "module", None) is not None:
        if a.model:
            raise InputError(f"--module is the case's model: give no --model with it (got --model {a.model})")
        model: str | None = MODULE_MODEL
    else:
        model = check_name("model", a.model, MODELS + MOE_MODELS) if a.model else (base.model if base else None)
    if model is None:
        known = ", ".join(MODELS + MOE_MODELS)
        raise InputError(f"give --preset or --model (or --module FILE.py); known models: {known}")
    batch, seq = (a.batch, a.seq) if own_sizes else (1, 1)
    if model == MODULE_MODEL and base is None:
        batch, seq = (MODULE_TOKENS[0] if batch is None else batch), (MODULE_TOKENS[1] if seq is None else seq)
    shape = resolve_shape(base.shape if base else None, batch, seq, a.dim, a.hidden)
    return model, shape, base.dist if base else "normal"


def cases_from_args(a: argparse.Namespace) -> list[Case]:
    """The cases of ``run``, ``profile``, ``prepare`` and ``tp-job``: one per ``--dtype`` at the resolved shape (and
    per layer of ``--layers``, layer by layer), with the ``--weights`` checkpoint's parameters where one is given
    (each checked against the case: name, shape, dtype) and the ``--module`` file's MLP (its record, made on shapes
    alone: :func:`check_cases` checks its values, after the memory check)."""
    model, shape, dist = resolve_case(a)
    dtypes = check_unique("dtype", [check_name("dtype", d, DTYPES) for d in a.dtype])
    module = module_from_args(a, shape)
    seed = check_seed(a.seed)
    layers: list[Weights | None] = [*weights_from_args(a, model, module)] or [None]
    routings = routings_from_args(a, model)
    return [Case(model, shape, d, dist, seed, w, module, r) for w in layers for r in routings for d in dtypes]


def routings_from_args(a: argparse.Namespace, model: str) -> list[str | None]:
    """The ``--routing`` distributions of a case of ``model`` as ``Case.routing`` values (``uniform`` is None),
    each once; a steered one refused for a model without a router."""
    names = check_unique("routing", [check_name("routing", r, ROUTINGS) for r in getattr(a, "routing", None) or []])
    if set(names) - {ROUTINGS[0]} and not is_moe(model):
        raise InputError(f"--routing {' '.join(names)}: a {model} case has no router (a mixture-of-experts case's)")
    return [None if r == ROUTINGS[0] else r for r in names] or [None]


def check_cases(a: argparse.Namespace, cases: list[Case]) -> None:
    """``compare.run.preflight.check_cases`` of ``cases`` with the modes of ``a``: run after the memory check."""
    preflight.check_cases(cases, backward=any(m != "fwd" for m in getattr(a, "mode", None) or ["fwd+bwd"]))


def add_cell_args(p: argparse.ArgumentParser, budget_help: str) -> None:
    """Dtypes, backends, modes, seed and the sampling budget (``--budget``): the options of every command that
    measures cells (``run``, ``profile``, ``sweep``, ``tp-job``, ``ab``)."""
    p.add_argument("--dtype", nargs="+", default=["float32"], help=f"any of: {', '.join(DTYPES)}")
    # resolved by check_grid_args from the registry as it is then (a backend registered by a test is seen)
    p.add_argument(
        "--backend",
        nargs="+",
        default=None,
        help=f"any of: {', '.join(BACKENDS)} (default: every single-device backend, those of a module file with "
        "--module, or every tensor-parallel one when a --world-size above 1 is given)",
    )
    p.add_argument("--mode", nargs="+", default=["fwd"], help=f"any of: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the golden data (a non-negative integer)")
    p.add_argument("--budget", type=float, default=1.0, help=budget_help)


def add_grid_args(p: argparse.ArgumentParser, budget_help: str, cache_default: str = "both") -> None:
    """:func:`add_cell_args` and the command's time budget (``--time-budget``), the cache state, the parity cache,
    ``--strict`` and how much to print: the options shared by ``run``, ``profile`` and ``sweep``."""
    add_cell_args(p, budget_help)
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds the whole command keeps: the ceilings, the timed samples and the compile-cost sweep share them, "
        "and every cut is stated in the report (parity is never cut; default: no budget)",
    )
    p.add_argument(
        "--cache",
        default=cache_default,
        help=f"cache state of the timings: {', '.join(CACHE_MODES)} (cold: each call after a flush of the "
        "last-level cache, its time left out; default: %(default)s)",
    )
    p.add_argument(
        "--no-parity-cache",
        action="store_true",
        help="interpret the interpreted (parity-only) backends again instead of reusing their cached verdicts",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on a parity deviation too (a real difference an honest implementation can have), not only on a "
        "failure",
    )
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true", help="print only problems (failed cells) and the result")
    talk.add_argument("--verbose", action="store_true", help="print every cell as it starts and every message")


def check_grid_args(a: argparse.Namespace) -> None:
    """The options :func:`add_grid_args` defines, checked before anything runs (bad input raises InputError)."""
    check_seed(a.seed)
    check_finite("--budget", a.budget)
    if a.time_budget is not None:
        check_finite("--time-budget", a.time_budget)
    check_name("--cache", a.cache, list(CACHE_MODES))
    _check_cells(a)


def check_cell_args(a: argparse.Namespace) -> None:
    """The options :func:`add_cell_args` defines (bad input raises InputError); no ``--backend``: the default ones."""
    check_seed(a.seed)
    check_finite("--budget", a.budget)
    _check_cells(a)


def _check_cells(a: argparse.Namespace) -> None:
    if a.backend is None:
        sizes = getattr(a, "world_size", None) or [1]
        model = MODULE_MODEL if getattr(a, "module", None) is not None else None
        if model is None and getattr(a, "model", None) in MOE_MODELS:
            model = a.model
        elif model is None and getattr(a, "model", None) is None and getattr(a, "preset", None) in PRESETS:
            model = PRESETS[a.preset].model  # a MoE preset's own backends (a dense one's: every dense backend)
        a.backend = default_backends(sizes if isinstance(sizes, list) else [sizes], model)
        if not a.backend:
            raise InputError(
                f"no tensor-parallel backend runs a {model} case (--world-size above 1); the {model} backends run at "
                "world size 1"
            )
    for b in a.backend:
        spec(b)
    check_unique("backend", a.backend)
    check_unique("dtype", [check_name("dtype", d, DTYPES) for d in a.dtype])
    check_unique("mode", [check_name("mode", m, MODES) for m in a.mode])


def progress_level(a: argparse.Namespace) -> str:
    """``quiet``, ``normal`` or ``verbose`` (``compare.run.progress.LEVELS``) from ``--quiet`` / ``--verbose``."""
    return "quiet" if getattr(a, "quiet", False) else "verbose" if getattr(a, "verbose", False) else "normal"


def default_backends(world_sizes: list[int], model: str | None = None) -> list[str]:
    """Every single-device backend, or, when a world size above 1 is asked for, every tensor-parallel one: those of
    a module file (model ``module``, a ``--module`` run's), those of a mixture-of-experts model (``MOE_MODELS``: the
    backends that implement it) or those of the built-in dense models, not two of them."""
    parallel, module = max(world_sizes) > 1, model == MODULE_MODEL
    if model is not None and is_moe(model):
        return [name for name, s in BACKENDS.items() if bool(s.runtime) == parallel and model in s.models]
    return [
        name
        for name, s in BACKENDS.items()
        if bool(s.runtime) == parallel and (MODULE_MODEL in s.models) == module and not any(is_moe(m) for m in s.models)
    ]


def check_out(value: str, option: str = "--out") -> str:
    """Return ``value`` if it names a path; an empty (or blank) one raises InputError: ``Path("")`` is the current
    folder, so it would silently write there. The current folder, wanted, is ``.``."""
    if not value.strip():
        raise InputError(
            f"{option} must be a non-empty path, got {value!r}: an empty one names no file or folder (the current "
            "folder is .)"
        )
    return value


def out_arg(value: str) -> str:
    """:func:`check_out` as an ``argparse`` ``type=`` (argparse prints an ArgumentTypeError's message as it is)."""
    try:
        return check_out(value)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def check_cases_judgeable(cases: Iterable[Case], modes: Iterable[str]) -> None:
    """Every case big enough for the parity gate in every mode: each tensor that one of ``modes`` checks
    (``compare.run.cell.MODE_TENSORS``) holds the gate's minimum (``compare.gate.parity.check_judgeable``)."""
    modes = [check_name("mode", m, MODES) for m in modes]
    for c in cases:
        check_judgeable(c, [k for k in judged_shapes(c) if any(MODE_TENSORS[m](k) for m in modes)])


def check_inputs(a: argparse.Namespace, cases: Iterable[Case]) -> None:
    """What ``run``, ``profile``, ``tp-job`` and ``sweep`` refuse before anything is measured or written (after
    :func:`check_grid_args`; bad input raises InputError): a ``--world-size`` below 1 (where the command has one), an
    empty ``--out``, a case too small for the parity gate in one of ``--mode``, and (``tp-job``) a rendezvous
    ``--addr`` that is no host or a ``--port`` that is no TCP port (``compare.run.tp_hosts``)."""
    sizes = getattr(a, "world_size", None)
    for w in sizes if isinstance(sizes, list) else [] if sizes is None else [sizes]:
        check_world_size_value(w, "--world-size")
    check_out(a.out, "--out")
    check_cases_judgeable(cases, a.mode)
    if getattr(a, "addr", None) is not None:
        check_addr(a.addr)
        check_port(a.port)
