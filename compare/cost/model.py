"""An analytic model of what each backend moves through memory per step, and the roofline it implies.

Pure Python (no torch, no jax): a function of the :class:`~compare.problem.cases.Case`, the backend name and the mode.

The model
    A step is a list of kernels. Each kernel reads each of its operands once and writes each of its results once
    (ideal caching inside a kernel: a GEMM's re-reads of its tiles are not counted). A tensor's traffic is
    ``bytes * (reads + writes)``; ``bytes`` of a step is the sum over every tensor. ``flops`` is the GEMM FLOPs
    (``2 * M * N * K`` per GEMM); elementwise FLOPs are counted apart in ``ew_flops`` (tanh counted as one FLOP).
    ``intermediate_bytes`` is the traffic of the intermediates alone (activations and their gradients: what
    fusion can keep out of memory), not their size: the ``bytes`` field of each tensor entry is its size.

GeGLU, ``T`` tokens, ``D`` = dim, ``H`` = hidden, ``s`` = itemsize; ``g = gate(x)``, ``u = up(x)``,
``a = gelu_tanh(g)``, ``h = a * u``, ``y = down(h)``, all ``[T, H]`` except ``x, y [T, D]``.

====================  ==============================================  =================================
plan                  forward kernels                                 saved for the backward
====================  ==============================================  =================================
``eager``             gate GEMM, up GEMM, GELU (g -> a),              g, u, a, h (GELU saves its input,
                      mul (a, u -> h), down GEMM: 5                   mul both inputs, down its input)
``fused-ew``          gate GEMM, up GEMM, one fused elementwise       g, u, h; the backward kernel
                      kernel (g, u -> h; ``a`` never reaches          recomputes gelu(g) from g
                      memory), down GEMM: 4
``fused-gemm``        one kernel computes the gate and up tiles       x (an input), h; the backward
                      from x and writes only h (g, u never            recomputes g and u with two GEMMs
                      written), down GEMM: 2                          (``4 * T * D * H`` more FLOPs)
``eager-remat``       ``eager``'s 5                                   g, u (``torch.utils.checkpoint``
                                                                      around the activation and the down
                                                                      GEMM); the backward first reruns
                                                                      GELU, mul and the down GEMM (its
                                                                      output dropped): 3 more kernels
``fused-ew-remat``    ``fused-ew``'s 4                                g, u (``jax.checkpoint``, named
                                                                      policy); the backward first
                                                                      recomputes h with the fused kernel
====================  ==============================================  =================================

GPT-2's MLP under the recomputation plans keeps only ``f = fc1(x) + b1``: ``eager-remat`` reruns GELU and the fc2
addmm, ``fused-ew-remat`` GELU alone, before the backward.

Which backend follows which plan is the backend's registry line (``compare.backends.registry``: ``plan=``), with its
``assumption`` where the plan is assumed rather than read off the framework; a backend with no plan has no cost
rows, explicitly.

Backward (given ``dy``): ``dh = dy @ W_down`` and ``ddown = dy^T h`` (2 GEMMs); the elementwise backward
(``eager``: ``da = dh * u``, ``du = dh * a``, ``dg = da * gelu'(g)``, 3 kernels; the fused plans: one kernel
reading dh, g, u and writing dg, du); ``dx = dg @ W_gate + du @ W_up`` (2 GEMMs, the first writing a
``[T, D]`` partial that is read back: an in-place add kernel in ``eager``/``fused-ew``, as Inductor's CPU
backward and eager autograd do it; an ``addmm`` in ``fused-gemm``); ``dgate = dg^T x``,
``dup = du^T x`` (2 GEMMs). ``fwd+bwd`` is the forward's kernels then the backward's; in ``bwd`` the saved
tensors are only read (the forward that wrote them is outside the step).

``nn.Linear`` (``y = x W^T + b``): one ``addmm`` forward; backward ``dx`` GEMM, ``dweight`` GEMM and a ``dbias``
reduction, the same for every backend that implements it.

What is measured, what is assumed
    ``eager`` and ``fused-ew`` were read off the frameworks (autograd's saved tensors; Inductor's generated CPU
    code: ``extern mm`` x 2, one ``cpp_fused_gelu_mul`` kernel, saved ``mm, mm_1, view`` = g, u, h; backward
    ``cpp_fused_gelu_backward_mul`` then ``cpp_fused_add`` for dx); ``fused-gemm`` follows the fused Triton step's
    ``autograd.Function``. Where a backend's plan is an assumption (XLA decides its own fusions and residuals), its
    registry line says so, and the report cross-checks it against XLA's own ``cost_analysis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compare.backends.registry import BACKENDS, BackendSpec, spec
from compare.cost.records import Achieved, Ceiling, Cost, CostTensor
from compare.problem.cases import MODES, Case, InputError, check_name

#: Bytes per element of each case dtype.
ITEMSIZE: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

#: The recomputation plans (activation checkpointing; see the module docstring), each over the plan whose kernels it
#: runs: the forward is that plan's, and the backward first recomputes the activation from the GEMM outputs it reads.
REMAT_PLANS: dict[str, str] = {"eager-remat": "eager", "fused-ew-remat": "fused-ew"}
#: The plans (see the module docstring) a backend's registry line may name.
PLANS: tuple[str, ...] = ("eager", "fused-ew", "fused-gemm", *REMAT_PLANS)
#: The GEMM outputs an activation reads (GLU: g, u; GPT-2's MLP: f): what a recomputation plan keeps.
PRE_ACTIVATION: frozenset[str] = frozenset({"g", "u", "f"})

#: Elementwise FLOPs per element (tanh counted as one): gelu_tanh(g) = 0.5 g (1 + tanh(k (g + c g^3))) is 9.
GELU_FLOPS = 9
#: gelu_tanh'(g) times the incoming gradient, sharing nothing with a forward evaluation.
GELU_GRAD_FLOPS = 16
#: silu(s) = s * sigmoid(s) = s / (1 + exp(-s)): negate, exp, add, divide, multiply (exp counted as one) is 5.
SILU_FLOPS = 5
#: silu'(s) = sigmoid(s) (1 + s (1 - sigmoid(s))) times the incoming gradient: sigmoid 4, then 1 - ., s * ., 1 + .,
#: sigmoid * . and * the gradient: 9, sharing nothing with a forward evaluation.
SILU_GRAD_FLOPS = 9

ROLES: tuple[str, ...] = ("input", "weight", "intermediate", "output", "gradient")


@dataclass(frozen=True)
class Kernel:
    """One kernel of the model: the tensors it reads and writes (each once), its GEMM and elementwise FLOPs."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    flops: int = 0
    ew_flops: int = 0


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an ``[m, k] @ [k, n]`` product: ``2 * m * n * k`` (one multiply and one add per term)."""
    return 2 * m * n * k


def _tensor_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (2-D shape, role) of every tensor the model of ``case`` can touch (tokens flattened)."""
    s = case.shape
    t, d, h = s.tokens, s.dim, s.hidden
    if case.model == "linear":
        return {
            "x": ((t, d), "input"),
            "weight": ((h, d), "weight"),
            "bias": ((h,), "weight"),
            "y": ((t, h), "output"),
            "dy": ((t, h), "input"),
            "dx": ((t, d), "gradient"),
            "dweight": ((h, d), "gradient"),
            "dbias": ((h,), "gradient"),
        }
    act = ((t, h), "intermediate")
    if case.model == "gelu-mlp":  # f = fc1(x) + b1, a = gelu(f), y = fc2(a) + b2
        return {
            "x": ((t, d), "input"),
            "fc1": ((h, d), "weight"),
            "b1": ((h,), "weight"),
            "fc2": ((d, h), "weight"),
            "b2": ((d,), "weight"),
            "f": act,
            "a": act,
            "y": ((t, d), "output"),
            "dy": ((t, d), "input"),
            "da": act,
            "df": act,
            "dx": ((t, d), "gradient"),
            "dfc1": ((h, d), "gradient"),
            "db1": ((h,), "gradient"),
            "dfc2": ((d, h), "gradient"),
            "db2": ((d,), "gradient"),
        }
    return {  # the GLU families (geglu, swiglu): g = gate(x), u = up(x), a = act(g), h = a * u
        "x": ((t, d), "input"),
        "gate": ((h, d), "weight"),
        "up": ((h, d), "weight"),
        "down": ((d, h), "weight"),
        "g": act,
        "u": act,
        "a": act,
        "h": act,
        "y": ((t, d), "output"),
        "dy": ((t, d), "input"),
        "dh": act,
        "da": act,
        "dg": act,
        "du": act,
        "dx_partial": ((t, d), "intermediate"),
        "dx": ((t, d), "gradient"),
        "dgate": ((h, d), "gradient"),
        "dup": ((h, d), "gradient"),
        "ddown": ((d, h), "gradient"),
    }


