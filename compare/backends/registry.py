"""The backend registry: every implementation by name, loaded lazily.

A backend module (``torch_impl/backends/*.py``, ``jax_impl/backends/*.py``) exposes ``BACKEND``, an object with

- ``availability() -> Availability``: can it run here, and if not, why (imports its framework only now);
- ``prepare(problem, mode) -> Prepared``: builds the model from the weights of a
:class:`~compare.problem.golden.Problem`
  (the case, its inputs and weights, and no reference: a backend never sees the answer), moves inputs to the
  device once, and returns a zero-argument step plus how to sync and read its outputs.

Only ``compare.timing.timer`` times anything; backends only build callables.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from compare.backends.tp import Group, TPParts
from compare.problem import golden
from compare.problem.cases import (
    GLU_MODELS,
    MODELS,
    MODES,
    MODULE_MODEL,
    MOE_MODELS,
    REMAT_MODELS,
    TP_MODELS,
    check_name,
)

if TYPE_CHECKING:
    from compare.problem.golden import Problem


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
    #: (schema in ``compare.kernels.summary``); with a path it also writes a Chrome/Perfetto trace there.
    profile: Callable[[Path | None], dict[str, Any]] | None = None
    #: ``quick_profile(trace_path)``: ``profile`` on fewer steps (one warm-up, one profiled), for a budgeted run whose
    #: share leaves a slow step no more (``compare.run.budget``); None: ``profile`` is the only one.
    quick_profile: Callable[[Path | None], dict[str, Any]] | None = None
    #: Tensor-parallel backends only (``compare.backends.tp``): collectives, comm-only and compute-only twins, set-up.
    tp: TPParts | None = None
    #: ``bind(inputs, slot)`` returns the step (zero arguments, its output read as ``step``'s) on other inputs, the
    #: weights unchanged: ``inputs`` is ``{"x": [batch, seq, dim], "dy": [batch, seq, out]}``, float32 arrays of the
    #: case's shapes holding dtype values (as ``Problem.inputs``). The harness owns every input after the first call
    #: (``compare.run.pipeline.Feed``): each timed call is one it bound, to values no call has seen, and it rebinds
    #: ``slot`` (a small integer it reuses block after block) before it reads any output of that slot's last call.
    #: A runner writes a slot's new values into that slot's device buffers in place where it can (torch: without
    #: autograd's version bump, so a tensor's identity says nothing of its values) and otherwise drops the slot's
    #: old arrays (JAX: deleted). Set-up a mode needs per input (``bwd``'s forward) runs here, outside the timing.
    #: A backend without it is an error result, never a pass.
    bind: Callable[[dict[str, np.ndarray], int], Callable[[], Any]] | None = None
    #: ``memory()`` measures what one step holds in memory: the tensors its forward saves for the backward and its
    #: peak above its inputs and weights, as a dict of ``compare.results.memory.Memory`` (each figure with its
    #: source, or absent with the reason). Filled by the shared runners (``torch_impl.runner``,
    #: ``jax_impl.runner``) for every backend built on them; called once per cell, outside the timed samples. None:
    #: the result says "not measured", never 0.
    memory: Callable[[], dict[str, Any]] | None = None


class Backend(Protocol):
    name: str

    def availability(self) -> Availability: ...

    def prepare(self, problem: Problem, mode: str) -> Prepared: ...


class TPBackend(Protocol):
    """A tensor-parallel backend object (``compare.backends.tp``): its ``prepare`` also takes the process group."""

    name: str

    def availability(self) -> Availability: ...

    def prepare(self, problem: Problem, mode: str, group: Group) -> Prepared: ...


#: The framework a backend belongs to, by the top package of its target (a backend in any other package, such as a
#: test's, names its framework with ``framework=``).
FRAMEWORK_PACKAGES: dict[str, str] = {"torch_impl": "torch", "jax_impl": "jax"}


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """Registry entry: everything the core knows about a backend, in one line of keywords.

    ``target`` is the module that holds the backend object (``BACKEND``, whose ``name`` must be this entry's),
    imported only when needed; ``framework`` follows from its top package (:data:`FRAMEWORK_PACKAGES`). ``models``
    and ``modes`` say what it implements. ``plan`` is its cost-model plan (``compare.cost.model.PLANS``: which
    intermediates it keeps out of memory, which GEMMs it fuses), None if it is not modelled (no cost rows then);
    ``assumption`` says where that plan is assumed rather than read off the framework. ``shape_sweep`` lists the
    keyword variants with which it joins the compile-cost sweep (``compare.run.shape_sweep``): the backend object
    then implements ``shape_sweep(make, tokens, *, budget_s, **variant) -> rows``, building its own compiled forward
    per shape and reading its own recompile counter; empty means it does not join. ``kernels`` names the modules of the
    Triton kernels it launches: the GPU build (``compare gpu-build``) compiles exactly the kernels of the registered
    backends' modules. ``remat_of`` names the plain twin of a recomputation (activation checkpointing) variant: the
    same computation, keeping less for the backward and recomputing the rest there.
    """

    name: str
    target: str
    about: str
    #: Derived from ``target`` for the framework packages; given only for a backend outside them.
    framework: str = ""
    models: tuple[str, ...] = MODELS
    modes: tuple[str, ...] = MODES
    plan: str | None = None
    assumption: str = ""
    shape_sweep: tuple[dict[str, Any], ...] = ()
    #: Modules of the Triton kernels the backend launches (each declares its build entries, ``GPU_BUILD``).
    kernels: tuple[str, ...] = ()
    #: Tensor-parallel backends: the module of their worker runtime (``compare.backends.tp``); they run in worker
    #: processes started by ``compare.run.tp_launch``, at the case's world size. Empty for single-device backends.
    runtime: str = ""
    #: Tensor-parallel backends: their communication plan (``compare.cost.comm.COMM_PLANS``), checked byte for byte
    #: against the collectives they report.
    comm: str = ""
    #: Tensor-parallel backends: how their ranks can start (``compare.backends.tp.LAUNCHES``), the default first.
    launches: tuple[str, ...] = ("processes",)
    #: True for its framework's unfused baseline (one kernel per op, every intermediate in memory): what the fusion
    #: table measures the framework's other backends against (:func:`framework_baseline`). One per framework.
    baseline: bool = False
    #: A recomputation backend (``torch.utils.checkpoint``, ``jax.checkpoint``): the name of its plain twin, the same
    #: computation without recomputation, that the report weighs its memory saving and its extra time against
    #: (``compare.report.memory``). Empty for every other backend.
    remat_of: str = ""
    #: Another variant of a backend (max-autotune of torch-compile, XLA's GEMM fusion of jax-xla): the name of the
    #: backend it varies. Like a recomputation twin, it is outside the run's core comparison (:attr:`core`).
    twin_of: str = ""

    @property
    def core(self) -> bool:
        """Whether the backend is in the run's core comparison (every baseline and backend but the twins: neither
        :attr:`remat_of` nor :attr:`twin_of`): a budget gives its timing the paired test's rounds before it pays
        for anything else (``compare.run.harness``)."""
        return not (self.remat_of or self.twin_of)

    def __post_init__(self) -> None:
        derived = FRAMEWORK_PACKAGES.get(self.target.split(".")[0])
        if derived is not None:
            if self.framework not in ("", derived):
                raise ValueError(
                    f"backend {self.name!r}: its target {self.target} is a {derived} module, not {self.framework}"
                )
            object.__setattr__(self, "framework", derived)
        elif not self.framework:
            raise ValueError(
                f"backend {self.name!r}: its target {self.target} is outside the framework packages "
                f"({', '.join(FRAMEWORK_PACKAGES)}): name its framework with framework="
            )

    def load(self) -> Backend:
        module = importlib.import_module(self.target)
        return module.BACKEND

    def availability(self) -> Availability:
        """Availability, with an import failure of the backend module reported as the reason."""
        try:
            return self.load().availability()
        except ImportError as exc:
            return Availability(False, f"cannot import {self.target}: {exc}")


BACKENDS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec(
            name="torch-eager",
            target="torch_impl.backends.eager",
            about="PyTorch eager nn.Modules (the baseline)",
            plan="eager",
            shape_sweep=({},),
            baseline=True,
        ),
        BackendSpec(
            name="torch-eager-remat",
            target="torch_impl.backends.eager_remat",
            about=(
                "torch-eager with torch.utils.checkpoint (non-reentrant) around the activation and the GEMM that "
                "reads it: only the GEMM outputs the activation reads are kept, the rest recomputed in the backward"
            ),
            models=REMAT_MODELS,
            plan="eager-remat",
            remat_of="torch-eager",
        ),
        BackendSpec(
            name="torch-compile",
            target="torch_impl.backends.compiled",
            about="torch.compile (Inductor: fused C++ on CPU, Triton on GPU); twin: torch-compile-max-autotune",
            plan="fused-ew",
            shape_sweep=({"dynamic": False}, {"dynamic": True}),
        ),
        BackendSpec(
            name="torch-compile-max-autotune",
            twin_of="torch-compile",
            target="torch_impl.backends.compiled_max_autotune",
            about=(
                "torch.compile mode=max-autotune-no-cudagraphs (Inductor autotunes its GEMMs, templates included: "
                "the kernel table shows whether one absorbed the activation); twin of torch-compile"
            ),
            plan="fused-ew",
            shape_sweep=({"dynamic": False},),
            assumption=(
                "torch-compile's plan: Inductor may pick a GEMM template with the activation in its epilogue "
                "(then fused-gemm's forward); the kernel table says which it chose"
            ),
        ),
        BackendSpec(
            name="torch-triton",
            target="torch_impl.backends.triton_glu",
            kernels=("triton_impl.glu_kernels",),
            about=(
                "eager GEMMs + a hand-written Triton kernel for act(g) * u (GELU-tanh or SiLU, a compile-time "
                "parameter)"
            ),
            models=GLU_MODELS,
            plan="fused-ew",
            shape_sweep=({},),
        ),
        BackendSpec(
            name="torch-triton-fused",
            target="torch_impl.backends.triton_fused",
            kernels=("triton_impl.glu_matmul_kernels",),
            about=(
                "one Triton GEMM for act(x Wg^T) * (x Wu^T), activation in the epilogue (g, u never stored) + a "
                "down GEMM"
            ),
            models=GLU_MODELS,
            plan="fused-gemm",
        ),
        BackendSpec(
            name="jax-xla",
            target="jax_impl.backends.xla",
            about="flax.nnx modules under jax.jit (XLA fusion)",
            plan="fused-ew",
            shape_sweep=({},),
            assumption=(
                "assumed: XLA fuses the activation and the mul into one loop fusion and keeps g, u, h "
                "as torch-compile does; the HLO decides (cross-checked against XLA's cost_analysis "
                "in the report)"
            ),
        ),
        BackendSpec(
            name="jax-xla-remat",
            target="jax_impl.backends.xla_remat",
            about=(
                "jax-xla's forward under jax.checkpoint with the named policy save_only_these_names: only the GEMM "
                "outputs the activation reads are kept, the activation (and mul) recomputed in the backward"
            ),
            models=REMAT_MODELS,
            plan="fused-ew-remat",
            remat_of="jax-xla",
            assumption=(
                "assumed: XLA fuses the recomputed activation into one loop fusion as jax-xla's forward does; the "
                "residuals are read off jax (saved_residuals), the fusions off the HLO"
            ),
        ),
        BackendSpec(
            name="jax-xla-gemm-fusion",
            twin_of="jax-xla",
            target="jax_impl.backends.xla_gemm_fusion",
            about=(
                "jax-xla with XLA's GPU GEMM-fusion flags set (Triton GEMMs with fused epilogues, autotuned), "
                "in a process of its own (XLA reads its flags once); GPU only"
            ),
            plan="fused-ew",
            assumption="jax-xla's plan: XLA may fuse the activation into a Triton GEMM's epilogue; the HLO says",
        ),
        BackendSpec(
            name="jax-unfused",
            target="jax_impl.backends.unfused",
            about=(
                "the jax-xla module with each op (linear, activation, mul) its own jitted computation, called from "
                "Python and differentiated by jax.vjp outside any jit (JAX's unfused baseline)"
            ),
            plan="eager",
            baseline=True,
            assumption=(
                "eager's kernels and saved tensors (g, u, a, h; the activation keeps only its input), read off "
                "XLA's program per op; XLA splits some ops into more kernels than the plan counts: a weight "
                "gradient is a GEMM then a transpose copy (flax keeps kernels as [in, out]), a bias add runs after "
                "its GEMM (torch's addmm does it inside), 16-bit dtypes add converts"
            ),
        ),
        BackendSpec(
            name="jax-pallas",
            target="jax_impl.backends.pallas",
            about="nnx module under jax.jit with the gated activation step as a Pallas kernel (custom VJP)",
            models=GLU_MODELS,
            plan="fused-ew",
            assumption=(
                "gate/up/down are XLA dots (assumed unfused with the Pallas kernel); residuals g, u per custom_vjp"
            ),
        ),
        BackendSpec(
            name="jax-triton",
            target="jax_impl.backends.triton",
            kernels=("triton_impl.glu_kernels",),
            about="nnx module with torch-triton's very Triton kernel called through jax_triton",
            models=GLU_MODELS,
            plan="fused-ew",
            assumption="as torch-triton: XLA dots around a Triton elementwise kernel; residuals g, u",
        ),
        BackendSpec(
            name="torch-module",
            target="torch_impl.backends.module_eager",
            about="a user's own MLP file (--module): its torch_module eager, in the case dtype",
            models=(MODULE_MODEL,),
            shape_sweep=({},),
        ),
        BackendSpec(
            name="torch-module-compile",
            target="torch_impl.backends.module_compile",
            about="a user's own MLP file (--module): torch.compile of its torch_module (Inductor, dynamic=False)",
            models=(MODULE_MODEL,),
            shape_sweep=({"dynamic": False}, {"dynamic": True}),
        ),
        BackendSpec(
            name="torch-module-compile-max-autotune",
            twin_of="torch-module-compile",
            target="torch_impl.backends.module_compile_max_autotune",
            about="a user's own MLP file (--module): torch-module-compile with mode=max-autotune-no-cudagraphs",
            models=(MODULE_MODEL,),
            shape_sweep=({"dynamic": False},),
        ),
        BackendSpec(
            name="jax-module",
            target="jax_impl.backends.module_jit",
            about="a user's own MLP file (--module): jax.jit of its jax_function, backward by jax.vjp",
            models=(MODULE_MODEL,),
            shape_sweep=({},),
        ),
        BackendSpec(
            name="jax-module-unfused",
            target="jax_impl.backends.module_unfused",
            about=(
                "a user's own MLP file (--module): its jax_function without jit, op by op from Python (JAX's "
                "unfused baseline of jax-module)"
            ),
            models=(MODULE_MODEL,),
        ),
        BackendSpec(
            name="torch-moe-loop",
            target="torch_impl.backends.moe_loop",
            about=(
                "a MoE block eager, transformers' form: a Python loop over the experts with tokens (gather, gate_up "
                "and down mm, index_add_); routing in float32 for 16-bit dtypes"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="torch-moe-grouped",
            target="torch_impl.backends.moe_grouped",
            about=(
                "a MoE block with the token-expert assignments sorted by expert and each expert GEMM one grouped_mm "
                "over all experts (on CPU torch runs it as a loop of mm); routing in float32 for 16-bit dtypes"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="torch-moe-loop-compile",
            target="torch_impl.backends.moe_loop_compile",
            about="torch-moe-loop under torch.compile (Inductor; graph breaks at the loop over the experts hit)",
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="torch-moe-grouped-compile",
            target="torch_impl.backends.moe_grouped_compile",
            about="torch-moe-grouped under torch.compile (Inductor, fullgraph: the grouped form has fixed shapes)",
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="torch-moe-triton",
            target="torch_impl.backends.moe_triton",
            kernels=("triton_impl.moe_kernels",),
            about=(
                "a MoE block with hand-written Triton grouped GEMMs for the experts: gate_up with the gated "
                "activation in its epilogue (gate, up never stored), then down; router, sort and combine in torch"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="jax-moe-dense",
            target="jax_impl.backends.moe_dense",
            about=(
                "a MoE block under jax.jit as the one-hot dense baseline: every token through every expert (E / k "
                "times the routed FLOPs), combined with weights zero off each token's top k"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="jax-moe-ragged",
            target="jax_impl.backends.moe_ragged",
            about=(
                "a MoE block under jax.jit, routed: assignments sorted by expert, jax.lax.ragged_dot over the "
                "experts' row groups (on CPU a masked dense dot), a scatter-add back to the tokens"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="jax-moe-pallas",
            target="jax_impl.backends.moe_pallas",
            about=(
                "a MoE block under jax.jit with Pallas grouped GEMMs for the experts (gate_up with the gated "
                "activation in its epilogue, then down; interpret=True without a GPU); backward by jax.vjp of a "
                "ragged_dot reference"
            ),
            models=MOE_MODELS,
        ),
        BackendSpec(
            name="torch-tp",
            target="torch_impl.backends.tp_dtensor",
            about="DTensor tensor parallelism: ColwiseParallel gate/up (fc1), RowwiseParallel down (fc2), eager",
            models=TP_MODELS,
            plan="eager",
            runtime="torch_impl.tp_runtime",
            comm="megatron",
        ),
        BackendSpec(
            name="torch-tp-compile",
            target="torch_impl.backends.tp_compile",
            about="torch-tp's DTensor module under torch.compile (Inductor)",
            models=TP_MODELS,
            plan="fused-ew",
            runtime="torch_impl.tp_runtime",
            comm="megatron",
        ),
        BackendSpec(
            name="torch-tp-manual",
            target="torch_impl.backends.tp_manual",
            about=(
                "hand-written Megatron TP: local weight slices, one dist.all_reduce of y forward and one of dx backward"
            ),
            models=TP_MODELS,
            plan="eager",
            runtime="torch_impl.tp_runtime",
            comm="megatron",
        ),
        BackendSpec(
            name="torch-tp-triton",
            target="torch_impl.backends.tp_triton",
            kernels=("triton_impl.glu_kernels",),
            about="torch-tp's DTensor plan with torch-triton's act(g) * u Triton kernel on the local slices",
            models=GLU_MODELS,
            plan="fused-ew",
            runtime="torch_impl.tp_runtime",
            comm="megatron",
        ),
        BackendSpec(
            name="jax-tp",
            target="jax_impl.backends.tp_sharded",
            about=(
                "the flax.nnx module with partitioned params under jax.jit: XLA's SPMD partitioner places the "
                "collectives"
            ),
            models=TP_MODELS,
            plan="fused-ew",
            runtime="jax_impl.tp_runtime",
            comm="xla-auto",
            launches=("devices", "processes"),
        ),
        BackendSpec(
            name="jax-tp-shardmap",
            target="jax_impl.backends.tp_shardmap",
            about=(
                "hand-written Megatron TP in jax.shard_map: explicit psum of y and of dx; the Pallas act(g) * u "
                "kernel per shard for GeGLU/SwiGLU"
            ),
            models=TP_MODELS,
            plan="fused-ew",
            runtime="jax_impl.tp_runtime",
            comm="megatron-combined",
            launches=("devices", "processes"),
        ),
    )
}
DEFAULT_BASELINE = "torch-eager"
#: What a module case's (``--module``) speedups are measured against: its own torch module, eager (``torch-eager``,
#: a built-in model's baseline, skips a module case).
MODULE_BASELINE = "torch-module"
#: What a mixture-of-experts case's speedups are measured against: its block eager, transformers' loop over the
#: experts (``torch-eager``, a dense model's baseline, skips a MoE case).
MOE_BASELINE = "torch-moe-loop"


def baseline_of(model: str) -> str:
    """The backend a case of ``model`` is timed against: :data:`DEFAULT_BASELINE`, a module case's
    :data:`MODULE_BASELINE`, a MoE case's :data:`MOE_BASELINE`."""
    if model in MOE_MODELS:
        return MOE_BASELINE
    return MODULE_BASELINE if model == MODULE_MODEL else DEFAULT_BASELINE


