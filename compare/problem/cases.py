"""Cases and presets: what is computed (model kind, shapes, dtype, input distribution).

A :class:`Case` fully determines the golden data: ``golden.make_golden(case)`` is a pure function of it.

Shapes:
- ``linear``: ``x [batch, seq, dim] -> y [batch, seq, hidden]`` with ``y = x @ W.T + b`` (``hidden`` is the
  output width, the blog post's ``out_dim``).
- ``geglu``: ``x [batch, seq, dim] -> y [batch, seq, dim]`` with
  ``y = down(gelu_tanh(gate(x)) * up(x))``; gate/up are ``dim -> hidden``, down is ``hidden -> dim``; bias-free.
- ``swiglu``: the same block with SiLU (``silu(s) = s * sigmoid(s)``): ``y = down(silu(gate(x)) * up(x))``
  (Llama, Mistral, Qwen); same weights, bias-free.
- ``gelu-mlp``: ``x [batch, seq, dim] -> y [batch, seq, dim]`` with ``y = fc2(gelu_tanh(fc1(x) + b1)) + b2``
  (GPT-2/BERT style, biases included); fc1 is ``dim -> hidden``, fc2 is ``hidden -> dim``.
- ``module`` (:data:`MODULE_MODEL`, not one of :data:`MODELS`): a user's own MLP from a Python file
  (:class:`ModuleFile`, ``python -m compare run --module FILE.py``): ``x [batch, seq, dim] -> y [batch, seq,
  out_dim]``, its parameters the ``state_dict`` of the file's ``torch_module(dim, hidden)``.
- ``moe-qwen3``, ``moe-mixtral``, ``moe-gpt-oss`` (:data:`MOE_MODELS`, not in :data:`MODELS` either): a
  mixture-of-experts block (``compare.problem.moe``: a router over ``E`` experts, the top ``k`` per token, gated
  experts ``dim -> hidden -> dim``), ``x [batch, seq, dim] -> y [batch, seq, dim]``; its parameters
  ``MoeSpec.weight_shapes`` (``router [E, dim]``, ``gate_up [E, 2 hidden, dim]``, ``down [E, dim, hidden]`` and
  gpt-oss's biases).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from compare.formats.codec import INLINE, LATER
from compare.problem.moe import MOE_ABOUT, MOE_PRESETS, MOE_SPECS, ROUTINGS, STEERED

MODELS: tuple[str, ...] = ("linear", "geglu", "swiglu", "gelu-mlp")
#: The gated (GLU) feed-forward families: ``down(act(gate(x)) * up(x))``; the hand-written kernels serve these.
GLU_MODELS: tuple[str, ...] = ("geglu", "swiglu")
#: The families with a tensor-parallel layout (Megatron: a column-parallel layer feeding a row-parallel one);
#: ``linear`` has none.
TP_MODELS: tuple[str, ...] = ("geglu", "swiglu", "gelu-mlp")
#: The families with an activation between two GEMMs, what a recomputation (activation checkpointing) variant can
#: recompute; ``linear`` has none.
REMAT_MODELS: tuple[str, ...] = ("geglu", "swiglu", "gelu-mlp")
#: The activation of each GLU family, by the name the hand-written kernels take (their ``ACT`` parameter).
GLU_ACTIVATIONS: dict[str, str] = {"geglu": "gelu_tanh", "swiglu": "silu"}
#: What each model computes, one line each (``python -m compare list``).
MODEL_ABOUT: dict[str, str] = {
    "linear": "y = x W^T + b (nn.Linear)",
    "geglu": "y = down(gelu_tanh(gate(x)) * up(x)), bias-free (Gemma)",
    "swiglu": "y = down(silu(gate(x)) * up(x)), bias-free (Llama, Mistral, Qwen)",
    "gelu-mlp": "y = fc2(gelu_tanh(fc1(x) + b1)) + b2 (GPT-2, BERT)",
    **MOE_ABOUT,
}
#: The model of a case whose MLP is a user's own file (``Case.module``); kept out of :data:`MODELS`, which lists the
#: built-in models every enumeration (presets, committed golden files, checkpoint names) walks.
MODULE_MODEL = "module"
#: The mixture-of-experts models (``compare.problem.moe.MOE_SPECS``): kept out of :data:`MODELS` as
#: :data:`MODULE_MODEL` is, where the dense code (committed golden files, checkpoint names, the dense backends and
#: the cost model) does not know them.
MOE_MODELS: tuple[str, ...] = tuple(MOE_SPECS)
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DISTRIBUTIONS: tuple[str, ...] = ("normal", "student_t")
MODES: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")


class InputError(ValueError):
    """Bad user input: an unknown name or an impossible shape. The CLI turns it into exit status 2."""


class FileChanged(InputError):
    """A file a case reads (a weights checkpoint, a module file) no longer has the sha256 the case was made with
    (edited or replaced since the run started): every cell of the case is an error naming the file and both hashes."""


def check_name(kind: str, name: str, known: tuple[str, ...] | list[str]) -> str:
    """Return ``name`` if it is one of ``known``; else raise an :class:`InputError` listing them."""
    if name not in known:
        raise InputError(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known)}")
    return name


def check_unique(kind: str, names: Sequence[str]) -> list[str]:
    """Return ``names`` as a list if none repeats; else raise an :class:`InputError` (a cell would run twice)."""
    if len(set(names)) != len(names):
        raise InputError(f"a {kind} repeats: {', '.join(names)}")
    return list(names)


def check_finite(option: str, value: float, *, zero_ok: bool = False, at_most: float | None = None) -> float:
    """Return ``value`` if it is a finite number above 0 (or at least 0 with ``zero_ok``) and at most ``at_most``.

    NaN and infinities are always refused: a NaN compares false with everything and would pass any check silently.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if zero_ok else value > 0) and (at_most is None or value <= at_most)
    if not ok:
        want = ">= 0" if zero_ok else "> 0"
        want += f" and <= {at_most:g}" if at_most is not None else ""
        raise InputError(f"{option} must be a finite number {want}, got {value!r}")
    return value