def _linear_kernels(case: Case, mode: str) -> list[Kernel]:
    t, d, h = case.shape.tokens, case.shape.dim, case.shape.hidden
    fwd = [Kernel("addmm (x W^T + b)", ("x", "weight", "bias"), ("y",), gemm_flops(t, h, d), t * h)]
    bwd = [
        Kernel("dx GEMM (dy W)", ("dy", "weight"), ("dx",), gemm_flops(t, d, h)),
        Kernel("dweight GEMM (dy^T x)", ("dy", "x"), ("dweight",), gemm_flops(h, d, t)),
        Kernel("dbias reduction (sum dy)", ("dy",), ("dbias",), 0, t * h),
    ]
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


#: Per GLU family: (the activation's name in kernel names, its FLOPs, its gradient's FLOPs, the family's name).
_GLU_ACT: dict[str, tuple[str, int, int, str]] = {
    "geglu": ("gelu", GELU_FLOPS, GELU_GRAD_FLOPS, "GeGLU"),
    "swiglu": ("silu", SILU_FLOPS, SILU_GRAD_FLOPS, "SwiGLU"),
}


def _glu_kernels(case: Case, plan: str, mode: str) -> list[Kernel]:
    """The kernels of a GLU family (``geglu``, ``swiglu``) under ``plan`` (the module docstring's GeGLU table; SwiGLU
    has the same kernels with SiLU's FLOP counts, :data:`SILU_FLOPS` and :data:`SILU_GRAD_FLOPS`)."""
    act, act_flops, act_grad_flops, family = _GLU_ACT[case.model]
    t, d, h = case.shape.tokens, case.shape.dim, case.shape.hidden
    up_proj = gemm_flops(t, h, d)  # gate and up: [T, D] @ [D, H]
    down_proj = gemm_flops(t, d, h)  # down, dh and each dx term: [T, H] @ [H, D] (or its transpose)
    wgrad = gemm_flops(h, d, t)  # dgate, dup, ddown: a [H, T] @ [T, D] product
    th = t * h
    gate = Kernel("gate GEMM", ("x", "gate"), ("g",), up_proj)
    up = Kernel("up GEMM", ("x", "up"), ("u",), up_proj)
    down = Kernel("down GEMM", ("h", "down"), ("y",), down_proj)
    if plan == "eager":
        fwd = [
            gate,
            up,
            Kernel(f"{act} (g -> a)", ("g",), ("a",), 0, act_flops * th),
            Kernel("mul (a * u -> h)", ("a", "u"), ("h",), 0, th),
            down,
        ]
    elif plan == "fused-ew":
        fwd = [gate, up, Kernel(f"fused {act}*mul (g, u -> h)", ("g", "u"), ("h",), 0, (act_flops + 1) * th), down]
    else:
        fwd = [
            Kernel(
                f"fused gate+up GEMM, {family} epilogue (x -> h)",
                ("x", "gate", "up"),
                ("h",),
                2 * up_proj,
                (act_flops + 1) * th,
            ),
            down,
        ]
    bwd = [
        Kernel("dh GEMM (dy W_down)", ("dy", "down"), ("dh",), down_proj),
        Kernel("ddown GEMM (dy^T h)", ("dy", "h"), ("ddown",), wgrad),
    ]
    fused_bwd = Kernel(
        f"fused {act}*mul backward (dh, g, u -> dg, du)",
        ("dh", "g", "u"),
        ("dg", "du"),
        0,
        (act_flops + act_grad_flops + 2) * th,
    )  # recomputes act(g); du = dh a, dg = dh u a'
    if plan == "eager":
        bwd += [
            Kernel("mul backward (dh * u -> da)", ("dh", "u"), ("da",), 0, th),
            Kernel("mul backward (dh * a -> du)", ("dh", "a"), ("du",), 0, th),
            Kernel(f"{act} backward (da, g -> dg)", ("da", "g"), ("dg",), 0, act_grad_flops * th),
        ]
    elif plan == "fused-ew":
        bwd += [fused_bwd]
    else:
        bwd += [
            Kernel("recompute g GEMM", ("x", "gate"), ("g",), up_proj),
            Kernel("recompute u GEMM", ("x", "up"), ("u",), up_proj),
            fused_bwd,
        ]
    bwd.append(Kernel("dx GEMM (dg W_gate)", ("dg", "gate"), ("dx_partial",), down_proj))
    if plan == "fused-gemm":
        bwd.append(Kernel("dx addmm (dx_partial + du W_up)", ("du", "up", "dx_partial"), ("dx",), down_proj, t * d))
    else:
        bwd += [
            Kernel("dx GEMM (du W_up)", ("du", "up"), ("dx",), down_proj),
            Kernel("dx add (dx += dx_partial)", ("dx", "dx_partial"), ("dx",), 0, t * d),
        ]
    bwd += [
        Kernel("dgate GEMM (dg^T x)", ("dg", "x"), ("dgate",), wgrad),
        Kernel("dup GEMM (du^T x)", ("du", "x"), ("dup",), wgrad),
    ]
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _gelu_mlp_kernels(case: Case, plan: str, mode: str) -> list[Kernel]:
    """The kernels of ``gelu-mlp`` (``y = fc2(gelu(fc1(x) + b1)) + b2``; ``f = fc1(x) + b1``, ``a = gelu(f)``).

    Forward, both plans: ``fc1`` addmm (bias in the GEMM's epilogue, one bias add per output), GELU (``f -> a``),
    ``fc2`` addmm: 3 kernels, saving ``f`` (GELU's input) and ``a`` (``fc2``'s input). Backward: ``da = dy W_fc2``,
    ``dfc2 = dy^T a``, ``db2 = sum dy``, ``df = da * gelu'(f)``, ``dx = df W_fc1``, ``dfc1 = df^T x``,
    ``db1 = sum df``. ``eager`` runs each as its own kernel (7, as autograd's addmm and GELU backward do);
    ``fused-ew`` fuses the ``db2`` reduction into the GELU backward kernel (6: read off Inductor's CPU code,
    ``cpp_fused_gelu_gelu_backward_sum``, then a ``db1`` sum kernel). ``fused-gemm`` has no gelu-mlp kernels.
    """
    if plan not in ("eager", "fused-ew"):
        raise InputError(f"no gelu-mlp cost model for plan {plan!r}; modelled plans: eager, fused-ew")
    t, d, h = case.shape.tokens, case.shape.dim, case.shape.hidden
    th = t * h
    fwd = [
        Kernel("fc1 addmm (x fc1^T + b1 -> f)", ("x", "fc1", "b1"), ("f",), gemm_flops(t, h, d), th),
        Kernel("gelu (f -> a)", ("f",), ("a",), 0, GELU_FLOPS * th),
        Kernel("fc2 addmm (a fc2^T + b2 -> y)", ("a", "fc2", "b2"), ("y",), gemm_flops(t, d, h), t * d),
    ]
    bwd = [
        Kernel("da GEMM (dy W_fc2)", ("dy", "fc2"), ("da",), gemm_flops(t, h, d)),
        Kernel("dfc2 GEMM (dy^T a)", ("dy", "a"), ("dfc2",), gemm_flops(d, h, t)),
    ]
    if plan == "eager":
        bwd += [
            Kernel("db2 reduction (sum dy)", ("dy",), ("db2",), 0, t * d),
            Kernel("gelu backward (da, f -> df)", ("da", "f"), ("df",), 0, GELU_GRAD_FLOPS * th),
        ]
    else:
        bwd.append(
            Kernel(
                "fused gelu backward + db2 reduction (da, f, dy -> df, db2)",
                ("da", "f", "dy"),
                ("df", "db2"),
                0,
                GELU_GRAD_FLOPS * th + t * d,
            )
        )
    bwd += [
        Kernel("dx GEMM (df W_fc1)", ("df", "fc1"), ("dx",), gemm_flops(t, d, h)),
        Kernel("dfc1 GEMM (df^T x)", ("df", "x"), ("dfc1",), gemm_flops(h, d, t)),
        Kernel("db1 reduction (sum df)", ("df",), ("db1",), 0, th),
    ]
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _remat_kernels(case: Case, plan: str, mode: str) -> list[Kernel]:
    """A recomputation plan (:data:`REMAT_PLANS`): its base plan's forward; its backward first recomputes the forward's
    tail, the kernels after the last one that writes a GEMM output the activation reads (:data:`PRE_ACTIVATION`),
    then runs the base plan's backward. ``eager-remat`` recomputes the whole tail, its GEMM included (non-reentrant
    ``torch.utils.checkpoint`` reruns its region up to the last tensor it saved, and the down GEMM's input is saved
    by the GEMM itself: the GEMM reruns and its output is dropped); ``fused-ew-remat`` only the tail's elementwise
    kernels (``jax.checkpoint`` recomputes what the backward reads, the activation's output)."""
    base = REMAT_PLANS[plan]
    fwd = _model_kernels(case, base, "fwd")
    last = max(i for i, k in enumerate(fwd) if PRE_ACTIVATION & set(k.writes))
    tail = [k for k in fwd[last + 1 :] if plan == "eager-remat" or k.flops == 0]
    recompute = [Kernel(f"recompute {k.name}", k.reads, k.writes, k.flops, k.ew_flops) for k in tail]
    bwd = recompute + _model_kernels(case, base, "bwd")
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _model_kernels(case: Case, plan: str, mode: str) -> list[Kernel]:
    """The kernels of one step of ``case.model`` under ``plan`` in ``mode``."""
    if case.model == "linear":
        if plan in REMAT_PLANS:
            raise InputError(f"plan {plan!r} recomputes an activation; model 'linear' has none")
        return _linear_kernels(case, mode)
    if plan in REMAT_PLANS:
        return _remat_kernels(case, plan, mode)
    if case.model == "gelu-mlp":
        return _gelu_mlp_kernels(case, plan, mode)
    return _glu_kernels(case, plan, mode)


