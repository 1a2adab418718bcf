"""The plain same-dtype computation of any torch ``nn.Module``: the parity gate's yardstick for a user's own module.

``compare.problem.reference`` computes the plain run of the four built-in models from their formulas. Here the
module itself runs, in float64 on the CPU, under :class:`PlainMode`, a ``TorchDispatchMode`` that sees every aten op
of the forward and of autograd's backward (``torch.autograd.grad``) and computes each one with the project's own
arithmetic, bits fixed by the data (``compare.problem.fixedbits``), in an :class:`~compare.problem.reference.Arith`:

- every tensor operand is read through ``ar.rnd`` (an inner tensor: rounded to the case dtype in the plain run);
- every result is stored as ``ar.rnd(result, out=True)`` (with ``final=False`` the unrounded float32 accumulator, as
  the reference leaves its outputs; the next read rounds it, and rounding twice is rounding once);
- GEMMs (``mm``, ``addmm``, ``bmm``, ``mv``, ``dot``) are ``Arith``'s: ``Arith.mm``, ``Arith.addmm`` with the bias
  in the epilogue, added in ``ar.acc``; float32 sequential over ``k`` without FMA in the plain run (in a float64
  arithmetic a float32-valued operand goes in as float32, as the reference's twins pass it:
  :meth:`PlainMode.gemm_operand`); a ``sum`` over dimensions is ``Arith.colsum`` (a GEMM with a row of ones over
  the reduced elements, row-major), as the reference sums a bias gradient over the tokens;
- elementwise arithmetic (``add sub rsub mul div neg pow``) in float64 from the rounded operands, stored: a
  product of two dtype values is exact in float64; a sum or quotient rounds twice (float64, then the dtype), as the
  reference's does. A Python scalar operand is taken in ``ar.acc`` (float32 in the plain run: an eager kernel's
  opmath);
- activations by kind (``torch_impl.plain_acts``) through ``acts_for(kind)``, a (value, derivative) pair
  (``reference.Activations``): ``gelu`` (``approximate='tanh'``: ``gelu_tanh``, ``'none'``, ``nn.GELU()``'s
  default: ``gelu_erf``), ``silu`` and ``mish`` and their backward ops, ``rnd(grad) * derivative(rnd(input))`` in
  float64, as the reference's ``dg = rnd(da * act_grad(g))``; ``tanh`` and ``sigmoid`` take their value from
  ``acts_for`` and compute their backward from the saved output in float64 (``grad (1 - y^2)``, ``grad y (1 - y)``);
  ``relu`` and its ``threshold_backward`` are exact (no kind: nothing to be a few ulps off), and so is squared ReLU
  (``relu(x) ** 2`` and ``torch.square`` dispatch ``pow``; its backward ``pow``, ``mul`` and ``threshold_backward``);
- view, copy and creation ops pass through untouched (:data:`PASS_THROUGH`): they move or make values, they do no
  arithmetic.

Shapes: ``x [..., in]`` and ``dy`` (the shape of the module's output) are float arrays holding case-dtype values;
the module runs as it is when it is float64 on the CPU, else on such a copy (exact). :func:`plain_compute` returns
``y``, ``dx`` and ``d<name>`` for every parameter (``state_dict`` names, order and shapes) as float64 arrays;
:func:`plain_run_module` gives the three computations of ``reference.plain_run``.

What it cannot see, each an :class:`UnsupportedOp` naming the op (never a silent fallback to torch's arithmetic):
aten ops without a rule (normalisations, reductions other than ``sum``, ``exp``/``log``/``erf`` on their own,
indexing, ``where``, comparisons: anything integer or boolean, which the module would compute in its own dtype);
``out=`` variants (in-place ``op_`` forms of the rules are computed, then copied into their tensor); casts to
another dtype inside the module (``.float()``); RNG ops (dropout in training mode: call ``module.eval()``); a GEMM
scaled by ``alpha``/``beta``; integer or boolean operands of an arithmetic rule. Nothing runs on another device
(a GPU module's kernels are not seen: it runs on a float64 CPU copy). Every activation with a rule has its envelope
and signature twins (``plain_acts.KINDS``); a kind without them would raise ``plain_acts.NoActivation``.
``torch_impl.user_module`` turns either refusal into the one-line input error of a module file (exit status 2).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from compare.problem.reference import Activations, Arith, signatures
from torch_impl.plain_acts import ActsFor, acts_envelope, acts_plain, acts_signature

__all__ = [
    "PASS_THROUGH",
    "PlainMode",
    "UnsupportedOp",
    "compute_under",
    "plain_compute",
    "plain_run_module",
    "supported_ops",
]

aten = torch.ops.aten


class UnsupportedOp(NotImplementedError):
    """An op (or an operand of one) the plain computation has no rule for."""


#: Ops that move, view or make values without arithmetic: run by torch as they are. ``copy_`` and ``_to_copy`` only
#: within float64 (checked: a cast would round).
_PASS_NAMES = """view _unsafe_view reshape _reshape_alias t transpose permute expand detach alias clone contiguous
    squeeze unsqueeze slice select split split_with_sizes unbind narrow cat stack lift_fresh zeros_like ones_like
    empty_like full_like new_zeros new_ones new_empty new_empty_strided zero_ copy_ _to_copy"""
PASS_THROUGH = frozenset(getattr(aten, name) for name in _PASS_NAMES.split())


def _bind(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``func``'s arguments by their schema names, defaults filled in."""
    bound = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


