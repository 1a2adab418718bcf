"""Turn an nnx module into a jitted ``Prepared`` step for a mode. Shared by every JAX backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from compare.backends.registry import Prepared
from compare.problem.golden import Problem
from compare.problem.moe import MOE_SPECS, MoeSpec
from compare.problem.weights import linear_weight
from jax_impl import device as dev
from jax_impl import dispatch_profile, memory, profiling
from jax_impl.models import canonical_grads


def host(a: jax.Array) -> np.ndarray:
    """``a`` copied to host memory in its own float type (bfloat16 as ``ml_dtypes.bfloat16``, as JAX holds it)."""
    return np.array(jax.device_get(a), copy=True)


def prepare(
    problem: Problem,
    mode: str,
    module: nnx.Module,
    *,
    timed: bool = True,
    note: str = "",
    forward: Callable[[Any, jax.Array], jax.Array] | None = None,
    outer_jit: bool = True,
) -> Prepared:
    """Build the jitted step of ``mode`` for an nnx module: split into a graph and a state pytree, the state the
    parameters of :func:`prepare_params` (its modes and ``outer_jit`` there); the gradients read back under canonical
    names, ``(out, in)``.

    ``forward(state, x)`` replaces the forward (default: the module merged from ``state``, called on ``x``).
    """
    model = problem.case.model
    graphdef, state = nnx.split(module)

    def merged(st: Any, xx: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, st)(xx)

    def grads_np(dstate: Any) -> dict[str, np.ndarray]:
        dparams = canonical_grads(nnx.merge(graphdef, dstate), model)
        # flax kernels are (in, out): the layout map is its own inverse, so it takes gradients back to (out, in)
        return {f"d{k}": np.asarray(linear_weight(host(v), "flax")) for k, v in dparams.items()}

    apply = forward if forward is not None else merged
    return prepare_params(problem, mode, state, apply, grads_np, timed=timed, note=note, outer_jit=outer_jit)


def prepare_params(
    problem: Problem,
    mode: str,
    state: Any,
    apply: Callable[[Any, jax.Array], Any],
    grads_np: Callable[[Any], dict[str, np.ndarray]],
    *,
    timed: bool = True,
    note: str = "",
    outer_jit: bool = True,
    routed: bool = False,
) -> Prepared:
    """Build the jitted step of ``mode`` for ``apply(state, x)``: ``state`` (a pytree of the parameters, on the
    device) and the inputs are arguments of the jitted function (never closed-over constants), the inputs placed on
    the device once here; ``grads_np(dstate)`` reads a gradient of ``state`` as ``{"d<param>": array}`` in its own
    float type (:func:`host`).

    - ``fwd``: ``y = apply(state, x)``;
    - ``fwd+bwd``: ``y, vjp = jax.vjp(apply, state, x)`` then ``vjp(dy)``, one jitted function;
    - ``bwd``: the forward's ``vjp`` closure is built once here; each step is a jitted call of it on ``dy``.

    ``outer_jit=False`` leaves out every ``jax.jit`` above: each step then runs ``apply`` and ``jax.vjp`` from
    Python, dispatching whatever computations ``apply`` jits itself (or each op, for plain jnp) one after another
    (an op-by-op backend), and the profile reads every computation the step dispatches
    (``jax_impl.dispatch_profile``).

    ``routed`` (a mixture-of-experts case): ``apply`` returns ``(y, experts [T, k])``, the experts its router chose
    (``jax.vjp``'s ``has_aux``: they have no gradient); every step's output carries them (``bwd``'s: its forward's)
    and reads them as ``routing``, which the gate takes apart from the tensors it judges (``compare.gate.routing``).
    """
    precision = dev.pin_precision()
    dtype = dev.JAX_DTYPES[problem.case.dtype]
    x = jax.device_put(np.asarray(problem.x)).astype(dtype)
    dy = jax.device_put(np.asarray(problem.dy)).astype(dtype)
    jit: Callable[[Any], Any] = jax.jit if outer_jit else (lambda f: f)

    def grads_of(dstate: Any, dx: jax.Array) -> dict[str, np.ndarray]:
        return {"dx": host(dx), **grads_np(dstate)}

    def read(aux: tuple[Any, ...]) -> dict[str, np.ndarray]:
        """A routed step's experts as its output's ``routing`` (integers); nothing for any other step."""
        return {"routing": np.asarray(jax.device_get(aux[0])).astype(np.int64)} if routed else {}

    def vjp_of(f: Callable[[Any, jax.Array], Any], st: Any, xx: jax.Array) -> tuple[Any, Any, tuple[Any, ...]]:
        """``(y, vjp, aux)``: ``jax.vjp`` of ``f``, its experts as ``aux`` (``(experts,)``, ``()`` unrouted)."""
        if routed:
            y, vjp, experts = jax.vjp(f, st, xx, has_aux=True)
            return y, vjp, (experts,)
        y, vjp = jax.vjp(f, st, xx)
        return y, vjp, ()

    step: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    jitted: Any  # the (jitted, unless outer_jit=False) function the profiler reads, and its arguments
    args: tuple[Any, ...]
    on: Callable[[jax.Array, jax.Array], Callable[[], Any]]  # the step on other inputs, same compiled code
    slots: dict[int, tuple[jax.Array, jax.Array]] = {}

    def bind(inputs: dict[str, np.ndarray], slot: int) -> Callable[[], Any]:
        """``Prepared.bind``: the slot's inputs placed anew and its old arrays deleted (a step that kept a reference
        to them and computes only when read fails there), and the step over them."""
        for old in slots.pop(slot, ()):
            old.delete()
        placed = (jax.device_put(np.asarray(inputs[k])).astype(dtype) for k in ("x", "dy"))
        slots[slot] = (next(placed), next(placed))
        return on(*slots[slot])

    if mode == "fwd":
        fwd = jit(apply)
        jitted, args = fwd, (state, x)

        def step() -> jax.Array:
            return fwd(state, x)

        def on(xx: jax.Array, _g: jax.Array) -> Callable[[], Any]:
            return lambda: fwd(state, xx)

        def to_numpy(out: Any) -> dict[str, np.ndarray]:
            return {"y": host(out[0]), **read(out[1:])} if routed else {"y": host(out)}
    elif mode == "fwd+bwd":

        @jit
        def fwd_bwd(st: Any, xx: jax.Array, g: jax.Array) -> tuple[Any, ...]:
            y, vjp, aux = vjp_of(apply, st, xx)
            return (y, vjp(g), *aux)

        jitted, args = fwd_bwd, (state, x, dy)

        def step() -> Any:
            return fwd_bwd(state, x, dy)

        def on(xx: jax.Array, g: jax.Array) -> Callable[[], Any]:
            return lambda: fwd_bwd(state, xx, g)

        def to_numpy(out: Any) -> dict[str, np.ndarray]:
            y, (dstate, dx) = out[:2]
            return {"y": host(y), **grads_of(dstate, dx), **read(out[2:])}
    elif mode == "bwd":
        fwd = jit(apply)
        _, vjp_fn, aux = vjp_of(fwd, state, x)
        bwd = jit(lambda f, g: f(g))
        jitted, args = bwd, (vjp_fn, dy)

        def step() -> Any:
            return (bwd(vjp_fn, dy), *aux) if routed else bwd(vjp_fn, dy)

        def on(xx: jax.Array, g: jax.Array) -> Callable[[], Any]:  # a new forward's vjp closure, built here
            _, f, extra = vjp_of(fwd, state, xx)
            return (lambda: (bwd(f, g), *extra)) if routed else (lambda: bwd(f, g))

        def to_numpy(out: Any) -> dict[str, np.ndarray]:
            return {**grads_of(*out[0]), **read(out[1:])} if routed else grads_of(*out)
    else:
        raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")

    def memory_record() -> dict[str, Any]:
        """``Prepared.memory`` (``jax_impl.memory``): the forward's ``vjp`` residuals, the compiled step's peak."""
        forward = (lambda st, xx: apply(st, xx)[0]) if routed else apply  # the output y alone
        return memory.record(mode, forward, state, x, step, dev.sync, jitted, args, outer_jit)

    return Prepared(
        step=step,
        sync=dev.sync,
        to_numpy=to_numpy,
        timed=timed,
        note=note,
        device=f"{dev.platform()}",
        threads=dev.threads(),
        precision=precision,
        profile=lambda path: (
            profiling.profile_jit(jitted, args, step, path, timed=timed)
            if outer_jit
            else dispatch_profile.profile_dispatched(jitted, args, step, path)
        ),
        bind=bind,
        memory=memory_record,
    )


def prepare_moe(
    problem: Problem,
    mode: str,
    block: Callable[[Any, jax.Array, MoeSpec], tuple[jax.Array, jax.Array]],
    *,
    timed: bool = True,
    note: str = "",
) -> Prepared:
    """The jitted step of ``mode`` (:func:`prepare_params`, routed) of a mixture-of-experts case's ``block(params,
    x [T, D], spec) -> (y [T, D], experts [T, k])`` (``jax_impl.moe_ops``): the parameters by their canonical names
    in torch's layout (as the block takes them), on the device in the case dtype, the spec static, the block over
    the flattened tokens. ``timed=False``: parity only (an interpreted kernel)."""
    dtype = dev.JAX_DTYPES[problem.case.dtype]
    spec = MOE_SPECS[problem.case.model]
    params = {k: jax.device_put(np.asarray(v)).astype(dtype) for k, v in problem.params.items()}
    names = list(problem.params)

    def apply(st: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        y, experts = block(st, x.reshape(-1, x.shape[-1]), spec)
        return y.reshape(x.shape), experts

    def grads_np(dparams: Any) -> dict[str, np.ndarray]:
        return {f"d{k}": host(dparams[k]) for k in names}

    return prepare_params(problem, mode, params, apply, grads_np, timed=timed, note=note, routed=True)
