"""Golden data: inputs, weights, upstream gradient and float64 reference outputs and gradients for one case.

Generation is a pure function of the :class:`~compare.problem.cases.Case`: numpy's PCG64 seeded from the case's seed and
a CRC of its model/shape/distribution draws ``x``, the weights (scaled by ``1/sqrt(fan_in)``) and ``dy``; each is
rounded to the case dtype (and stored as float32, which holds every bf16/fp16 value exactly); the reference is
then computed in float64 from those rounded values. Committed cases live in ``golden/`` as safetensors files,
listed with their sha256 in ``golden/MANIFEST.json``; other cases are generated on the fly the same way. A case with
``weights`` (a checkpoint, ``compare.problem.checkpoint``) takes its parameters from the file as they are, after the
same draws (``x`` and ``dy`` are those of the same case with drawn weights); it is never committed.

A module case (``Case.module``, a user's own MLP file) draws its parameters by one rule (:func:`fan_in`) in its
module's ``state_dict`` order, and its reference is the module's own forward and backward computed in float64 with
the same bit-fixed arithmetic (``torch_impl.plain`` under ``Arith.exact()``), through :data:`MODULE_FILE`: the
problem layer loads no framework, so ``compare.backends.registry`` (which loads them lazily) installs its loader.
:func:`exact_reference`, :func:`plain_run_of` and :func:`compute_of` are each computation of a case, built-in or
module.

A mixture-of-experts case (``Case.model`` one of ``cases.MOE_MODELS``) draws its parameters by the same rule
(:func:`fan_in`: the router and ``gate_up`` at ``dim``, ``down`` at ``hidden``, each bias at its layer's) and computes
through ``compare.problem.moe.compute_case`` in each arithmetic: the golden with ``Arith.exact()``, the plain
computation with ``Arith.plain(dtype)``, every one routed to the golden's experts unless given others (``chosen``: the
experts a backend chose on near-ties, ``compare.gate.routing``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compare.formats.codec import to_json
from compare.problem import checkpoint, datacache, moe
from compare.problem.cases import Case, committed_cases, is_moe
from compare.problem.reference import GELU_MODELS, Arith, compute, plain_run, round_to_dtype

#: Bump when the generation recipe changes (then regenerate and commit the files).
GENERATOR_VERSION = 2
#: The committed golden folder: ``compare/golden``, in a checkout a link to the repository's ``golden/``, in an
#: installed package the files themselves (package data); ``FUSION_COMPARE_GOLDEN_DIR`` points elsewhere (tests use
#: it for corrupt copies).
GOLDEN_DIR = Path(os.environ.get("FUSION_COMPARE_GOLDEN_DIR") or Path(__file__).resolve().parents[1] / "golden")
MANIFEST = "MANIFEST.json"
REGENERATE = "python scripts/make_golden.py"


class GoldenError(RuntimeError):
    """A golden file is missing, corrupt, or does not match its manifest."""


@dataclass(frozen=True)
class Problem:
    """What a backend is given: the case, its inputs and its weights, and never the answer.

    Activations are 3-D ``[batch, seq, features]``: ``x`` and the upstream gradient ``dy`` (float32 arrays holding
    case-dtype values); ``params`` are the canonical weights, ``(out, in)``. There is deliberately no reference
    here: a backend's ``prepare`` receives this type, so reaching for the expected output is an attribute error
    (and a type error for the checker), not a matter of convention.
    """

    case: Case
    inputs: dict[str, np.ndarray]
    params: dict[str, np.ndarray]

    @property
    def x(self) -> np.ndarray:
        return self.inputs["x"]

    @property
    def dy(self) -> np.ndarray:
        return self.inputs["dy"]


@dataclass(frozen=True)
class Golden(Problem):
    """The data of one case: the :class:`Problem` (inputs and weights) plus ``ref``, the float64 reference output
    ``y`` and gradients ``dx``, ``d<param>``. Only the harness and the gate hold one; backends get ``.problem``."""

    ref: Mapping[str, np.ndarray]

    @property
    def problem(self) -> Problem:
        """The part a backend may see (inputs and weights, no reference), as fresh copies: a backend that writes
        into its inputs (``torch.from_numpy`` shares memory) cannot change the golden data other backends get."""
        return Problem(
            case=self.case,
            inputs={k: v.copy() for k, v in self.inputs.items()},
            params={k: v.copy() for k, v in self.params.items()},
        )


def _rng(case: Case) -> np.random.Generator:
    s = case.shape
    tag = zlib.crc32(f"{case.model}|{s.batch}|{s.seq}|{s.dim}|{s.hidden}|{case.dist}".encode())
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([case.seed, tag])))


def draw_input(rng: np.random.Generator, shape: tuple[int, ...], dist: str) -> np.ndarray:
    if dist == "normal":
        return rng.standard_normal(shape)
    return rng.standard_t(3.0, shape)  # heavy-tailed: finite variance (3), frequent large values


def case_input(rng: np.random.Generator, case: Case) -> np.ndarray:
    """One draw of ``case``'s input ``x [batch, seq, dim]`` (float64, not yet rounded to the dtype): from its
    distribution, and a steered MoE case's moved along its routing direction (``moe.steer_input``). Every draw of a
    case, golden, fresh and every call's, is this one."""
    return moe.steer_input(case.routing, draw_input(rng, case.input_shape(), case.dist), case.seed)