class PlainMode(TorchDispatchMode):
    """Computes every aten op in ``ar`` (module docstring); ``acts_for`` gives the activations by kind. ``kinds``
    collects the activation kinds the run met."""

    def __init__(self, ar: Arith, acts_for: ActsFor) -> None:
        super().__init__()
        self.ar = ar
        self.acts_for = acts_for
        self.kinds: set[str] = set()

    def read(self, t: torch.Tensor) -> np.ndarray:
        """A tensor operand's values rounded as a read of a materialised tensor (``ar.rnd``), float64."""
        if t.dtype != torch.float64:
            raise UnsupportedOp(f"a {t.dtype} operand: the plain computation works on floating values only")
        return np.asarray(self.ar.rnd(t.detach().numpy()), dtype=np.float64)

    def gemm_operand(self, t: torch.Tensor) -> np.ndarray:
        """:meth:`read` for a GEMM; in a float64 arithmetic a float32-valued operand is handed over as float32.

        ``reference.plain_run``'s float64 twins pass numpy the float32 golden arrays (x, dy, the weights) as they
        are, and numpy multiplies two float32 arrays in float32 (the twins' last bits, which the gate does not read,
        depend on it); here every operand is float64, so its values decide. Nothing changes for the plain run (its
        GEMM takes float32) or the float64 reference (``matmul64`` takes float64)."""
        a = self.read(t)
        if self.ar.dtype is None:
            with np.errstate(over="ignore"):
                a32 = a.astype(np.float32)
            if np.array_equal(a32, a):
                return a32
        return a

    def scalar(self, v: object) -> float:
        """A Python scalar operand as the kernel's opmath takes it: in ``ar.acc``."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise UnsupportedOp(f"a {type(v).__name__} scalar operand: only int and float scalars have a rule")
        return float(self.ar.acc(v))

    def operand(self, v: object) -> np.ndarray | float:
        """A tensor (:meth:`read`) or a Python scalar (:meth:`scalar`)."""
        return self.read(v) if isinstance(v, torch.Tensor) else self.scalar(v)

    def store(self, a: np.ndarray | float) -> np.ndarray:
        """A result as the tensor it writes: ``ar.rnd(a, out=True)``."""
        return self.ar.rnd(np.asarray(a, dtype=np.float64), out=True)

    def activation(self, kind: str) -> Activations:
        """``acts_for(kind)``, the kind noted in :attr:`kinds`."""
        self.kinds.add(kind)
        return self.acts_for(kind)

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in PASS_THROUGH:
            _check_copy(func, args, kwargs)
            return func(*args, **kwargs)
        name = packet.__name__
        inplace = name.endswith("_") and not name.startswith("_")
        rule = _RULES.get(getattr(aten, name[:-1], None) if inplace else packet)
        if rule is None or any(arg.is_out for arg in func._schema.arguments):
            raise UnsupportedOp(
                f"the plain computation has no rule for {func}; aten ops with a rule: {', '.join(supported_ops())} "
                "(and their in-place forms); passed through untouched: "
                + ", ".join(sorted(p.__name__ for p in PASS_THROUGH))
            )
        stored = torch.from_numpy(np.array(rule(self, _bind(func, args, kwargs)), dtype=np.float64))
        return args[0].copy_(stored) if inplace else stored


def _check_copy(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A copy or ``_to_copy`` that would cast (round) or leave the CPU is refused."""
    packet = func.overloadpacket
    if packet is aten.copy_ and args[1].dtype != args[0].dtype:
        raise UnsupportedOp(f"{func} from {args[1].dtype} into {args[0].dtype}: a cast inside the module")
    if packet is aten._to_copy:
        dtype, device = kwargs.get("dtype"), kwargs.get("device")
        if dtype not in (None, args[0].dtype) or (device is not None and torch.device(device).type != "cpu"):
            raise UnsupportedOp(f"{func} to dtype={dtype} device={device}: a cast or a move inside the module")


