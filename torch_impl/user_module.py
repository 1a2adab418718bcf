"""A user's own MLP from a Python file (``python -m compare run --module FILE.py``): loading and checking the file,
its module at the case's widths, and the computations of a module case (``compare.problem.cases.ModuleFile``).

The file defines

- ``torch_module(dim, hidden) -> torch.nn.Module``: its ``state_dict()`` names and shapes are the case's
  parameters (every entry a floating parameter: no buffers, no tied weights); it maps ``x [batch, seq, dim]`` to
  ``y [batch, seq, out]``, each token's output a function of that token alone (the harness judges reordered tokens);
- ``jax_function(params, x) -> y``: the same MLP as a pure JAX function of a dict with the same names and shapes
  (``jax.Array``\\ s of the case dtype) and ``x``;
- optionally ``reference(params, x) -> y`` in numpy float64: checked once against the golden reference
  (:func:`check_reference`).

The core (``compare/``) reaches this module only through the registry's ``module-file`` probe
(``compare.backends.registry.PROBES``): :func:`describe` makes the case's record, :func:`reference` its float64
golden (``Arith.exact()`` with float64 activations: the bits of ``torch_impl.plain``'s fixed arithmetic, the same on
every machine), :func:`plain_run` the gate's yardstick (``plain.plain_run_module``) and :func:`compute` any other
arithmetic (the gate's resolution twin, the fresh draws' range screen), :func:`matmul_flops` the GEMM FLOPs its
timing is held to against the ceilings, :func:`check_plain` that the plain computation has a rule for every op the
module dispatches (before anything is measured). Every refusal is an :class:`~compare.problem.cases.InputError`
naming the file (the CLI exits 2 with its one line): an op without a rule (``plain.UnsupportedOp``) included,
wherever it is met.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from compare.problem.cases import Case, FileChanged, InputError, ModuleFile
from compare.problem.golden import make_problem
from compare.problem.reference import TRANSCENDENTAL_ERROR_ULPS, Activations, Arith, round_to_dtype
from compare.run import stop
from torch_impl.device import TORCH_DTYPES
from torch_impl.models import canonical_params
from torch_impl.plain import UnsupportedOp, plain_compute, plain_run_module
from torch_impl.plain_acts import NoActivation, acts_envelope, acts_plain, acts_signature

__all__ = [
    "REQUIRED",
    "ModuleChanged",
    "build",
    "check_module",
    "check_plain",
    "check_reference",
    "compute",
    "describe",
    "jax_function",
    "load",
    "matmul_flops",
    "plain_run",
    "reference",
]

#: What a module file must define, and how each is called.
REQUIRED: dict[str, str] = {
    "torch_module": "torch_module(dim, hidden) -> torch.nn.Module",
    "jax_function": "jax_function(params, x) -> y (params: a dict of jax.Arrays named and shaped as the module's "
    "state_dict)",
}
#: Relative difference (of the largest |y|) beyond which a file's ``reference`` and its module disagree.
REFERENCE_RTOL = 1e-10
#: Tokens of the case's inputs the ``reference`` check runs on, and of the inputs :func:`check_plain` draws.
REFERENCE_TOKENS = 8
#: The widest ``(dim, hidden)`` :func:`check_plain` builds a module at (``tiny``'s).
CHECK_WIDTHS = (96, 328)
#: Where :func:`matmul_flops` counts, in order: on shapes alone (``meta`` tensors: nothing allocated, nothing
#: computed), then, for a module that cannot run on them (it reads a value back, or calls a kernel of its own), one
#: real step on the CPU in float32.
COUNT_ON: tuple[str, ...] = ("meta", "cpu")
#: The ``torch.utils.flop_counter`` ops a matmul ceiling bounds: GEMMs, ``2 * m * n * k`` FLOPs each. Not its
#: convolutions: a Winograd or FFT convolution does fewer multiplications than the direct ones it is counted at.
GEMM_OPS: frozenset[str] = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})


class ModuleChanged(FileChanged):
    """A module file no longer has the sha256 its case was made with (edited since the run started)."""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


#: Loaded files by (path, sha256): each is executed once per process.
_LOADED: dict[tuple[str, str], types.ModuleType] = {}


def _read(path: str) -> bytes:
    p = Path(path)
    if not p.exists():
        raise InputError(f"--module {path}: no such file")
    if not p.is_file():
        raise InputError(f"--module {path} is not a file (a module file is one Python file)")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise InputError(f"--module {path} cannot be read: {exc.strerror or exc}") from exc


def _execute(path: str, source: bytes, digest: str) -> types.ModuleType:
    """The file's module, executed from the bytes that were hashed (a file edited meanwhile runs as hashed)."""
    got = _LOADED.get((path, digest))
    if got is not None:
        return got
    name = f"fusion_compare_module_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise InputError(f"--module {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and typing look a module up by name
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except stop.CODE_ERRORS as exc:  # sys.exit() at import too: the file's failure, never the tool's status
        stop.reraise_stop(exc)
        sys.modules.pop(name, None)
        raise InputError(f"--module {path} fails to import: {_one_line(exc)}") from exc
    missing = [f for f in REQUIRED if not callable(getattr(module, f, None))]
    if missing:
        sys.modules.pop(name, None)
        raise InputError(
            f"--module {path} defines no {' and no '.join(missing)}; a module file must define "
            + " and ".join(REQUIRED.values())
            + ", and may define reference(params, x) -> y in numpy float64"
        )
    if getattr(module, "reference", None) is not None and not callable(module.reference):
        raise InputError(f"--module {path}: its reference is not a function (reference(params, x) -> y)")
    _LOADED[(path, digest)] = module
    return module


def load(mf: ModuleFile) -> types.ModuleType:
    """The file of ``mf`` executed (once per process), after checking its sha256: a file changed since the case was
    made is :class:`ModuleChanged`, naming it and both hashes."""
    source = _read(mf.path)
    digest = hashlib.sha256(source).hexdigest()
    if digest != mf.sha256:
        raise ModuleChanged(
            f"module file {mf.path} changed since the run started: its sha256 is now {digest}, the case was made "
            f"from {mf.sha256}"
        )
    return _execute(mf.path, source, digest)


def _instantiate(user: types.ModuleType, path: str, dim: int, hidden: int) -> nn.Module:
    try:
        module = user.torch_module(dim, hidden)
    except stop.CODE_ERRORS as exc:
        stop.reraise_stop(exc)
        raise InputError(f"--module {path}: torch_module({dim}, {hidden}) fails: {_one_line(exc)}") from exc
    if not isinstance(module, nn.Module):
        raise InputError(
            f"--module {path}: torch_module({dim}, {hidden}) returned a {type(module).__name__}, not a torch.nn.Module"
        )
    return module


def _params(module: nn.Module, path: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The module's ``state_dict`` names and shapes, each entry checked to be a floating parameter of its own."""
    state = module.state_dict(keep_vars=True)
    named = dict(module.named_parameters(remove_duplicate=False))
    buffers = [k for k in state if k not in named]
    if buffers:
        raise InputError(
            f"--module {path}: its state_dict holds buffers ({', '.join(buffers)}); a module case's state_dict is "
            "its parameters only (register constants as plain attributes)"
        )
    seen: dict[int, str] = {}
    for k, p in state.items():
        if not p.is_floating_point():
            raise InputError(f"--module {path}: parameter {k} is {p.dtype}; parameters must be floating point")
        if id(p) in seen:
            raise InputError(f"--module {path}: parameters {seen[id(p)]} and {k} are one tensor (tied weights)")
        seen[id(p)] = k
    if not state:
        raise InputError(f"--module {path}: torch_module returned a module without parameters")
    return tuple((k, tuple(int(d) for d in p.shape)) for k, p in state.items())


def describe(path: str, batch: int, seq: int, dim: int, hidden: int) -> ModuleFile:
    """The record of ``--module path`` at these sizes: the file made absolute, hashed and loaded (its functions
    checked), its ``torch_module(dim, hidden)``'s parameters, and its output width from one forward of an input
    ``[batch, seq, dim]`` (a forward that fails there, or returns anything but one ``[batch, seq, out]`` tensor of
    the input's type, is refused). Built on the ``meta`` device (shapes, no memory: the memory check runs on this
    record before any module is built, :func:`check_module` then checks its values); a module that cannot be built
    or run there (a forward that reads a value: ``.item()``), or that is refused there, is built for real, whose
    refusal is the one said."""
    absolute = str(Path(path).expanduser().resolve())
    source = _read(absolute)
    digest = hashlib.sha256(source).hexdigest()
    user = _execute(absolute, source, digest)
    try:
        with torch.device("meta"):
            module = _instantiate(user, absolute, dim, hidden).to(torch.float32)
            params = _params(module, absolute)
            y = _forward(module, torch.empty(batch, seq, dim), absolute)
    except (
        stop.CODE_ERRORS
    ) as exc:  # a module that cannot be built or run on the meta device (or a refusal): again for real
        stop.reraise_stop(exc)
        module = _instantiate(user, absolute, dim, hidden).to(torch.float32)
        params = _params(module, absolute)
        y = _forward(module, torch.zeros(batch, seq, dim), absolute)
    return ModuleFile(absolute, digest, params, int(y.shape[-1]))


def _forward(module: nn.Module, x: torch.Tensor, path: str) -> torch.Tensor:
    """``module(x)`` (float32), refused unless it is one ``[batch, seq, out]`` tensor of ``x``'s type."""
    batch, seq, dim = x.shape
    try:
        with torch.no_grad():
            y = module.eval()(x)
    except stop.CODE_ERRORS as exc:
        stop.reraise_stop(exc)
        raise InputError(
            f"--module {path}: its forward fails on an input [{batch}, {seq}, {dim}]: {_one_line(exc)}"
        ) from exc
    if not isinstance(y, torch.Tensor) or y.ndim != 3 or tuple(y.shape[:2]) != (batch, seq):
        got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise InputError(
            f"--module {path}: its forward maps [{batch}, {seq}, {dim}] to {got}; it must return one tensor "
            f"[{batch}, {seq}, out]"
        )
    if y.dtype != x.dtype:
        raise InputError(f"--module {path}: its forward returns {y.dtype} for a float32 input (a cast inside)")
    return y


def check_module(case: Case) -> None:
    """The checks of a module case's values, run after the memory check (``compare.run.preflight.check_cases``): its
    module built for real, one float32 forward of the case's shape (as :func:`describe`'s) and each token's output
    depending on that token alone (:func:`_check_tokens_apart`)."""
    mf = _module_file(case)
    module = _instantiate(load(mf), mf.path, case.shape.dim, case.shape.hidden).to(torch.float32)
    x = torch.randn(case.shape.batch, case.shape.seq, case.shape.dim, generator=torch.Generator().manual_seed(0))
    _forward(module, x, mf.path)
    _check_tokens_apart(module, x, mf.path)


def _check_tokens_apart(module: nn.Module, x: torch.Tensor, path: str) -> None:
    """Refuse a module whose output for one token depends on other tokens (attention, a mean over the sequence):
    the harness judges calls on reordered tokens. In float64, the reordered input's output must be the reordered
    output to 1e-9 of its largest value (a GEMM's blocking may move the last bits; mixing moves whole units)."""
    m64, x64 = module.to(torch.float64), x.to(torch.float64)
    b, s, d = x64.shape
    order = torch.randperm(b * s, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = m64(x64).reshape(b * s, -1)
        y_moved = m64(x64.reshape(b * s, d)[order].reshape(b, s, d)).reshape(b * s, -1)
    module.to(torch.float32)
    bad = (~torch.isfinite(y)).nonzero()
    if len(bad):  # no order can be compared: the reason is the value (it was "depends on other tokens by nan")
        raise InputError(
            f"--module {path}: its forward returns {len(bad)} NaN or infinite values of {y.numel()} on a standard "
            f"normal input [{b}, {s}, {d}] in float64, the first at token {int(bad[0, 0])}, column {int(bad[0, 1])}"
        )
    off = float((y_moved - y[order]).abs().max()) / max(float(y.abs().max()), 1e-300)
    if not off <= 1e-9:
        raise InputError(
            f"--module {path}: a token's output depends on other tokens (the output of a reordered input differs "
            f"from the reordered output by {off:.2g} of its largest value); the harness judges calls on reordered "
            "tokens, so each token's output must depend on that token alone"
        )


@contextlib.contextmanager
def _plain_refusals(path: str) -> Iterator[None]:
    """An op the plain computation has no rule for (``plain.UnsupportedOp``), or an activation kind without a form
    (``plain_acts.NoActivation``), as the :class:`InputError` of the file, on one line."""
    try:
        yield
    except (UnsupportedOp, NoActivation) as exc:
        raise InputError(f"--module {path}: {' '.join(str(exc).split())}") from exc


def _module_file(case: Case) -> ModuleFile:
    if case.module is None:
        raise ValueError(f"case {case.name} has no module file")
    return case.module


def build(case: Case, params: dict[str, np.ndarray], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The case's module on ``device`` in ``dtype`` (eval mode), its parameters ``params`` (``state_dict`` names,
    float arrays holding case-dtype values)."""
    mf = _module_file(case)
    user = load(mf)
    with torch.device("meta"):  # no initialisation to overwrite (seconds for a Llama 3 8B layer's 176M weights)
        module = _instantiate(user, mf.path, case.shape.dim, case.shape.hidden)
    if _tensor_attributes(module):  # a tensor kept as a plain attribute would stay on the meta device
        module = _instantiate(user, mf.path, case.shape.dim, case.shape.hidden)
    module = module.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        for k, p in module.state_dict(keep_vars=True).items():
            p.copy_(torch.from_numpy(np.asarray(params[k])).to(device=device, dtype=dtype))
    return module.eval()


def _tensor_attributes(module: nn.Module) -> bool:
    """Whether a submodule of ``module`` keeps a tensor as a plain attribute (not a parameter): built on the ``meta``
    device, it would have no values."""
    return any(isinstance(v, torch.Tensor) for m in module.modules() for v in vars(m).values())


def matmul_flops(case: Case, mode: str) -> int | None:
    """The GEMM FLOPs (:data:`GEMM_OPS`) of one step of ``mode`` of the case's torch module, eager, at the case's
    shapes (``torch_impl.runner.steps``: ``bwd`` the backward alone), as ``torch.utils.flop_counter`` counts them
    (``torch_impl.profiling.count_flops``), on each of :data:`COUNT_ON` until one runs; None where none does, or
    the file can no longer be loaded. A count depends on shapes alone: on ``meta`` tensors it takes milliseconds
    whatever the size (``examples/llama_mlp.py``'s fwd+bwd, 9 GEMMs: 13 ms at 111 tokens of width 96 -> 328, 18 ms
    at 4096 tokens of width 1024 -> 3584)."""
    from torch_impl import profiling, runner

    mf = _module_file(case)
    try:
        user = load(mf)
    except InputError:  # changed since the case was made: its cells are errors, with nothing to hold to a ceiling
        return None
    for where in COUNT_ON:
        device, dtype = torch.device(where), TORCH_DTYPES[case.dtype] if where == "meta" else torch.float32
        try:
            with device:  # parameters made on it: on ``meta`` a layer of any width costs nothing
                module = _instantiate(user, mf.path, case.shape.dim, case.shape.hidden)
            module = module.to(device=device, dtype=dtype).eval()
            x, dy = (torch.zeros(s, device=device, dtype=dtype) for s in (case.input_shape(), case.output_shape()))
            step = runner.steps(mode, module, canonical_params(module, case.model), x, dy)[0]
        except stop.CODE_ERRORS as exc:  # the module cannot be made or run here: the next place
            stop.reraise_stop(exc)
            continue
        counted = profiling.count_flops(step, lambda out: None)
        if counted["flops"] is not None:
            return int(sum(n for op, n in counted["by_op"].items() if op in GEMM_OPS))
    return None


def jax_function(case: Case) -> Any:
    """The file's ``jax_function(params, x) -> y``."""
    return load(_module_file(case)).jax_function


def compute(
    case: Case,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    weights: bool = True,
    other_gelu: bool = False,
) -> dict[str, np.ndarray]:
    """The module's forward (and backward given ``dy``) in ``ar`` (``plain.plain_compute``), its activations in
    ``ar.act_dtype`` as ``reference.compute``'s: ``y``, ``dx``, ``d<name>`` as float64 arrays; ``weights=False``:
    no weight gradient (``y`` and ``dx`` of a few tokens, the every-call check's: a Llama 3 8B layer's weight
    gradients cost seconds each time). ``other_gelu``: each GELU in its other form (erf for tanh and tanh for erf:
    the gate's resolution asks whether the two are told apart, :func:`activation_kinds` says whether it has one)."""
    module = build(case, params, torch.device("cpu"), torch.float64)
    module.requires_grad_(weights)
    acts = acts_plain(ar.act_dtype)
    if other_gelu:
        base = acts

        def acts(kind: str) -> Activations:
            return base(OTHER_GELU.get(kind, kind))

    with _plain_refusals(_module_file(case).path):
        return plain_compute(module, x, dy, ar, acts)


#: Each GELU form's other (``compute(other_gelu=True)``).
OTHER_GELU = {"gelu_tanh": "gelu_erf", "gelu_erf": "gelu_tanh"}


def activation_kinds(case: Case) -> frozenset[str]:
    """The activation kinds the module's plain computation evaluates (``gelu_tanh``, ``silu``, ...), read from one
    token through its module at no more than :data:`CHECK_WIDTHS` (milliseconds on a real layer's file)."""
    mf = _module_file(case)
    dim, hidden = min(case.shape.dim, CHECK_WIDTHS[0]), min(case.shape.hidden, CHECK_WIDTHS[1])
    try:
        module = _instantiate(load(mf), mf.path, dim, hidden).to(torch.float64)
    except InputError:  # refused at the narrow widths: the case's own (as check_plain builds it)
        dim, hidden = case.shape.dim, case.shape.hidden
        module = _instantiate(load(mf), mf.path, dim, hidden).to(torch.float64)
    seen: set[str] = set()
    acts = acts_plain(None)

    def recording(kind: str) -> Activations:
        seen.add(kind)
        return acts(kind)

    with _plain_refusals(mf.path), np.errstate(over="ignore", invalid="ignore"):
        plain_compute(module, np.zeros((1, 1, dim)), None, Arith(None, gemm=np.matmul), recording)
    return frozenset(seen)


def spot_reference(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None
) -> dict[str, np.ndarray]:
    """``y`` (and ``dx`` given ``dy``) of the few tokens ``x [1, K, dim]`` (``dy [1, K, out]``) through the module in
    float32, torch's own kernels, no weight gradient (``compare.gate.fresh.token_reference``: errors of an eighth
    of a row's scale are what it looks for; float32's are 2**-20 of that), as float64 arrays. A Llama 3 8B layer's
    module is built in float32 (0.7 GB, released on return) where the plain computation's dispatch needed float64."""
    out = kernels_run(case, x, params, dy, "float32", weights=False)
    return {k: v.astype(np.float64) for k, v in out.items()}


#: The dtypes :func:`kernels_run` runs a module in.
KERNEL_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


def kernels_run(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, dtype: str, weights: bool = True
) -> dict[str, np.ndarray]:
    """The module on ``x [..., dim]`` (its values exact in ``dtype``) through torch's own CPU kernels in ``dtype``
    (``float32`` or ``float64``, :data:`KERNEL_DTYPES`): ``y`` and, given ``dy``, ``dx`` and with ``weights`` every
    ``d<name>`` of each parameter that requires one (``state_dict`` names, as :func:`compute`'s), as arrays of
    ``dtype``. Not the fixed arithmetic: the machine's BLAS and libm, whose last bits may differ between machines. What
    needs no more: the fresh draw's range screen in float32 and its float64 reference (``compare.gate.fresh``), the
    every-call check's yardstick. A GEMM and an activation here cost what the framework's do, where the plain
    computation's dispatch (``plain.PlainMode``) copies and converts every operand it reads (a Llama 3.2 1B layer's
    fwd+bwd: seconds)."""
    t = KERNEL_DTYPES[dtype]
    module = build(case, params, torch.device("cpu"), t)
    names = dict(module.named_parameters(remove_duplicate=False))
    # the parameters that require a gradient, as the golden's (``plain.compute_under``) takes them
    wanted = weights and dy is not None
    wrt = [k for k in module.state_dict() if wanted and k in names and names[k].requires_grad]
    module.requires_grad_(False)
    for k in wrt:
        names[k].requires_grad_(True)
    xt = torch.from_numpy(np.asarray(x, dtype=dtype)).requires_grad_(dy is not None)
    with torch.set_grad_enabled(dy is not None):
        y = module(xt)
    out = {"y": y.detach().numpy()}
    if dy is not None:
        g = torch.from_numpy(np.asarray(dy, dtype=dtype))
        grads = torch.autograd.grad(y, [xt, *(names[k] for k in wrt)], g, allow_unused=True, materialize_grads=True)
        out["dx"] = grads[0].numpy()
        out.update({f"d{k}": v.numpy() for k, v in zip(wrt, grads[1:], strict=True)})
    return out


def reference(case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None) -> dict[str, np.ndarray]:
    """The float64 golden of a module case (``compare.problem.golden.exact_reference``): :func:`compute` in
    ``Arith.exact()``."""
    return compute(case, x, params, dy, Arith.exact())


def plain_run(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    """The gate's yardstick of a module case: ``plain.plain_run_module`` (``reference.plain_run``'s three parts)."""
    module = build(case, params, torch.device("cpu"), torch.float64)
    with _plain_refusals(_module_file(case).path):
        return plain_run_module(module, case.dtype, case.seed, x, dy)


def check_plain(case: Case, backward: bool = True) -> None:
    """The plain computation's rules run over the case's module (its forward and, with ``backward``, its backward)
    on :data:`REFERENCE_TOKENS` tokens drawn here, with the module's own initial parameters: every op it dispatches
    has a rule, and every activation its forms (the case dtype's; in float32, where the gate uses them, the envelope
    and signature twins' too: ``plain_acts``, looked up, not evaluated). Run before anything is measured, so that an
    op without a rule is an :class:`InputError` naming the file and the op (the CLI exits 2) rather than a failure
    in the middle of a run. The values do not matter, so the arithmetic is float64 through the machine's BLAS, and
    the module is built at no more than :data:`CHECK_WIDTHS` (the ops an MLP dispatches do not depend on its width;
    a file whose ``torch_module`` refuses the narrow widths is checked at the case's own): 0.01 s, where at the
    case's 4096 -> 14336 (``examples/llama_mlp.py`` forward and backward) it took 7 to 10 s here, most of it the
    three 58.7M-element float64 weight gradients. What the narrow build cannot see: a module whose ops change with
    its width; an op without a rule there fails the golden's computation instead, also before anything is timed."""
    mf = _module_file(case)
    user = load(mf)
    dim, hidden = min(case.shape.dim, CHECK_WIDTHS[0]), min(case.shape.hidden, CHECK_WIDTHS[1])
    out_dim = mf.out_dim
    try:
        module = _instantiate(user, mf.path, dim, hidden)
        if (dim, hidden) != (case.shape.dim, case.shape.hidden):
            with torch.no_grad():
                out_dim = int(module(torch.zeros(1, 1, dim)).shape[-1])
    except stop.CODE_ERRORS as exc:  # the narrow widths are refused (or give no tensor): the case's own, named
        stop.reraise_stop(exc)
        dim, hidden, out_dim = case.shape.dim, case.shape.hidden, mf.out_dim
        module = _instantiate(user, mf.path, dim, hidden)
    rng = np.random.default_rng(0)
    x = round_to_dtype(rng.standard_normal((1, REFERENCE_TOKENS, dim)), case.dtype).astype(np.float64)
    dy = None
    if backward:
        dy = round_to_dtype(rng.standard_normal((1, REFERENCE_TOKENS, out_dim)), case.dtype).astype(np.float64)
    forms = [acts_plain(Arith.plain(case.dtype).act_dtype)]
    if case.dtype == "float32":
        forms += [acts_envelope(case.seed), acts_signature(TRANSCENDENTAL_ERROR_ULPS)]
    exact = acts_plain(None)

    def acts_for(kind: str) -> Activations:
        for form in forms:
            form(kind)  # the form exists (NoActivation otherwise); not evaluated
        return exact(kind)

    with _plain_refusals(mf.path), np.errstate(over="ignore", invalid="ignore"):
        plain_compute(module, x, dy, Arith(None, gemm=np.matmul), acts_for)


def check_reference(case: Case) -> None:
    """Where the file defines ``reference(params, x)``: its ``y`` on :data:`REFERENCE_TOKENS` tokens of the case's
    inputs against the golden's (:func:`reference`); a difference beyond :data:`REFERENCE_RTOL` of the largest
    ``|y|`` means the file's two descriptions of its MLP differ, an :class:`InputError` naming it."""
    mf = _module_file(case)
    user = load(mf)
    if getattr(user, "reference", None) is None:
        return
    p = make_problem(case)
    x = p.x.reshape(-1, case.shape.dim)[:REFERENCE_TOKENS][None].astype(np.float64)
    params = {k: np.asarray(v, dtype=np.float64) for k, v in p.params.items()}
    ours = reference(case, x, params, None)["y"]
    try:
        theirs = np.asarray(user.reference(params, x.copy()), dtype=np.float64)
    except stop.CODE_ERRORS as exc:
        stop.reraise_stop(exc)
        raise InputError(f"--module {mf.path}: its reference(params, x) fails: {_one_line(exc)}") from exc
    if theirs.shape != ours.shape:
        raise InputError(
            f"--module {mf.path}: its reference(params, x) gives {list(theirs.shape)} for x {list(x.shape)}, its "
            f"torch_module {list(ours.shape)}"
        )
    err, top = float(np.max(np.abs(theirs - ours))), float(np.max(np.abs(ours)))
    if not err <= REFERENCE_RTOL * top:
        raise InputError(
            f"--module {mf.path}: its reference(params, x) and its torch_module differ: max |difference| {err:.3g} "
            f"against max |y| {top:.3g} on {x.shape[1]} tokens of the case's inputs (allowed: {REFERENCE_RTOL:g} of "
            "it); the file's two descriptions of its MLP are not the same function"
        )