def baselines_said(models: Iterable[str]) -> str:
    """The baseline of a report's speedups in words, for the cases of ``models`` (:func:`baseline_of`):
    ``torch-eager``, ``torch-module``, or ``torch-eager (torch-module for a case of your own MLP file)``; a MoE
    case's (``torch-moe-loop``) likewise."""
    found = set(models)
    own, moe = MODULE_MODEL in found, bool(found & set(MOE_MODELS))
    built_in = bool(found - {MODULE_MODEL} - set(MOE_MODELS))
    first = DEFAULT_BASELINE if built_in else MODULE_BASELINE if own else MOE_BASELINE if moe else DEFAULT_BASELINE
    others = [f"{MODULE_BASELINE} for a case of your own MLP file"] * (own and first != MODULE_BASELINE)
    others += [f"{MOE_BASELINE} for a mixture-of-experts case"] * (moe and first != MOE_BASELINE)
    return f"{first} ({'; '.join(others)})" if others else first


#: The statuses whose row gets no speedup: a step that does not compute its answer (or did not run) has no speed
#: worth comparing (a failing row read "151.20x").
NO_SPEEDUP = ("parity-fail", "implausible", "error", "skipped")


def framework_baseline(framework: str) -> str | None:
    """The unfused baseline of ``framework`` (its registry line with ``baseline=True``), None if it has none."""
    return next((s.name for s in BACKENDS.values() if s.baseline and s.framework == framework), None)


