"""An analytic model of what each backend moves through memory per step, and the roofline it implies.

Pure Python (no torch, no jax): a function of the :class:`~compare.cases.Case`, the backend name and the mode.

The model
    A step is a list of kernels. Each kernel reads each of its operands once and writes each of its results once
    (ideal caching inside a kernel: a GEMM's re-reads of its tiles are not counted). A tensor's traffic is
    ``bytes * (reads + writes)``; ``bytes`` of a step is the sum over every tensor. ``flops`` is the GEMM FLOPs
    (``2 * M * N * K`` per GEMM); elementwise FLOPs are counted apart in ``ew_flops`` (tanh counted as one FLOP).
    ``intermediate_bytes`` is the traffic of the intermediates alone (activations and their gradients: what
    fusion can keep out of memory), not their size: the ``bytes`` field of each tensor entry is its size.

GeGLU, ``T`` tokens, ``D`` = dim, ``H`` = hidden, ``s`` = itemsize; ``g = gate(x)``, ``u = up(x)``,
``a = gelu_tanh(g)``, ``h = a * u``, ``y = down(h)``, all ``[T, H]`` except ``x, y [T, D]``.

==============  ==============================================  =================================
plan            forward kernels                                 saved for the backward
==============  ==============================================  =================================
``eager``       gate GEMM, up GEMM, GELU (g -> a),              g, u, a, h (GELU saves its input,
                mul (a, u -> h), down GEMM: 5                   mul both inputs, down its input)
``fused-ew``    gate GEMM, up GEMM, one fused elementwise       g, u, h; the backward kernel
                kernel (g, u -> h; ``a`` never reaches          recomputes gelu(g) from g
                memory), down GEMM: 4
``fused-gemm``  one kernel computes the gate and up tiles       x (an input), h; the backward
                from x and writes only h (g, u never            recomputes g and u with two GEMMs
                written), down GEMM: 2                          (``4 * T * D * H`` more FLOPs)
==============  ==============================================  =================================

Which backend follows which plan is the backend's registry line (``compare.registry``: ``plan=``), with its
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
from typing import Any

from compare.cases import MODES, Case, InputError, check_name

#: Bytes per element of each case dtype.
ITEMSIZE: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

#: The plans (see the module docstring) a backend's registry line may name.
PLANS: tuple[str, ...] = ("eager", "fused-ew", "fused-gemm")

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


def _model_kernels(case: Case, plan: str, mode: str) -> list[Kernel]:
    """The kernels of one step of ``case.model`` under ``plan`` in ``mode``."""
    if case.model == "linear":
        return _linear_kernels(case, mode)
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


def check_backend(backend: str, model: str | None = None) -> str:
    """Return the plan of ``backend`` from its registry line; an unknown backend, one without a plan (not modelled)
    or one that does not implement ``model`` raises :class:`InputError` naming what is allowed."""
    from compare.registry import BACKENDS, spec

    s = spec(backend)
    if s.plan is None:
        modelled = [b.name for b in BACKENDS.values() if b.plan is not None]
        raise InputError(f"no cost model for backend {backend!r}; modelled backends: {', '.join(modelled)}")
    check_name("plan", s.plan, PLANS)
    if model is not None and model not in s.models:
        raise InputError(f"backend {backend!r} implements model(s) {', '.join(s.models)} only, not {model!r}")
    return s.plan


def cost(case: Case, backend: str, mode: str) -> dict[str, Any]:
    """The modelled cost of one step of ``backend`` on ``case`` in ``mode`` (see the module docstring).

    Returns a JSON-able dict: ``flops`` (GEMM FLOPs), ``ew_flops``, ``bytes`` (all traffic), ``tensors`` (each
    ``name, shape, bytes`` (its size), ``role, reads, writes``), ``intermediate_bytes`` (traffic of the
    intermediates), ``materialized`` (intermediates that reach memory), ``saved`` (written by the forward, read
    by the backward), ``arithmetic_intensity`` (FLOP per byte), ``model_kernels`` (kernel names) and
    ``model_kernels_per_step``, ``plan`` and ``assumption``.
    """
    plan = check_backend(backend, case.model)
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
    tensors: list[dict[str, Any]] = []
    for name, (reads, writes) in counts.items():
        shape, role = shapes[name]
        tensors.append(
            {
                "name": name,
                "shape": list(shape),
                "bytes": math.prod(shape) * itemsize,
                "role": role,
                "reads": reads,
                "writes": writes,
            }
        )
    total = sum(t["bytes"] * (t["reads"] + t["writes"]) for t in tensors)
    inter = [t for t in tensors if t["role"] == "intermediate"]
    flops = sum(k.flops for k in kernels)
    return {
        "backend": backend,
        "plan": plan,
        "mode": mode,
        "dtype": case.dtype,
        "flops": flops,
        "ew_flops": sum(k.ew_flops for k in kernels),
        "bytes": total,
        "arithmetic_intensity": flops / total,
        "tensors": tensors,
        "intermediate_bytes": sum(t["bytes"] * (t["reads"] + t["writes"]) for t in inter),
        "materialized": [t["name"] for t in inter],
        "saved": [n for n in saved if n in counts],
        "model_kernels": [k.name for k in kernels],
        "model_kernels_per_step": len(kernels),
        "assumption": _assumption(backend),
    }


def _assumption(backend: str) -> str:
    from compare.registry import spec

    return spec(backend).assumption


def roofline(cost: dict[str, Any], median_s: float, ceilings: dict[str, Any]) -> dict[str, Any]:
    """Achieved rates of a measured step against this machine's ceilings, and the roofline-predicted time.

    ``ceilings = {"flops_per_s": float, "bytes_per_s": float}``. Returns ``flops_per_s``, ``bytes_per_s`` (achieved,
    from the model's FLOPs and bytes over ``median_s``), ``flops_fraction``, ``bytes_fraction`` (of the ceilings),
    ``predicted_s = max(flops / peak_flops, bytes / peak_bw)``, ``bound`` (``compute`` or ``memory``, whichever term
    is larger), ``roofline_fraction = predicted_s / median_s`` and ``ridge_intensity`` (FLOP/byte where the two
    ceilings meet).
    """
    peak_f, peak_b = float(ceilings["flops_per_s"]), float(ceilings["bytes_per_s"])
    if not (median_s > 0 and peak_f > 0 and peak_b > 0):
        raise ValueError(
            f"roofline needs positive times and ceilings; got median_s={median_s}, "
            f"flops_per_s={peak_f}, bytes_per_s={peak_b}"
        )
    flops, nbytes = cost["flops"], cost["bytes"]
    t_f, t_b = flops / peak_f, nbytes / peak_b
    predicted = max(t_f, t_b)
    return {
        "flops_per_s": flops / median_s,
        "bytes_per_s": nbytes / median_s,
        "flops_fraction": flops / median_s / peak_f,
        "bytes_fraction": nbytes / median_s / peak_b,
        "predicted_s": predicted,
        "bound": "compute" if t_f >= t_b else "memory",
        "roofline_fraction": predicted / median_s,
        "ridge_intensity": peak_f / peak_b,
    }


# ---------------------------------------------------------------------------------------------------------------
# Report sections: pure functions of a results document.
# ---------------------------------------------------------------------------------------------------------------

Doc = dict[str, Any]


def si(x: float | None, unit: str) -> str:
    """``x`` with a decimal SI prefix and 3 significant digits, e.g. ``38.7 GFLOP``, ``50.3 MB``; None is ``-``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _signed_s(s: float | None) -> str:
    from compare.markdown import fmt_s

    if s is None:
        return "-"
    return ("-" if s < 0 else "") + fmt_s(abs(s))


def ceilings_for(doc: Doc, dtype: str) -> dict[str, Any] | None:
    """The measured ceilings of ``dtype`` in ``doc["ceilings"]``, or None."""
    c = (doc.get("ceilings") or {}).get(dtype)
    return c if isinstance(c, dict) and c.get("flops_per_s") and c.get("bytes_per_s") else None


def achieved(doc: Doc, r: Doc) -> dict[str, Any] | None:
    """A result's roofline numbers: stored under ``cost["achieved"]``, else computed from its timing and the
    document's ceilings (still a function of the document alone); None without timing or ceilings."""
    c = r.get("cost")
    if not c:
        return None
    if c.get("achieved"):
        return c["achieved"]
    ceil = ceilings_for(doc, r["dtype"])
    t = r.get("timing")
    if not ceil or not t or not t.get("median_s"):
        return None
    return roofline(c, t["median_s"], ceil)


def _label(r: Doc) -> str:
    from compare.markdown import case_label

    return case_label(r)


def _find_baseline(results: list[Doc], r: Doc, baseline: str) -> Doc | None:
    for b in results:
        if b["backend"] == baseline and b["case"] == r["case"] and b["mode"] == r["mode"] and b.get("cost"):
            return b
    return None


def fusion_benefit(doc: Doc) -> list[dict[str, Any]]:
    """Per non-baseline backend with a cost, against the baseline (``DEFAULT_BASELINE``) on the same case (dtype
    included) and mode.

    Each row: ``backend, case, label, dtype, mode``; ``kernels_eliminated`` (eager's measured
    ``kernels_per_step`` minus this backend's, None unless both were profiled) and ``model_kernels_eliminated``;
    ``intermediate_bytes_saved`` (intermediate traffic no longer written and read) and ``bytes_saved`` (all
    traffic, e.g. x read once instead of twice); ``extra_flops`` (recompute); ``predicted_saved_s`` =
    ``bytes_saved / bytes_per_s`` and ``predicted_extra_flops_s`` = ``extra_flops / flops_per_s`` (None without
    ceilings); ``measured_saved_s`` = eager median - this median and ``measured_verdict``, this backend's timing
    against eager's by :func:`compare.significance.compare_timing` ("faster", "slower" or "within noise": then the
    difference is not a measured saving, whatever its sign); both None unless both were timed.
    """
    from compare.registry import DEFAULT_BASELINE
    from compare.significance import compare_timing

    results = doc.get("results", [])
    rows = []
    for r in results:
        c = r.get("cost")
        if r["backend"] == DEFAULT_BASELINE or not c:
            continue
        base = _find_baseline(results, r, DEFAULT_BASELINE)
        if base is None:
            continue
        bc = base["cost"]
        k_r, k_b = (r.get("kernels") or {}).get("kernels_per_step"), (base.get("kernels") or {}).get("kernels_per_step")
        ceil = ceilings_for(doc, r["dtype"])
        t_r, t_b = r.get("timing"), base.get("timing")
        bytes_saved = bc["bytes"] - c["bytes"]
        extra_flops = c["flops"] - bc["flops"]
        rows.append(
            {
                "backend": r["backend"],
                "case": r["case"],
                "label": _label(r),
                "dtype": r["dtype"],
                "mode": r["mode"],
                "kernels_eliminated": k_b - k_r if k_r is not None and k_b is not None else None,
                "model_kernels_eliminated": bc["model_kernels_per_step"] - c["model_kernels_per_step"],
                "intermediate_bytes_saved": bc["intermediate_bytes"] - c["intermediate_bytes"],
                "bytes_saved": bytes_saved,
                "extra_flops": extra_flops,
                "not_materialized": [n for n in bc["materialized"] if n not in c["materialized"]],
                "predicted_saved_s": bytes_saved / ceil["bytes_per_s"] if ceil else None,
                "predicted_extra_flops_s": extra_flops / ceil["flops_per_s"] if ceil else None,
                "measured_saved_s": t_b["median_s"] - t_r["median_s"] if t_r and t_b else None,
                "measured_verdict": compare_timing(t_b, t_r).verdict if t_r and t_b else None,
                "baseline_median_s": t_b["median_s"] if t_b else None,
                "median_s": t_r["median_s"] if t_r else None,
            }
        )
    return rows


def _measured_saved(f: dict[str, Any]) -> str:
    """The measured saving of a fusion-benefit row: a number only when the difference is beyond noise."""
    from compare.significance import WITHIN_NOISE

    if f["measured_saved_s"] is None:
        return "-"
    if f.get("measured_verdict") == WITHIN_NOISE:
        return WITHIN_NOISE
    return _signed_s(f["measured_saved_s"])


def fusion_section(doc: Doc) -> str:
    """Markdown: what fusion buys each backend over the baseline, predicted from bytes and measured side by side."""
    from compare.markdown import fmt_s, table
    from compare.registry import DEFAULT_BASELINE

    rows = fusion_benefit(doc)
    if not rows:
        return ""
    out = []
    for f in rows:
        kern = "-" if f["kernels_eliminated"] is None else str(f["kernels_eliminated"])
        out.append(
            [
                f["backend"],
                f["label"],
                f["dtype"],
                f["mode"],
                f"{kern} (model {f['model_kernels_eliminated']})",
                ", ".join(f["not_materialized"]) or "none",
                si(f["intermediate_bytes_saved"], "B"),
                si(f["bytes_saved"], "B"),
                _signed_s(f["predicted_saved_s"]),
                si(f["extra_flops"], "FLOP") if f["extra_flops"] else "0",
                _signed_s(f["predicted_extra_flops_s"]) if f["extra_flops"] else "-",
                _measured_saved(f),
                fmt_s(f["baseline_median_s"]),
            ]
        )
    head = [
        "backend",
        "case",
        "dtype",
        "mode",
        "kernels eliminated",
        "not in memory",
        "intermediate traffic saved",
        "bytes saved",
        "predicted saved (bytes / bandwidth)",
        "extra GEMM FLOPs",
        "their time at peak",
        "measured saved",
        f"{DEFAULT_BASELINE} median",
    ]
    intro = (
        f"Each backend against {DEFAULT_BASELINE} on the same case, dtype and mode. Kernels eliminated: "
        f"{DEFAULT_BASELINE}'s profiled kernels per step minus this backend's ('-' where either was not "
        "profiled; the cost model's count in brackets). Bytes saved come from the cost model (below): "
        "intermediates no longer written and read back, and inputs read fewer times. Predicted saved = bytes "
        "saved / this machine's measured copy bandwidth; a backend that recomputes (extra GEMM FLOPs) pays "
        "them back at the measured matmul rate. Measured saved = the two medians' difference, shown only where "
        "it is beyond both runs' noise (the rule of `compare diff`: median ratio outside the band of both "
        "IQRs, quartiles apart, a Mann-Whitney test), else 'within noise'. Negative means slower or more "
        "traffic."
    )
    return "## What fusion buys\n\n" + intro + "\n\n" + table(head, out)


def _ceilings_rows(doc: Doc) -> list[list[str]]:
    from compare.markdown import fmt_s

    ceils = doc.get("ceilings") or {}
    rows = []
    for dtype, c in ceils.items():
        if not isinstance(c, dict) or "flops_per_s" not in c:
            continue
        tim = c.get("timing") or {}
        mm = tim.get("matmul") or {}
        cp = tim.get("copy") or {}
        shape = "x".join(str(n) for n in c.get("matmul_shape", [])) or "?"
        how = (
            f"{dtype} matmul {shape} (2MNK FLOPs), median {fmt_s(mm.get('median_s'))}; copy of "
            f"{si(c.get('copy_bytes'), 'B')} (read + write counted), median {fmt_s(cp.get('median_s'))}"
        )
        rows.append(
            [
                str(ceils.get("device", "")),
                dtype,
                si(c["flops_per_s"], "FLOP/s"),
                si(c["bytes_per_s"], "B/s"),
                si(c["flops_per_s"] / c["bytes_per_s"], "FLOP/B"),
                how,
            ]
        )
    return rows


def cost_section(doc: Doc) -> str:
    """Markdown: per result, modelled FLOPs and bytes, intensity, achieved rates against the measured ceilings."""
    from compare.markdown import fmt_s, table

    rows = []
    for r in doc.get("results", []):
        c = r.get("cost")
        if not c:
            continue
        a = achieved(doc, r)
        t = r.get("timing")
        rows.append(
            [
                r["backend"],
                _label(r),
                r["dtype"],
                r["mode"],
                si(c["flops"], "FLOP"),
                si(c["bytes"], "B"),
                f"{c['arithmetic_intensity']:.3g}",
                ", ".join(c["materialized"]) or "none",
                str(c["model_kernels_per_step"]),
                fmt_s(t["median_s"]) if t else "-",
                f"{si(a['flops_per_s'], 'FLOP/s')} ({a['flops_fraction']:.0%})" if a else "-",
                f"{si(a['bytes_per_s'], 'B/s')} ({a['bytes_fraction']:.0%})" if a else "-",
                f"{fmt_s(a['predicted_s'])} ({a['bound']})" if a else "-",
            ]
        )
    ceil_rows = _ceilings_rows(doc)
    if not rows and not ceil_rows:
        return ""
    parts = ["## Cost model and roofline"]
    if rows:
        head = [
            "backend",
            "case",
            "dtype",
            "mode",
            "GEMM FLOPs",
            "bytes moved",
            "FLOP/byte",
            "intermediates in memory",
            "model kernels",
            "median",
            "achieved FLOP/s (of ceiling)",
            "achieved bytes/s (of ceiling)",
            "roofline time (bound)",
        ]
        assumed = sorted(
            {
                f"- {r['backend']}: {r['cost']['assumption']}"
                for r in doc.get("results", [])
                if r.get("cost") and r["cost"].get("assumption")
            }
        )
        intro = (
            "FLOPs and bytes are modelled, not counted (compare/costmodel.py): FLOPs are the GEMMs' 2MNK; "
            "bytes assume each kernel reads each operand and writes each result once, so bytes moved is a "
            "lower bound for the unfused backends' real traffic. Achieved rates divide them by the measured "
            "median; a fraction above 100% means the step beat the single-shape ceiling below. Roofline time "
            "= max(FLOPs / peak FLOP/s, bytes / peak bandwidth)."
        )
        parts.append(intro + "\n\n" + table(head, rows) + ("\n\n" + "\n".join(assumed) if assumed else ""))
    if ceil_rows:
        parts.append(
            "Ceilings, measured on this machine through the shared timer:\n\n"
            + table(["device", "dtype", "peak FLOP/s", "peak bytes/s", "ridge", "how measured"], ceil_rows)
        )
    return "\n\n".join(parts)