def check_seed(seed: int) -> int:
    """Return ``seed`` if it is a non-negative integer (numpy's ``SeedSequence`` refuses negative ones)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


@dataclass(frozen=True)
class Shape:
    """Sizes of one case. ``hidden`` is the MLP's hidden width (GLU families, ``gelu-mlp``), or the output width of
    ``linear``."""

    batch: int
    seq: int
    dim: int
    hidden: int

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"shape dimension {field.name!r} must be a positive integer, got {value!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def label(self) -> str:
        return f"{self.batch}x{self.seq}x{self.dim}->{self.hidden}"


@dataclass(frozen=True)
class Weights:
    """A case's parameters read from a safetensors checkpoint instead of drawn (``compare.problem.checkpoint``: the
    Hugging Face names, the loader and its checks): the checkpoint's absolute ``path`` (one ``.safetensors`` file, or
    a sharded checkpoint's ``model.safetensors.index.json``), the ``sha256`` the case's data is a function of (a
    worker that rebuilds the case's golden data checks it again: a single file's, of its bytes; a sharded
    checkpoint's, of the tensors the case reads, :func:`compare.problem.checkpoint.tensors_sha256`, so that no run
    hashes a whole checkpoint) and the ``prefix`` every name is looked up under (``model.layers.0.mlp.``).

    ``layer``: the layer index of a case made by ``--layers`` from a prefix template (``model.layers.{i}.mlp.``),
    what a report groups layers by; None otherwise (and in older documents). ``dtypes``: the safetensors dtypes
    (``F32``, ``BF16``, ``F16``) of the tensors the case reads, where the command line looked them up (what the
    report says was widened: bfloat16 weights for a float32 case); a property of the bytes the sha256 names, so
    left out of equality."""

    path: str
    sha256: str
    prefix: str = ""
    layer: int | None = dataclasses.field(default=None, metadata=LATER)
    dtypes: tuple[str, ...] = dataclasses.field(default=(), metadata=LATER, compare=False)
    #: a sharded checkpoint's case: per tensor it reads, its own sha256 (``checkpoint.tensor_digests``; ``sha256`` is
    #: theirs together), so that a change is refused naming the tensor and its shard; out of equality, as ``dtypes``
    tensors: tuple[tuple[str, str], ...] = dataclasses.field(default=(), metadata=LATER, compare=False)

    def __post_init__(self) -> None:
        if not os.path.isabs(self.path):
            raise InputError(f"a weights file's path must be absolute, got {self.path!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise InputError(f"a weights file's sha256 must be 64 lower-case hex digits, got {self.sha256!r}")
        if self.layer is not None and (
            not isinstance(self.layer, int) or isinstance(self.layer, bool) or self.layer < 0
        ):
            raise InputError(f"a layer index must be a non-negative integer, got {self.layer!r}")

    @property
    def sharded(self) -> bool:
        """Whether the path is a sharded checkpoint's index (its sha256 then the tensors' the case reads)."""
        return self.path.endswith(".json")

    @property
    def tag(self) -> str:
        """The case name's suffix: ``w`` and the sha256 (12 digits), then ``p`` and 8 of the prefix's when there is
        one (two layers of one file are two cases); a ``--layers`` case's starts with ``l`` and its index
        (``l3-w0123456789ab-p01234567``)."""
        tag = f"w{self.sha256[:12]}"
        tag += f"-p{hashlib.sha256(self.prefix.encode()).hexdigest()[:8]}" if self.prefix else ""
        return tag if self.layer is None else f"l{self.layer}-{tag}"


@dataclass(frozen=True)
class ModuleFile:
    """A user's own MLP, a Python file defining ``torch_module(dim, hidden)`` and ``jax_function(params, x)``
    (``torch_impl.user_module`` loads and inspects it): the file's absolute ``path``, the ``sha256`` of its bytes
    (what the case's data is a function of: a worker that rebuilds it checks the file again), the ``params`` of its
    module at the case's ``dim`` and ``hidden`` (every ``state_dict`` name with its shape, in the module's order; the
    torch layout, a linear's weight ``(out, in)``) and the width ``out_dim`` of its output."""

    path: str
    sha256: str
    params: tuple[tuple[str, tuple[int, ...]], ...]
    out_dim: int

    def __post_init__(self) -> None:
        if not os.path.isabs(self.path):
            raise InputError(f"a module file's path must be absolute, got {self.path!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise InputError(f"a module file's sha256 must be 64 lower-case hex digits, got {self.sha256!r}")
        if not self.params:
            raise InputError(f"module file {self.path}: its module has no parameters")
        if isinstance(self.out_dim, bool) or not isinstance(self.out_dim, int) or self.out_dim <= 0:
            raise InputError(f"module file {self.path}: output width must be a positive integer, got {self.out_dim!r}")

    @property
    def tag(self) -> str:
        """The case name's suffix: ``m`` and the file's sha256 (12 digits)."""
        return f"m{self.sha256[:12]}"


@dataclass(frozen=True)
class Case:
    """One comparison: model kind, shape, dtype, input distribution and the seed of its data; ``weights``, where set,
    the checkpoint its parameters are read from (None: drawn from the seed, as every committed case's); ``module``,
    set exactly when ``model`` is :data:`MODULE_MODEL`, the user's file whose MLP the case computes."""

    model: str
    #: written into the case's own object (``batch``, ``seq``, ``dim``, ``hidden`` beside ``model``): one flat
    #: object in golden manifests, cache keys and worker jobs
    shape: Shape = dataclasses.field(metadata=INLINE)
    dtype: str
    dist: str = "normal"
    seed: int = 0
    #: left out of the JSON while None: a case without weights has the JSON (and so the cache keys and the golden
    #: files' metadata) it always had
    weights: Weights | None = dataclasses.field(default=None, metadata=LATER)
    #: left out of the JSON while None, as ``weights``
    module: ModuleFile | None = dataclasses.field(default=None, metadata=LATER)
    #: a MoE case's routing distribution (``compare.problem.moe.STEERED``: the router and every draw of ``x`` steered
    #: so that the experts' shares follow it); None is ``uniform``, and is left out of the JSON
    routing: str | None = dataclasses.field(default=None, metadata=LATER)

    def __post_init__(self) -> None:
        if self.module is not None or self.model == MODULE_MODEL:
            if self.module is None or self.model != MODULE_MODEL:
                raise InputError(f"model {MODULE_MODEL!r} goes with a module file, and a module file with it")
        else:
            check_name("model", self.model, MODELS + MOE_MODELS)
        check_name("dtype", self.dtype, DTYPES)
        check_name("distribution", self.dist, DISTRIBUTIONS)
        if self.routing is not None:
            if self.routing == ROUTINGS[0]:
                raise InputError(f"routing {ROUTINGS[0]!r} is a case's default: give routing None")
            check_name("routing", self.routing, STEERED)
            if self.model not in MOE_SPECS:
                raise InputError(f"a routing distribution is a mixture-of-experts case's; {self.model} has no router")

    @property
    def name(self) -> str:
        """A stable file-name-safe identifier, e.g. ``geglu-3x37x96-328-float32-normal-s0``; with weights read from a
        file, :attr:`Weights.tag` after it (``...-s0-w0123456789ab``); a module case's :attr:`ModuleFile.tag` before
        that (``module-...-s0-m0123456789ab``); a steered MoE case's routing after the seed (``...-s0-rhot``)."""
        s = self.shape
        name = f"{self.model}-{s.batch}x{s.seq}x{s.dim}-{s.hidden}-{self.dtype}-{self.dist}-s{self.seed}"
        name += f"-r{self.routing}" if self.routing is not None else ""
        name += f"-{self.module.tag}" if self.module is not None else ""
        return name + (f"-{self.weights.tag}" if self.weights is not None else "")

    @property
    def layer(self) -> int | None:
        """The layer index of a case made by ``--layers`` (its weights'), None for any other."""
        return self.weights.layer if self.weights is not None else None

    def input_shape(self) -> tuple[int, int, int]:
        return (self.shape.batch, self.shape.seq, self.shape.dim)

    def output_shape(self) -> tuple[int, int, int]:
        out = self.shape.hidden if self.model == "linear" else self.shape.dim
        out = self.module.out_dim if self.module is not None else out
        return (self.shape.batch, self.shape.seq, out)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical parameter shapes, torch ``(out, in)`` layout (see ``compare.problem.weights``); a module case's
        are its module's ``state_dict`` names and shapes."""
        s = self.shape
        if self.module is not None:
            return dict(self.module.params)
        if self.model in MOE_SPECS:
            return MOE_SPECS[self.model].weight_shapes(s.dim, s.hidden)
        if self.model == "linear":
            return {"weight": (s.hidden, s.dim), "bias": (s.hidden,)}
        if self.model == "gelu-mlp":
            return {"fc1": (s.hidden, s.dim), "b1": (s.hidden,), "fc2": (s.dim, s.hidden), "b2": (s.dim,)}
        return {"gate": (s.hidden, s.dim), "up": (s.hidden, s.dim), "down": (s.dim, s.hidden)}

    def estimated_bytes(self) -> int:
        """Host memory this case needs before any backend runs: a lower bound, to refuse an impossible size up front.

        Kept for the whole case: the golden inputs ``x``, ``dy`` and the weights (float32), and the float64
        reference output and gradients. On top of that, at its peak, the larger of the float64 reference
        computation's working set and the plain same-dtype computation's (float32: its outputs and gradients and
        its intermediates). Intermediates: a GLU family's ``g, u, act(g), h`` and their gradients (8
        ``[tokens, hidden]`` tensors), ``gelu-mlp``'s ``fc1(x) + b1``, its GELU and their gradients (4), plus a cast
        copy of ``x`` and ``dy``; ``linear`` has only the casts; a module case is counted as a GLU family. The
        backends' own copies (framework tensors, compiled buffers, device memory) come on top and are not counted.
        """
        t = self.shape.tokens
        n_in, n_out, n_w = self.elements()
        n_hidden = {"linear": 0, "gelu-mlp": 4}.get(self.model, 8)  # [tokens, hidden] intermediates
        n_work = n_hidden * t * self.shape.hidden + n_in + n_out
        reference_work = 8 * n_work
        plain = 4 * (n_out + n_in + n_w) + 4 * n_work
        return self.golden_bytes() + max(reference_work, plain)

    def elements(self) -> tuple[int, int, int]:
        """``(x, y, weights)``: the elements of the input ``x`` (and of ``dx``), of the output ``y`` (and of ``dy``)
        and of all the weights together (and of their gradients)."""
        n_w = sum(math.prod(shape) for shape in self.weight_shapes().values())
        return math.prod(self.input_shape()), math.prod(self.output_shape()), n_w

    def golden_bytes(self) -> int:
        """What the golden data holds for the whole case: its inputs and weights (float32) and its float64 reference
        output and gradients."""
        n_in, n_out, n_w = self.elements()
        return 4 * (n_in + n_out + n_w) + 8 * (n_out + n_in + n_w)


def is_moe(model: str) -> bool:
    """Whether ``model`` is a mixture-of-experts block (:data:`MOE_MODELS`)."""
    return model in MOE_SPECS


def moe_model(preset_name: str) -> str:
    """The MoE model of ``compare.problem.moe.MOE_PRESETS[preset_name]``: the one whose spec is the preset's."""
    spec = MOE_PRESETS[preset_name].spec
    return next(m for m, s in MOE_SPECS.items() if s == spec)


@dataclass(frozen=True)
class Preset:
    """A named shape with its default model and input distribution."""

    name: str
    model: str
    shape: Shape
    dist: str
    about: str

    def case(self, dtype: str, model: str | None = None, seed: int = 0) -> Case:
        return Case(model=model or self.model, shape=self.shape, dtype=dtype, dist=self.dist, seed=seed)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("blog-linear", "linear", Shape(1024, 1, 32, 64), "normal", "the blog post's nn.Linear (1024x32 -> 64)"),
        Preset("blog-mlp", "geglu", Shape(64, 128, 768, 3072), "normal", "the blog post's GeGLU MLP; GPU-sized"),
        Preset("cpu-mlp", "geglu", Shape(8, 128, 768, 3072), "normal", "a CPU-sized GeGLU MLP (1024 tokens)"),
        Preset("tiny", "geglu", Shape(3, 37, 96, 328), "normal", "odd sizes, no multiple of any block size"),
        Preset("odd", "geglu", Shape(2, 33, 160, 200), "student_t", "odd sizes, heavy-tailed inputs (t, 3 dof)"),
        # Published models' MLP widths: hidden_size -> intermediate_size and hidden_act, each from the model's
        # config.json on its Hugging Face model card (named beside it). 16 tokens (batch 1, seq 16) by default, so
        # every backend, the interpreted ones included, finishes on a CPU in about a minute; --batch/--seq for more.
        # meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, intermediate_size 14336, hidden_act "silu"
        Preset("llama3-8b", "swiglu", Shape(1, 16, 4096, 14336), "normal", "Llama 3 8B MLP (4096 -> 14336, SwiGLU)"),
        # mistralai/Mistral-7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336, hidden_act "silu"
        Preset("mistral-7b", "swiglu", Shape(1, 16, 4096, 14336), "normal", "Mistral 7B MLP (4096 -> 14336, SwiGLU)"),
        # Qwen/Qwen2.5-7B config.json: hidden_size 3584, intermediate_size 18944, hidden_act "silu"
        Preset("qwen2.5-7b", "swiglu", Shape(1, 16, 3584, 18944), "normal", "Qwen2.5 7B MLP (3584 -> 18944, SwiGLU)"),
        # google/gemma-2b config.json: hidden_size 2048, intermediate_size 16384, hidden_act "gelu"; Gemma's GeGLU
        # runs the tanh form (transformers' GemmaMLP uses "gelu_pytorch_tanh", huggingface/transformers#29402)
        Preset("gemma-2b", "geglu", Shape(1, 16, 2048, 16384), "normal", "Gemma 2B MLP (2048 -> 16384, GeGLU)"),
        # google/gemma-7b config.json: hidden_size 3072, intermediate_size 24576, hidden_act "gelu" (as gemma-2b)
        Preset("gemma-7b", "geglu", Shape(1, 16, 3072, 24576), "normal", "Gemma 7B MLP (3072 -> 24576, GeGLU)"),
        # openai-community/gpt2 config.json: n_embd 768, n_inner null (= 4 * n_embd = 3072), activation_function
        # "gelu_new" (the tanh form)
        Preset("gpt2", "gelu-mlp", Shape(1, 16, 768, 3072), "normal", "GPT-2 small MLP (768 -> 3072, GELU tanh)"),
        # The MoE blocks of compare.problem.moe.MOE_PRESETS (sources beside them): the full-size ones and the CPU-sized
        # ones with the real expert count and top-k (dim 64, hidden 32, 24 tokens)
        *(
            Preset(p.name, moe_model(p.name), Shape(1, p.tokens, p.dim, p.hidden), "normal", p.about)
            for p in MOE_PRESETS.values()
        ),
    )
}