# The rules: bound arguments (schema names) -> the stored result (``PlainMode.store``, or an ``Arith`` method with
# ``out=True``, which rounds the same way).
Rule = Callable[[PlainMode, dict[str, Any]], np.ndarray]


def _unscaled(n: dict[str, Any], op: str) -> None:
    if n.get("alpha", 1) != 1 or n.get("beta", 1) != 1:
        raise UnsupportedOp(f"{op} with alpha={n.get('alpha', 1)} beta={n.get('beta', 1)}: only 1 has a rule")


def _mm(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.ar.mm(m.gemm_operand(n["self"]), m.gemm_operand(n["mat2"]), out=True)


def _addmm(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    """``bias + mat1 @ mat2``: ``Arith.addmm`` takes the weight as ``(out, in)``, so ``mat2`` transposed."""
    _unscaled(n, "addmm")
    return m.ar.addmm(m.gemm_operand(n["mat1"]), m.gemm_operand(n["mat2"]).T, m.read(n["self"]), out=True)


def _bmm(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    a, b = m.gemm_operand(n["self"]), m.gemm_operand(n["mat2"])
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]))
    for i in range(a.shape[0]):
        out[i] = m.ar.mm(a[i], b[i], out=True)
    return out


def _mv(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.ar.mm(m.gemm_operand(n["self"]), m.gemm_operand(n["vec"])[:, None], out=True)[:, 0]


def _dot(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.ar.mm(m.gemm_operand(n["self"])[None, :], m.gemm_operand(n["tensor"])[:, None], out=True)[0, 0]


def _sum(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    """A sum over ``dim`` (all of them when None or empty, as torch's): the reduced elements, row-major, as the rows
    of ``Arith.colsum`` (in ``acc``, rounded once)."""
    if n.get("dtype") not in (None, torch.float64):
        raise UnsupportedOp(f"sum to dtype {n['dtype']}: a cast inside the module")
    a = m.gemm_operand(n["self"])
    dims = sorted({d % a.ndim for d in n.get("dim") or range(a.ndim)}) if a.ndim else []
    kept = [d for d in range(a.ndim) if d not in dims]
    rows = math.prod(a.shape[d] for d in dims)
    total = m.ar.colsum(np.transpose(a, [*dims, *kept]).reshape(rows, -1))
    shape = [1 if d in dims else a.shape[d] for d in range(a.ndim)] if n.get("keepdim") else [a.shape[d] for d in kept]
    return total.reshape(shape)


def _add(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    a, b, alpha = m.operand(n["self"]), m.operand(n["other"]), m.scalar(n.get("alpha", 1))
    return m.store(a + (b if alpha == 1 else alpha * b))


def _sub(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    a, b, alpha = m.operand(n["self"]), m.operand(n["other"]), m.scalar(n.get("alpha", 1))
    return m.store(a - (b if alpha == 1 else alpha * b))


def _rsub(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    """``other - alpha * self``."""
    a, b, alpha = m.operand(n["self"]), m.operand(n["other"]), m.scalar(n.get("alpha", 1))
    return m.store(b - (a if alpha == 1 else alpha * a))


def _mul(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.store(np.multiply(m.operand(n["self"]), m.operand(n["other"])))


def _div(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    if n.get("rounding_mode") is not None:
        raise UnsupportedOp(f"div with rounding_mode={n['rounding_mode']!r}: only true division has a rule")
    return m.store(np.divide(m.operand(n["self"]), m.operand(n["other"])))


def _neg(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.store(-m.read(n["self"]))


def _pow(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    """``self ** e`` for a whole ``e >= 0``: products left to right in float64 (``x * x`` exact for dtype values),
    stored. Other exponents (a root, a reciprocal) would need a transcendental or a division: no rule."""
    e = n["exponent"]
    if isinstance(e, torch.Tensor | bool) or not float(e).is_integer() or e < 0:
        raise UnsupportedOp(f"pow with exponent {e!r}: only whole exponents >= 0 have a rule")
    x = m.read(n["self"])
    out = np.ones_like(x)
    for _ in range(int(e)):
        out = out * x
    return m.store(out)


def _act_kind(m: PlainMode, n: dict[str, Any], kind: str) -> Activations:
    """GELU's kind from its ``approximate`` argument; the others as named."""
    if kind == "gelu":
        kind = {"tanh": "gelu_tanh", "none": "gelu_erf"}[n.get("approximate", "none")]
    return m.activation(kind)


def _act(kind: str) -> Rule:
    def rule(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
        return m.store(_act_kind(m, n, kind)[0](m.read(n["self"])))

    return rule


def _act_backward(kind: str) -> Rule:
    """``rnd(grad) * derivative(rnd(input))`` in float64, stored (the reference's ``rnd(da * act_grad(g))``)."""

    def rule(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
        derivative = _act_kind(m, n, kind)[1]
        return m.store(m.read(n["grad_output"]) * derivative(m.read(n["self"])))

    return rule


def _tanh_backward(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    y = m.read(n["output"])
    return m.store(m.read(n["grad_output"]) * (1.0 - y * y))


def _sigmoid_backward(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    y = m.read(n["output"])
    return m.store(m.read(n["grad_output"]) * (y * (1.0 - y)))


def _relu(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    return m.store(np.maximum(m.read(n["self"]), 0.0))


def _threshold_backward(m: PlainMode, n: dict[str, Any]) -> np.ndarray:
    """``0 where self <= threshold, else grad`` (relu's backward)."""
    return m.store(np.where(m.read(n["self"]) <= m.scalar(n["threshold"]), 0.0, m.read(n["grad_output"])))


_RULES: dict[Any, Rule] = {
    aten.mm: _mm,
    aten.addmm: _addmm,
    aten.bmm: _bmm,
    aten.mv: _mv,
    aten.dot: _dot,
    aten.sum: _sum,
    aten.add: _add,
    aten.sub: _sub,
    aten.rsub: _rsub,
    aten.mul: _mul,
    aten.div: _div,
    aten.neg: _neg,
    aten.pow: _pow,
    aten.gelu: _act("gelu"),
    aten.gelu_backward: _act_backward("gelu"),
    aten.silu: _act("silu"),
    aten.silu_backward: _act_backward("silu"),
    aten.mish: _act("mish"),
    aten.mish_backward: _act_backward("mish"),
    aten.tanh: _act("tanh"),
    aten.tanh_backward: _tanh_backward,
    aten.sigmoid: _act("sigmoid"),
    aten.sigmoid_backward: _sigmoid_backward,
    aten.relu: _relu,
    aten.threshold_backward: _threshold_backward,
}


def supported_ops() -> list[str]:
    """The aten ops with a rule, by name."""
    return sorted(p.__name__ for p in _RULES)


def _float64_cpu(module: nn.Module) -> nn.Module:
    """``module`` itself when all its parameters and buffers are float64 on the CPU, else such a copy (exact for
    every float dtype)."""
    tensors = [*module.parameters(), *module.buffers()]
    if all(t.dtype == torch.float64 and t.device.type == "cpu" for t in tensors):
        return module
    return copy.deepcopy(module).to(device="cpu", dtype=torch.float64)


def compute_under(mode: PlainMode, module: nn.Module, x: np.ndarray, dy: np.ndarray | None) -> dict[str, np.ndarray]:
    """``module(x)`` under ``mode`` and, given ``dy``, ``torch.autograd.grad(y, [x, *params], dy)``: ``y``, ``dx``,
    ``d<name>`` (float64 arrays; a parameter ``y`` does not depend on gets zeros). Parameters that do not require a
    gradient are left out."""
    module = _float64_cpu(module)
    names = dict(module.named_parameters(remove_duplicate=False))
    params = [(k, names[k]) for k in module.state_dict() if k in names and names[k].requires_grad]
    xt = torch.from_numpy(np.array(x, dtype=np.float64)).requires_grad_(dy is not None)
    with torch.set_grad_enabled(dy is not None), mode:
        y = module(xt)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"the module returned a {type(y).__name__}; the plain computation needs one tensor")
        out = {"y": y}
        if dy is not None:
            wrt = [xt, *(p for _, p in params)]
            grads = torch.autograd.grad(
                y, wrt, torch.from_numpy(np.array(dy, dtype=np.float64)), allow_unused=True, materialize_grads=True
            )
            out["dx"] = grads[0]
            out.update({f"d{k}": g for (k, _), g in zip(params, grads[1:], strict=True)})
    # float64 already (the module's copy): the arrays share the tensors' memory, no second copy of a 58.7M-element
    # weight gradient
    return {k: np.asarray(v.detach().numpy(), dtype=np.float64) for k, v in out.items()}


def plain_compute(
    module: nn.Module, x: np.ndarray, dy: np.ndarray | None, ar: Arith, acts_for: ActsFor
) -> dict[str, np.ndarray]:
    """The module's forward and, given ``dy``, backward computed in ``ar`` with ``acts_for``'s activations
    (:class:`PlainMode`, :func:`compute_under`)."""
    return compute_under(PlainMode(ar, acts_for), module, x, dy)


def plain_run_module(
    module: nn.Module, dtype: str, seed: int, x: np.ndarray, dy: np.ndarray | None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    """``reference.plain_run`` for any module: the plain ``dtype`` computation with its outputs unrounded
    (``Arith.plain(dtype, final=False)``) and, in float32 for a module with an activation, its envelope twin
    (``plain_acts.acts_envelope`` from ``seed``) and the signatures (``reference.signatures`` with
    ``plain_acts.acts_signature``);
    both None otherwise. Past the dtype's range it gives inf/NaN without a warning, as the reference does."""
    with np.errstate(over="ignore", invalid="ignore"):
        plain = Arith.plain(dtype, final=False)
        mode = PlainMode(plain, acts_plain(plain.act_dtype))
        unrounded = compute_under(mode, module, x, dy)
        envelope = signature = None
        if dtype == "float32" and mode.kinds:  # every kind has a transcendental (relu, exact, has no kind)
            envelope = plain_compute(module, x, dy, Arith.plain(dtype), acts_envelope(seed))
            signature = signatures(lambda ar, ulps: plain_compute(module, x, dy, ar, acts_signature(ulps)))
    return unrounded, envelope, signature