#: A module case's (``--module``) unfused baseline per framework, what its fusion is measured against: the file's
#: torch module eager, its ``jax_function`` op by op (a built-in model's are the registry lines with ``baseline``).
MODULE_FRAMEWORK_BASELINES: dict[str, str] = {"torch": "torch-module", "jax": "jax-module-unfused"}


#: A MoE case's unfused baseline per framework: its block eager in torch (JAX has none yet: its two MoE backends are
#: jitted).
MOE_FRAMEWORK_BASELINES: dict[str, str] = {"torch": MOE_BASELINE}


def unfused_baseline(framework: str, model: str) -> str | None:
    """The unfused baseline of ``framework`` on a case of ``model``: a module case's
    (:data:`MODULE_FRAMEWORK_BASELINES`), a MoE case's (:data:`MOE_FRAMEWORK_BASELINES`), else
    :func:`framework_baseline`; None if it has none."""
    if model == MODULE_MODEL:
        return MODULE_FRAMEWORK_BASELINES.get(framework)
    if model in MOE_MODELS:
        return MOE_FRAMEWORK_BASELINES.get(framework)
    return framework_baseline(framework)


def spec(name: str) -> BackendSpec:
    """Look up a backend; an unknown name raises ``InputError`` listing the known ones."""
    check_name("backend", name, list(BACKENDS))
    return BACKENDS[name]