def preset(name: str) -> Preset:
    """Look up a preset by name; an unknown name raises :class:`InputError` listing the known ones."""
    check_name("preset", name, list(PRESETS))
    return PRESETS[name]


def resolve_shape(
    base: Shape | None,
    batch: int | None = None,
    seq: int | None = None,
    dim: int | None = None,
    hidden: int | None = None,
) -> Shape:
    """Apply command-line overrides to a preset's shape; with no preset every dimension must be given."""
    given = {"batch": batch, "seq": seq, "dim": dim, "hidden": hidden}
    if base is None:
        missing = [k for k, v in given.items() if v is None]
        if batch is None or seq is None or dim is None or hidden is None:
            raise InputError(f"without --preset, give every dimension; missing: {', '.join('--' + m for m in missing)}")
        return Shape(batch, seq, dim, hidden)
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


#: Cases whose golden files are committed under ``golden/``: small enough for the repository and the test suite.
COMMITTED_PRESETS: tuple[str, ...] = ("tiny", "odd", "blog-linear")


def committed_cases() -> list[Case]:
    """Every committed golden case: ``tiny`` and ``odd`` with every model, ``blog-linear`` with its own; every
    dtype."""
    return [
        PRESETS[name].case(dtype, model=model)
        for name in COMMITTED_PRESETS
        for model in ((PRESETS[name].model,) if name == "blog-linear" else MODELS)
        for dtype in DTYPES
    ]