def _saved(kernels_fwd: list[Kernel], kernels_bwd: list[Kernel]) -> list[str]:
    """Tensors the backward reads that the forward wrote (the activations kept alive between them), in the
    forward's order."""
    needed: set[str] = set()
    written_bwd: set[str] = set()
    for k in kernels_bwd:
        needed.update(n for n in k.reads if n not in written_bwd)
        written_bwd.update(k.writes)
    out: list[str] = []
    for k in kernels_fwd:
        out += [n for n in k.writes if n in needed and n not in out]
    return out


def check_backend(backend: str | BackendSpec, model: str | None = None) -> str:
    """Return the plan of ``backend`` (its registry line, or the name of one); an unknown backend, one without a
    plan (not modelled) or one that does not implement ``model`` raises :class:`InputError` naming what is allowed."""
    s = spec(backend) if isinstance(backend, str) else backend
    if s.plan is None:
        modelled = [b.name for b in BACKENDS.values() if b.plan is not None]
        raise InputError(f"no cost model for backend {s.name!r}; modelled backends: {', '.join(modelled)}")
    check_name("plan", s.plan, PLANS)
    if model is not None and model not in s.models:
        raise InputError(f"backend {s.name!r} implements model(s) {', '.join(s.models)} only, not {model!r}")
    return s.plan