#: Parameters of the layers that read ``x [.., dim]`` (fan-in ``dim``); the others (``down``, ``fc2``, ``b2``) belong to
#: layers that read the hidden activation (fan-in ``hidden``). A bias is drawn at its layer's fan-in too.
_READS_X: tuple[str, ...] = (
    "gate", "up", "weight", "bias", "fc1", "b1", "router", "router_bias", "gate_up", "gate_up_bias"
)  # fmt: skip


def fan_in(case: Case, name: str) -> int:
    """The fan-in parameter ``name`` of ``case`` is drawn at (``N(0, 1) / sqrt(fan_in)``, then rounded to the dtype).

    Built-in models: ``dim`` for the layers that read ``x``, ``hidden`` for those that read the hidden activation (a
    bias at its layer's). A module case's parameters by their shapes, torch layout: a weight of two or more
    dimensions ``(out, in, ...)`` at the product of all but its first (a linear's ``in``, its last dimension); a 1-D
    ``<p>bias`` at the fan-in of ``<p>weight`` when that is such a weight (the width its layer reads); any other
    1-D parameter at its own length; a scalar at 1."""
    if case.module is None:
        return case.shape.dim if name in _READS_X else case.shape.hidden
    shapes = case.weight_shapes()
    shape = shapes[name]
    if len(shape) == 1 and name.endswith("bias"):
        weight = shapes.get(name[: -len("bias")] + "weight", ())
        shape = weight if len(weight) >= 2 else shape
    return math.prod(shape[1:]) if len(shape) >= 2 else math.prod(shape)


#: The loader of a module case's computations (``torch_impl.user_module``: ``reference``, ``plain_run``,
#: ``compute``), installed by ``compare.backends.registry`` (module docstring); empty while it is not imported.
MODULE_FILE: list[Callable[[], Any]] = []


def _module_file(case: Case) -> Any:
    if not MODULE_FILE:
        raise RuntimeError(f"case {case.name}: no module-file loader installed (import compare.backends.registry)")
    return MODULE_FILE[0]()