def register(s: BackendSpec) -> None:
    """Add a backend (tests and extensions add backends through this, never by editing callers)."""
    BACKENDS[s.name] = s


def unregister(name: str) -> None:
    """Remove a backend added by :func:`register` (tests clean up with this)."""
    BACKENDS.pop(name, None)


#: Probes the core calls without importing a framework: module targets loaded like backends. ``ceilings`` exposes
#: ``measure_all(dtypes, budget_s) -> {"device": str, dtype: {...}}`` (this machine's matmul FLOP/s and copy
#: bandwidth per dtype, on the device the torch backends use); ``ceilings-xla`` the same through XLA's own GEMMs
#: (``jax_impl.ceilings``): the harness keeps the higher per dtype.
#: ``flush`` exposes ``device_flush() -> (CacheSize, Flush) | None``: the GPU's L2 and a flush of it
#: (``compare.timing.llc``), None when the steps run on the CPU (the harness then flushes the CPU's caches).
#: ``cuda-graphs`` exposes ``capture(step) -> Captured | NotCaptured``: a torch step captured in a CUDA graph.
#: ``module-file`` is a user's own MLP file (``Case.module``): ``describe(path, batch, seq, dim, hidden) ->
#: ModuleFile``, ``reference(case, x, params, dy)`` (its float64 golden), ``plain_run(case, x, params, dy)`` (the
#: gate's yardstick, ``reference.plain_run``'s three parts), ``compute(case, x, params, dy, ar)`` (another
#: ``Arith``), ``spot_reference(case, x, params, dy)`` (a few tokens' ``y`` and ``dx`` in float32: the every-call
#: check's), ``kernels_run(case, x, params, dy, dtype)`` (its ``y`` and gradients through torch's own float32 or
#: float64 kernels: the fresh draw's range screen and reference), ``check_module(case)`` (its values: a real
#: forward, tokens apart), ``check_plain(case, backward)`` (a rule for every op), ``check_reference(case)``
#: (the file's own numpy ``reference`` against the golden) and ``matmul_flops(case, mode)`` (the GEMM FLOPs of
#: one step of its torch module, or None).
PROBES: dict[str, str] = {
    "ceilings": "torch_impl.ceilings",
    "ceilings-xla": "jax_impl.ceilings",
    "flush": "torch_impl.flush",
    "cuda-graphs": "torch_impl.cuda_graphs",
    "module-file": "torch_impl.user_module",
}