def cost(case: Case, backend: str | BackendSpec, mode: str) -> Cost:
    """The modelled cost of one step of ``backend`` (its registry line, or the name of one) on ``case`` in ``mode``
    (see the module docstring).

    Returns a :class:`~compare.cost.records.Cost`: ``flops`` (GEMM FLOPs), ``ew_flops``, ``bytes`` (all traffic),
    ``tensors`` (each ``name, shape, bytes`` (its size), ``role, reads, writes``), ``intermediate_bytes`` (traffic
    of the intermediates), ``materialized`` (intermediates that reach memory), ``saved`` (written by the forward,
    read by the backward), ``arithmetic_intensity`` (FLOP per byte), ``model_kernels`` (kernel names) and
    ``model_kernels_per_step``, ``plan`` and ``assumption``; no ``achieved`` (:func:`roofline` makes it).
    """
    s = spec(backend) if isinstance(backend, str) else backend
    plan = check_backend(s, case.model)
    check_name("mode", mode, MODES)
    itemsize = ITEMSIZE[case.dtype]
    kernels = _model_kernels(case, plan, mode)
    # linear: nothing but the input x is kept for the backward (its forward writes only y)
    saved = _saved(_model_kernels(case, plan, "fwd"), _model_kernels(case, plan, "bwd")) if mode != "fwd" else []
    shapes = _tensor_shapes(case)
    counts: dict[str, list[int]] = {}  # name -> [reads, writes], in order of first use
    for k in kernels:
        for n in k.reads:
            counts.setdefault(n, [0, 0])[0] += 1
        for n in k.writes:
            counts.setdefault(n, [0, 0])[1] += 1
    tensors = []
    for name, (reads, writes) in counts.items():
        shape, role = shapes[name]
        tensors.append(CostTensor(name, shape, math.prod(shape) * itemsize, role, reads, writes))
    total = sum(t.bytes * (t.reads + t.writes) for t in tensors)
    inter = [t for t in tensors if t.role == "intermediate"]
    flops = sum(k.flops for k in kernels)
    return Cost(
        backend=s.name,
        plan=plan,
        mode=mode,
        dtype=case.dtype,
        flops=flops,
        ew_flops=sum(k.ew_flops for k in kernels),
        bytes=total,
        arithmetic_intensity=flops / total,
        tensors=tuple(tensors),
        intermediate_bytes=sum(t.bytes * (t.reads + t.writes) for t in inter),
        materialized=tuple(t.name for t in inter),
        saved=tuple(n for n in saved if n in counts),
        model_kernels=tuple(k.name for k in kernels),
        model_kernels_per_step=len(kernels),
        assumption=s.assumption,
    )