def exact_reference(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The float64 reference of ``case`` on ``x`` (and its gradients given ``dy``): ``reference.compute`` of a
    built-in model (``moe.compute_case`` of a MoE one), the module's own computation in ``Arith.exact()`` for a module
    case."""
    if is_moe(case.model):
        return moe.compute_case(case.model, x, params, dy, Arith.exact())
    if case.module is None:
        return compute(case.model, x, params, dy, Arith.exact())
    return dict(_module_file(case).reference(case, x, params, dy))


def compute_of(
    case: Case,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    ar: Arith,
    weights: bool = True,
    other_gelu: bool = False,
    chosen: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """``reference.compute`` of ``case`` in ``ar`` (its activations in ``ar.act_dtype``), a module case's module;
    ``weights=False``: without the weight gradients; ``other_gelu``: its GELU in the other form (a built-in model's
    tanh GELU as erf, a module's each way round; the gate's resolution, ``compare.gate.resolution``). A MoE case's
    ``moe.compute_case`` (no GELU: ``other_gelu`` changes nothing), routed to ``chosen [T, k]`` where given."""
    if is_moe(case.model):
        return moe.compute_case(case.model, x, params, dy, ar, weights, chosen)
    if chosen is not None:
        raise ValueError(f"case {case.name}: chosen experts are for a mixture-of-experts case")
    if case.module is None:
        return compute(case.model, x, params, dy, ar, gelu="erf" if other_gelu else "tanh", weights=weights)
    return dict(_module_file(case).compute(case, x, params, dy, ar, weights, other_gelu))


def has_gelu(case: Case) -> bool:
    """Whether ``case`` computes a GELU (a built-in model of ``GELU_MODELS``; a module whose plain computation
    evaluates one), so that its other form can be told apart or not."""
    if case.module is None:
        return case.model in GELU_MODELS
    return bool(set(_module_file(case).activation_kinds(case)) & {"gelu_tanh", "gelu_erf"})


def spot_reference_of(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None
) -> dict[str, np.ndarray]:
    """A module case's ``y`` (and ``dx`` given ``dy``) of a few tokens in float32, its module through its framework's
    own kernels (``torch_impl.user_module.spot_reference``): the every-call check's yardstick."""
    return dict(_module_file(case).spot_reference(case, x, params, dy))


def kernels_run_of(
    case: Case, x: np.ndarray, params: dict[str, np.ndarray], dy: np.ndarray | None, dtype: str
) -> dict[str, np.ndarray]:
    """A module case's ``y`` and, given ``dy``, every gradient, through its framework's own CPU kernels in ``dtype``
    (``float32`` or ``float64``; ``torch_impl.user_module.kernels_run``), as arrays of that type: the fresh draw's
    range screen and reference (``compare.gate.fresh``), which need neither the fixed arithmetic's bits nor its
    cost."""
    return dict(_module_file(case).kernels_run(case, x, params, dy, dtype))


def plain_run_of(
    case: Case,
    x: np.ndarray,
    params: dict[str, np.ndarray],
    dy: np.ndarray | None,
    chosen: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    """``reference.plain_run`` of ``case`` (the gate's yardstick and its twins): a built-in model's formulas, a
    module case's module (``torch_impl.plain.plain_run_module``). A MoE case's is ``moe.compute_case`` in
    ``Arith.plain(dtype, final=False)``, routed to ``chosen`` (default: the golden's experts), without twins: its
    activations are not replaceable yet, so it has no envelope twin or transcendental signature (as ``linear``)."""
    if is_moe(case.model):
        with np.errstate(over="ignore", invalid="ignore"):
            plain = moe.compute_case(case.model, x, params, dy, Arith.plain(case.dtype, final=False), chosen=chosen)
        return plain, None, None
    if chosen is not None:
        raise ValueError(f"case {case.name}: chosen experts are for a mixture-of-experts case")
    if case.module is None:
        return plain_run(case.model, case.dtype, case.seed, x, params, dy)
    unrounded, envelope, signature = _module_file(case).plain_run(case, x, params, dy)
    return unrounded, envelope, signature


def make_problem(case: Case) -> Problem:
    """The inputs and weights of ``case``'s golden data, without its reference (deterministic: the draws of
    :func:`make_golden`, a fraction of a second where the reference takes tens of seconds on a large case). With
    ``case.weights`` the parameters are the file's (``checkpoint.load_params``: its sha256, names, shapes and dtypes
    checked); their draws are made all the same, so that ``x`` and ``dy`` are those of the case without weights."""
    rng = _rng(case)
    x = round_to_dtype(case_input(rng, case), case.dtype)
    params = {}
    for name, shape in case.weight_shapes().items():
        drawn = rng.standard_normal(shape)
        if case.weights is None:
            drawn /= np.sqrt(fan_in(case, name))
            if name == "router":  # a steered MoE case's router (moe.steer_router; unchanged otherwise)
                drawn = moe.steer_router(case.routing, drawn, case.seed)
            params[name] = round_to_dtype(drawn, case.dtype)
    dy = round_to_dtype(rng.standard_normal(case.output_shape()), case.dtype)
    if case.weights is not None:
        params = checkpoint.load_params(case)
    return Problem(case=case, inputs={"x": x, "dy": dy}, params=params)


def make_golden(case: Case) -> Golden:
    """Generate the golden data of ``case`` (deterministic; see the module docstring), its whole reference now."""
    p = make_problem(case)
    ref = exact_reference(case, p.x, p.params, p.dy)
    return Golden(case=case, inputs=p.inputs, params=p.params, ref=ref)


def reference_names(case: Case) -> tuple[str, ...]:
    """The tensors of ``case``'s reference: the output ``y``, then ``dx`` and ``d<param>`` per weight."""
    return ("y", "dx", *(f"d{p}" for p in case.weight_shapes()))


class LazyReference(Mapping[str, np.ndarray]):
    """The float64 reference of a generated case, computed on first use and kept in the disk cache
    (``compare.problem.datacache``): the output alone while only ``y`` is read (a forward-only run, a compile-cost
    sweep that reads none of it), everything once a gradient is (on ``cpu-mlp`` the backward is about three quarters
    of the reference's time). The keys are known without computing anything; the values are those of
    :func:`make_golden`'s reference, bit for bit (the same ``compute`` on the same inputs)."""

    def __init__(self, p: Problem) -> None:
        self._p = p
        self._names = reference_names(p.case)
        self._fwd: dict[str, np.ndarray] | None = None
        self._all: dict[str, np.ndarray] | None = None

    def _computed(self, backward: bool) -> dict[str, Any]:
        """The reference, as the disk cache holds it (``datacache.Stored``: read a block at a time by the gate, never
        held whole: a Llama 3 8B layer's is 1.4 GB), or in memory where the cache is off or cannot be written."""
        case = self._p.case
        name = datacache.key("reference" if backward else "reference-fwd", _identity(case))
        cached = datacache.load(name, lazy=True)
        if cached is not None:
            return cached
        ref = exact_reference(case, self._p.x, self._p.params, self._p.dy if backward else None)
        datacache.save(name, {k: np.ascontiguousarray(v) for k, v in ref.items()})
        return datacache.load(name, lazy=True) or ref

    def prefetch(self, backward: bool) -> None:
        """Compute now what a run will read: with ``backward`` the whole reference at once (reading ``y`` first
        would compute the forward twice)."""
        if backward and self._all is None:
            self._all = self._computed(backward=True)

    def __contains__(self, k: object) -> bool:
        """By name, computing nothing (``Mapping``'s own would read the value: the whole backward for a gradient)."""
        return k in self._names

    def __getitem__(self, k: str) -> np.ndarray:
        if k not in self._names:
            raise KeyError(k)
        if self._all is None and k == "y":
            if self._fwd is None:
                self._fwd = self._computed(backward=False)
            return self._fwd["y"]
        if self._all is None:
            self._all = self._computed(backward=True)
        return self._all[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _to_tensors(golden: Golden) -> dict[str, np.ndarray]:
    t = {f"input.{k}": v for k, v in golden.inputs.items()}
    t |= {f"param.{k}": v for k, v in golden.params.items()}
    t |= {f"ref.{k}": v for k, v in golden.ref.items()}
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def _case_meta(case: Case) -> dict[str, object]:
    return dict(to_json(case))


#: The code that computes a module case's data besides ``compare/problem`` (``datacache.SOURCES``): the generic plain
#: computation and the loader of the user's file.
MODULE_CODE: tuple[str, ...] = ("torch_impl/plain.py", "torch_impl/plain_acts.py", "torch_impl/user_module.py")


def module_code(case: Case) -> dict[str, object]:
    """``{"module_code": sha256}`` of :data:`MODULE_CODE` for a module case (a key of its cached data: a change to
    that code is a miss), ``{}`` for any other (whose keys stay as they were)."""
    return {} if case.module is None else {"module_code": datacache.source_digest(list(MODULE_CODE))}


def _identity(case: Case) -> dict[str, object]:
    """What a case's generated data is a function of: the case (with its weights file's path, sha256 and prefix, where
    it has one; a module file's path, sha256, parameters and output width), the generator's version, and for a module
    case the code that computes it (:func:`module_code`)."""
    return {"case": _case_meta(case), "generator_version": GENERATOR_VERSION, **module_code(case)}


def serialize(golden: Golden) -> bytes:
    """Safetensors bytes of a golden case (deterministic: same case, same bytes)."""
    from safetensors.numpy import save

    # one metadata key: safetensors keeps metadata in a hash map, whose order differs between processes
    meta = {"fusion_compare": json.dumps(_identity(golden.case), sort_keys=True)}
    return save(_to_tensors(golden), metadata=meta)


def write_all(directory: Path = GOLDEN_DIR) -> dict[str, object]:
    """Write every committed case and the manifest into ``directory``; return the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, object] = {}
    for case in committed_cases():
        g = make_golden(case)
        data = serialize(g)
        fname = f"{case.name}.safetensors"
        (directory / fname).write_bytes(data)
        files[fname] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "case": _case_meta(case),
            "shapes": {k: list(v.shape) for k, v in _to_tensors(g).items()},
        }
    manifest: dict[str, object] = {
        "generator": {"version": GENERATOR_VERSION, "bit_generator": "PCG64", "numpy": np.__version__},
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def read_manifest(directory: Path = GOLDEN_DIR) -> dict[str, object]:
    path = directory / MANIFEST
    if not path.is_file():
        raise GoldenError(f"golden manifest {path} is missing; regenerate with `{REGENERATE}`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GoldenError(
            f"golden manifest {path} is not valid JSON ({exc}); it was truncated or edited: "
            f"regenerate with `{REGENERATE}`"
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise GoldenError(f"golden manifest {path} has no 'files' table; regenerate with `{REGENERATE}`")
    return doc


def verify_file(fname: str, directory: Path = GOLDEN_DIR) -> bytes:
    """Return the bytes of a committed golden file after checking its sha256 against the manifest."""
    files = read_manifest(directory)["files"]
    assert isinstance(files, dict)
    if fname not in files:
        raise GoldenError(
            f"golden file {fname} is not listed in {directory / MANIFEST}; regenerate with `{REGENERATE}`"
        )
    path = directory / fname
    if not path.is_file():
        raise GoldenError(f"golden file {path} is missing; regenerate with `{REGENERATE}`")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = files[fname]["sha256"]
    if digest != expected:
        raise GoldenError(
            f"golden file {path} does not match its manifest (sha256 {digest[:16]}..., manifest says "
            f"{expected[:16]}...); it was edited or corrupted: regenerate with `{REGENERATE}`"
        )
    return data


def load_file(case: Case, directory: Path = GOLDEN_DIR) -> Golden:
    """Load a committed golden case after its integrity check."""
    from safetensors.numpy import load

    t = load(verify_file(f"{case.name}.safetensors", directory))
    group = {p: {k.split(".", 1)[1]: v for k, v in t.items() if k.startswith(p + ".")} for p in PARTS}
    return Golden(case=case, inputs=group["input"], params=group["param"], ref=group["ref"])


def is_committed(case: Case) -> bool:
    """Whether ``case``'s golden data is a committed file: never for a case that reads a weights file."""
    return case.weights is None and case in committed_cases()


def _generated(case: Case) -> Golden:
    """``make_golden(case)`` with its reference computed as it is read (:class:`LazyReference`, through the disk
    cache of data that is a pure function of the case: a large case's reference takes tens of seconds, and every
    process of a worker group needs it); the inputs and weights are drawn again (a fraction of a second)."""
    p = make_problem(case)
    return Golden(case=case, inputs=p.inputs, params=p.params, ref=LazyReference(p))


def prefetch_reference(golden: Golden, backward: bool) -> None:
    """Have ``golden``'s whole reference computed at once when a run will read its gradients (``backward``): a
    generated case's :class:`LazyReference` then computes it once; a committed file's is already read."""
    if isinstance(golden.ref, LazyReference):
        golden.ref.prefetch(backward)


#: The tensor groups of a golden file: ``input.x``, ``param.gate``, ``ref.y``, ...
PARTS: tuple[str, ...] = ("input", "param", "ref")


@functools.lru_cache(maxsize=8)
def golden_for(case: Case) -> Golden:
    """The golden data of ``case``: the verified committed file if there is one, else generated (or read from the
    disk cache of generated data)."""
    return load_file(case) if is_committed(case) else _generated(case)


def data_sha256(case: Case, directory: Path = GOLDEN_DIR) -> str:
    """The sha256 of ``case``'s golden data as this process has it: a committed case's file (checked against the
    manifest first: :func:`verify_file`), else the safetensors bytes of the generated data (:func:`serialize`, the
    same bytes on any machine). A sweep's driver sends its own to each worker, which compares it with its own before
    measuring: two nodes with different golden files or generation code are told apart."""
    if is_committed(case):
        return hashlib.sha256(verify_file(f"{case.name}.safetensors", directory)).hexdigest()
    return hashlib.sha256(serialize(golden_for(case))).hexdigest()