@dataclass(frozen=True)
class OutputReader:
    """How the harness itself reads what a step returned, not through the backend's ``to_numpy``
    (``compare.run.pipeline.Feed``): ``sync(outputs)``, the framework's device-wide wait (torch: every CUDA stream;
    JAX: every array of the pytree); ``arrays(output)``, its leaves, each a materialised array of the framework's own
    type (a ``TypeError`` naming the first that is not: an object that computes when read); ``rows(array, rows)``,
    rows of one array seen as ``[T, last]`` in float64 host memory."""

    sync: Callable[[Any], None]
    arrays: Callable[[Any], list[Any]]
    rows: Callable[[Any, np.ndarray], np.ndarray]


def _numpy_arrays(output: Any) -> list[Any]:
    leaves = (
        list(output.values())
        if isinstance(output, dict)
        else list(output)
        if isinstance(output, tuple | list)
        else [output]
    )
    for leaf in leaves:
        if type(leaf) is not np.ndarray:
            raise TypeError(f"its output holds a {type(leaf).__module__}.{type(leaf).__qualname__}, not a numpy array")
    return leaves


#: The reader of a backend outside torch and JAX (a test's numpy backend): a flat tuple, list or dict of arrays.
NUMPY_READER = OutputReader(
    lambda _outputs: None, _numpy_arrays, lambda a, rows: np.asarray(a, np.float64).reshape(-1, a.shape[-1])[rows]
)


def output_reader(framework: str) -> OutputReader:
    """The :class:`OutputReader` of ``framework`` (its package's ``device`` module; :data:`NUMPY_READER` for any
    other), imported now."""
    package = next((p for p, f in FRAMEWORK_PACKAGES.items() if f == framework), None)
    if package is None:
        return NUMPY_READER
    dev = importlib.import_module(f"{package}.device")
    return OutputReader(dev.sync, dev.output_arrays, dev.array_rows)


def probe(name: str) -> Any:
    """The module of a probe (:data:`PROBES`), imported now; ImportError when its framework is missing."""
    check_name("probe", name, list(PROBES))
    return importlib.import_module(PROBES[name])


def module_file() -> Any:
    """The ``module-file`` probe (:data:`PROBES`): the computations of a user's own MLP file, imported now."""
    return probe("module-file")


# The problem layer computes a module case's data through this (it loads no framework itself).
golden.MODULE_FILE[:] = [module_file]