def removed(c: Cost, base: Cost) -> tuple[str, ...]:
    """What ``c``'s plan removes from ``base``'s (the unfused baseline's cost on the same case and mode): the
    intermediates ``base`` writes to memory that ``c`` does not, then ``"N kernel(s)"`` when it runs N fewer (a
    fused GEMM, elementwise op or reduction). Empty: the plan keeps every intermediate in memory and fuses nothing
    (``eager-remat`` in every mode, every plan of ``linear``, ``fused-ew`` on ``gelu-mlp`` forward), so a time it
    saves over ``base`` is not fusion's. It reads the model's kernels and ``materialized``, not a measurement."""
    kernels = base.model_kernels_per_step - c.model_kernels_per_step
    fewer = (f"{kernels} kernel(s)",) if kernels > 0 else ()
    return tuple(n for n in base.materialized if n not in c.materialized) + fewer


def roofline(cost: Cost, median_s: float, ceiling: Ceiling) -> Achieved:
    """Achieved rates of a measured step against this machine's ceilings, and the roofline-predicted time.

    ``ceiling`` holds the peak ``flops_per_s`` and ``bytes_per_s``. Returns ``flops_per_s``, ``bytes_per_s``
    (achieved, from the model's FLOPs and bytes over ``median_s``), ``flops_fraction``, ``bytes_fraction`` (of the
    ceilings), ``predicted_s = max(flops / peak_flops, bytes / peak_bw)``, ``bound`` (``compute`` or ``memory``,
    whichever term is larger), ``roofline_fraction = predicted_s / median_s`` and ``ridge_intensity`` (FLOP/byte
    where the two ceilings meet).
    """
    peak_f, peak_b = float(ceiling.flops_per_s), float(ceiling.bytes_per_s)
    if not (median_s > 0 and peak_f > 0 and peak_b > 0):
        raise ValueError(
            f"roofline needs positive times and ceilings; got median_s={median_s}, "
            f"flops_per_s={peak_f}, bytes_per_s={peak_b}"
        )
    flops, nbytes = cost.flops, cost.bytes
    t_f, t_b = flops / peak_f, nbytes / peak_b
    predicted = max(t_f, t_b)
    return Achieved(
        flops_per_s=flops / median_s,
        bytes_per_s=nbytes / median_s,
        flops_fraction=flops / median_s / peak_f,
        bytes_fraction=nbytes / median_s / peak_b,
        predicted_s=predicted,
        bound="compute" if t_f >= t_b else "memory",
        roofline_fraction=predicted / median_s,
        ridge_intensity=peak_f / peak_b,
    )
