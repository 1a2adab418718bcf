"""What the JAX tensor-parallel backends share: the mesh, placing arrays on it, reading them back, the explicit
per-shard step (``jax.shard_map``), and its comm-only twin (replaying the all-reduces ``jax_impl.collectives`` reads
off XLA's compiled HLO) and compute-only twin.

Layout (Megatron, ``compare.backends.tp``), flax ``[in, out]`` kernels on a 1-D mesh axis ``"tp"``:
``gate``/``up``/``fc1`` (and ``b1``) split by output columns, ``P(None, "tp")``; ``down``/``fc2`` by input rows,
``P("tp", None)``; ``b2``, ``x`` and ``dy`` replicated, ``P()``. World size must divide ``hidden`` (JAX refuses
uneven shards).

Arrays are built with ``jax.make_array_from_callback`` from the full numpy array every process holds, so the same
code places them in one process with N devices and in N processes with one device each; :func:`to_host` reads any
of them back as a full numpy array on every process (``multihost_utils.process_allgather`` when this process does
not hold every shard). A replicated output (``y``, ``dx``, ``db2``) has one copy per device and :func:`to_host` reads
one of them, so :func:`device_copies` reads the outputs once per device of this process, each time with every
replicated piece taken from that device's copy (:func:`as_seen_by`): every copy is judged, not only device 0's.

The explicit step (:func:`shard_step`) runs the whole mode inside one ``shard_map``: the forward and, for the
gradients, a *local* ``jax.vjp`` of the per-shard function, with the collectives written out by hand, so their
number is Megatron's by construction: ``psum`` of the partial ``y`` (forward) and ``psum`` of the partial ``dx``
(backward; the gate and up contributions are summed locally by the VJP first: Megatron's ``f`` operator). Nothing
is transposed across the ``shard_map`` boundary, so the result does not depend on ``check_vma`` (which a Pallas
kernel inside needs off). ``bwd`` keeps the forward's VJP residuals as per-device arrays (stacked along a leading
mesh axis) and runs only the backward per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compare.backends.registry import Prepared
from compare.backends.tp import DeviceCopy, TPParts
from compare.problem.cases import GLU_MODELS
from compare.problem.golden import Problem
from compare.problem.weights import linear_weight
from jax_impl import device as dev
from jax_impl import profiling
from jax_impl.collectives import count_collectives, hlo_collectives
from jax_impl.models import ActMul

#: The mesh axis the hidden dimension is split over.
AXIS = "tp"


def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU (where the Pallas kernel compiles instead of being interpreted)."""
    return dev.platform() in ("gpu", "cuda", "rocm")


def param_specs(model: str) -> dict[str, P]:
    """The partition spec of every canonical parameter, flax layout ``[in, out]`` (see the module doc)."""
    if model in GLU_MODELS:
        return {"gate": P(None, AXIS), "up": P(None, AXIS), "down": P(AXIS, None)}
    if model == "gelu-mlp":
        return {"fc1": P(None, AXIS), "b1": P(AXIS), "fc2": P(AXIS, None), "b2": P()}
    raise ValueError(
        f"model {model!r} has no tensor-parallel layout; TP models: {', '.join((*GLU_MODELS, 'gelu-mlp'))}"
    )


def layout(model: str, hidden: int, world_size: int) -> str:
    """One line on the split, for ``TPParts.layout``."""
    per = hidden // world_size
    cols, rows = ("gate, up", "down") if model in GLU_MODELS else ("fc1 (with b1)", "fc2 (b2 added once, after)")
    return (
        f"{cols} column-parallel P(None, {AXIS!r}) ({per} of {hidden} hidden columns per device), {rows} "
        f"row-parallel P({AXIS!r}, None); x, dy and y replicated"
    )


def make_mesh(world_size: int) -> Mesh:
    """A 1-D ``AxisType.Auto`` mesh over the first ``world_size`` devices of every process (JAX's default would be
    ``Explicit``, under which ``h @ down`` with its contracting dimension sharded needs an ``out_sharding``)."""
    devices = jax.devices()
    if len(devices) < world_size:
        raise RuntimeError(f"world size {world_size} needs {world_size} devices; JAX sees {len(devices)}: {devices}")
    return jax.make_mesh((world_size,), (AXIS,), axis_types=(AxisType.Auto,), devices=devices[:world_size])


def check_divisible(problem: Problem, world_size: int) -> None:
    hidden = problem.case.shape.hidden
    if hidden % world_size:
        raise ValueError(f"world size {world_size} does not divide hidden {hidden}: JAX refuses uneven shards")


def place(mesh: Mesh, a: np.ndarray, spec: P, dtype: Any) -> jax.Array:
    """The full host array ``a`` (the same on every process) as a global array in ``dtype`` sharded as ``spec``."""
    host = np.asarray(a).astype(dtype)
    return jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec), lambda idx: host[idx])


def place_problem(mesh: Mesh, problem: Problem) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    """``(params, x, dy)`` on the mesh: params by canonical name in flax layout, sharded by :func:`param_specs`;
    ``x`` and ``dy`` replicated; all in the case dtype."""
    dtype = dev.JAX_DTYPES[problem.case.dtype]
    specs = param_specs(problem.case.model)
    params = {k: place(mesh, linear_weight(v, "flax"), specs[k], dtype) for k, v in problem.params.items()}
    return params, place(mesh, problem.x, P(), dtype), place(mesh, problem.dy, P(), dtype)


def place_inputs(mesh: Mesh, inputs: dict[str, np.ndarray], dtype: str) -> tuple[jax.Array, jax.Array]:
    """Other inputs (``Prepared.bind``'s: the full ``x`` and ``dy``, the same on every process) replicated on the
    mesh in the case ``dtype``, as :func:`place_problem` places the golden ones."""
    d = dev.JAX_DTYPES[dtype]
    return place(mesh, inputs["x"], P(), d), place(mesh, inputs["dy"], P(), d)


@dataclass(frozen=True)
class Jitted:
    """A jitted step and its arguments: ``fn(*args)`` runs one step (``self()`` does); ``args_for(x, dy)`` are the
    arguments of the same step on other inputs (replicated on the mesh, :func:`place_inputs`), the weights
    unchanged: for ``bwd`` that builds the new forward's residuals (its own collectives, if any, run there)."""

    fn: Any
    args: tuple[Any, ...]
    args_for: Callable[[jax.Array, jax.Array], tuple[Any, ...]]

    def __call__(self) -> Any:
        return self.fn(*self.args)


def to_host(a: jax.Array) -> np.ndarray:
    """The full value of a (global) array as float64 numpy, on every process."""
    if a.is_fully_addressable:
        return np.asarray(jax.device_get(a)).astype(np.float64)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(a, tiled=True)).astype(np.float64)


def _index_key(index: tuple[slice, ...]) -> tuple[tuple[int | None, int | None, int | None], ...]:
    """A shard's index (a tuple of slices, unhashable before Python 3.12) as a dict key."""
    return tuple((s.start, s.stop, s.step) for s in index)


def as_seen_by(tree: Any, device: jax.Device) -> Any:
    """``tree`` with every ``jax.Array`` leaf that ``device`` holds a replicated piece of rebuilt so that every copy
    of that piece (on this process's devices) is ``device``'s: whichever copy :func:`to_host` then reads, it reads
    ``device``'s. Pieces ``device`` does not hold (another device's shard) and other leaves stay as they are."""

    def one(a: Any) -> Any:
        if not isinstance(a, jax.Array):
            return a
        shards = a.addressable_shards
        mine = {_index_key(s.index): s.data for s in shards if s.device == device}
        if not any(s.device != device and _index_key(s.index) in mine for s in shards):
            return a  # no other device here holds a copy of device's pieces: nothing to replace
        pieces = [
            jax.device_put(mine[_index_key(s.index)], s.device) if _index_key(s.index) in mine else s.data
            for s in shards
        ]
        return jax.make_array_from_single_device_arrays(a.shape, a.sharding, pieces)

    return jax.tree.map(one, tree)


def device_label(mesh: Mesh, d: jax.Device) -> str:
    """A device of ``mesh`` as reports name it: JAX's platform and global id, and its TP rank (its position on the
    mesh axis; the id alone does not say it: ``jax.distributed`` numbers CPU devices 0, 2048, ...), e.g.
    ``"cpu:2048 (rank 1)"``."""
    return f"{d.platform}:{d.id} (rank {list(mesh.devices.flat).index(d)})"


def device_copies(mesh: Mesh, to_numpy: Callable[[Any], dict[str, np.ndarray]]) -> Callable[[Any], list[DeviceCopy]]:
    """``TPParts.copies`` of a step on ``mesh``: ``to_numpy`` of its output once per device of this process, in mesh
    order, each with that device's copy of every replicated piece (:func:`as_seen_by`). On a process that holds one
    device, the output as it is. Every process makes the same calls (``to_host`` may be a collective)."""
    devices = list(mesh.local_devices)

    def copies(out: Any) -> list[DeviceCopy]:
        if len(devices) == 1:
            return [DeviceCopy(device_label(mesh, devices[0]), to_numpy(out))]
        return [DeviceCopy(device_label(mesh, d), to_numpy(as_seen_by(out, d))) for d in devices]

    return copies


def grads_to_numpy(dparams: dict[str, jax.Array], dx: jax.Array) -> dict[str, np.ndarray]:
    """``dx`` and ``d<param>`` (canonical ``(out, in)`` layout) as full float64 arrays."""
    # flax kernels are (in, out): the layout map is its own inverse, so it takes gradients back to (out, in)
    return {"dx": to_host(dx), **{f"d{k}": linear_weight(to_host(v), "flax") for k, v in dparams.items()}}


# ---- the explicit per-shard computation -----------------------------------------------------------------------


def _dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``flax.nnx.Linear``'s arithmetic: ``x @ kernel`` at HIGHEST precision in the operands' dtype, ``+ bias``."""
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=dev.PRECISION)
    return y if bias is None else y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))


def partial_fn(model: str, act_mul: ActMul | None) -> Callable[[dict[str, jax.Array], jax.Array], jax.Array]:
    """This device's partial output from its shards: ``down(act_mul(gate(x), up(x)))`` or ``fc2(gelu(fc1(x)))``
    without ``b2`` (added once, after the reduction). ``act_mul`` is the GLU's gated activation (None: gelu-mlp)."""
    if model in GLU_MODELS:
        if act_mul is None:
            raise ValueError(f"model {model!r} needs its act_mul")
        glu = act_mul

        def glu_partial(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            return _dense(glu(_dense(x, p["gate"]), _dense(x, p["up"])), p["down"])

        return glu_partial

    def mlp_partial(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return _dense(jax.nn.gelu(_dense(x, p["fc1"], p["b1"]), approximate=True), p["fc2"])

    return mlp_partial


def _add_bias(s: jax.Array, b: jax.Array) -> jax.Array:
    return s + jnp.reshape(b, (1,) * (s.ndim - 1) + (-1,))


def _stack(a: jax.Array) -> jax.Array:
    """A per-device value as this device's row of a ``[world, ...]`` global array (out_spec ``P(AXIS)``)."""
    return a[None]


def shard_step(
    mesh: Mesh,
    model: str,
    mode: str,
    act_mul: ActMul | None,
    params: dict[str, jax.Array],
    x: jax.Array,
    dy: jax.Array,
    *,
    reduce: bool = True,
    check_vma: bool = True,
) -> Jitted:
    """The step of ``mode`` as one jitted ``shard_map`` (see the module doc), with its arguments (:class:`Jitted`:
    ``step()`` runs one step; ``step.args_for(x, dy)`` the arguments on other inputs). Outputs: ``fwd`` ``y``;
    ``fwd+bwd`` ``(y, (dparams, dx))``; ``bwd`` ``(dparams, dx)``, with ``y``, ``dx`` replicated and ``dparams``
    sharded like ``params``.

    ``reduce=False`` is the compute-only twin: the same shard_map with no ``psum``, every per-device partial
    (``y``, ``dx``) returned as a row of a ``[world, ...]`` array instead (a wrong answer on purpose). For ``bwd`` the
    forward that makes the residuals runs here, once (and, on other inputs, once more in ``args_for``)."""
    if mesh.shape[AXIS] == 1:  # no psum on one device (below), so replication cannot be inferred; nothing to check
        check_vma = False
    specs = param_specs(model)
    pspecs = {k: specs[k] for k in params}
    part = partial_fn(model, act_mul)
    bias = params.get("b2")
    body_params = {k: v for k, v in params.items() if k != "b2"}
    bspecs = {k: s for k, s in pspecs.items() if k != "b2"}
    summed = P() if reduce else P(AXIS)

    def varying(t: jax.Array) -> jax.Array:
        """A replicated ``x`` or ``dy`` as a per-device value (a type change only, under check_vma): differentiating
        w.r.t. a replicated ``x`` would make JAX insert its own reduction of ``dx``."""
        return jax.lax.pcast(t, AXIS, to="varying") if check_vma else t

    def total(t: jax.Array) -> jax.Array:
        if not reduce:
            return _stack(t)
        # one rank holds the whole sum: no collective (Megatron skips it too; XLA:CPU would keep a 1-way all-reduce)
        return jax.lax.psum(t, AXIS) if mesh.shape[AXIS] > 1 else t

    def finish(y_sum: jax.Array, b: jax.Array | None) -> jax.Array:
        return y_sum if b is None or not reduce else _add_bias(y_sum, b)

    def bias_vjp(b: jax.Array | None, g: jax.Array) -> dict[str, jax.Array]:
        """``db2`` as autodiff makes it (the transpose of the broadcast add, in the case dtype)."""
        if b is None:
            return {}
        _, vjp = jax.vjp(_add_bias, jnp.zeros_like(g), b)
        return {"b2": vjp(g)[1]}

    def smap(body: Callable[..., Any], in_specs: Any, out_specs: Any) -> Any:
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma))

    grads_out = ({**bspecs, **({"b2": P()} if bias is not None else {})}, summed)
    if mode == "fwd":

        def fwd(p: dict[str, jax.Array], b: Any, xx: jax.Array) -> jax.Array:
            return finish(total(part(p, varying(xx))), b)

        return Jitted(
            smap(fwd, (bspecs, P(), P()), summed), (body_params, bias, x), lambda xx, _g: (body_params, bias, xx)
        )
    if mode == "fwd+bwd":

        def fwd_bwd(p: dict[str, jax.Array], b: Any, xx: jax.Array, g: jax.Array) -> Any:
            y_part, vjp = jax.vjp(part, p, varying(xx))
            dp, dx_part = vjp(varying(g))
            return finish(total(y_part), b), ({**dp, **bias_vjp(b, g)}, total(dx_part))

        return Jitted(
            smap(fwd_bwd, (bspecs, P(), P(), P()), (summed, grads_out)),
            (body_params, bias, x, dy),
            lambda xx, g: (body_params, bias, xx, g),
        )
    if mode != "bwd":
        raise ValueError(f"unknown mode {mode!r}; known: fwd, bwd, fwd+bwd")
    tree: list[Any] = []

    def residuals(p: dict[str, jax.Array], xx: jax.Array) -> list[jax.Array]:
        _, vjp = jax.vjp(part, p, varying(xx))
        leaves, treedef = jax.tree.flatten(vjp)
        tree[:] = [treedef]
        return [_stack(r) for r in leaves]

    forward = smap(residuals, (bspecs, P()), P(AXIS))
    res = forward(body_params, x)

    def bwd(rs: list[jax.Array], b: Any, g: jax.Array) -> Any:
        vjp = jax.tree.unflatten(tree[0], [r[0] for r in rs])
        dp, dx_part = vjp(varying(g))
        return {**dp, **bias_vjp(b, g)}, total(dx_part)

    return Jitted(
        smap(bwd, (P(AXIS), P(), P()), grads_out), (res, bias, dy), lambda xx, g: (forward(body_params, xx), bias, g)
    )


def step_to_numpy(mode: str) -> Callable[[Any], dict[str, np.ndarray]]:
    """``to_numpy`` for the outputs of :func:`shard_step` (and of the GSPMD steps, which have the same form)."""
    if mode == "fwd":
        return lambda y: {"y": to_host(y)}
    if mode == "fwd+bwd":
        return lambda out: {"y": to_host(out[0]), **grads_to_numpy(*out[1])}
    return lambda out: grads_to_numpy(*out)


# ---- collectives: replayed alone (counted off the compiled HLO by jax_impl.collectives) ------------------------


def psum_program(mesh: Mesh, ops: Sequence[Sequence[tuple[str, tuple[int, ...]]]]) -> Callable[[], Any]:
    """A zero-argument jitted ``shard_map`` doing one ``psum`` per entry of ``ops`` (a tuple ``psum`` of per-device
    arrays of the listed ``(dtype, dims)``: an HLO type name such as ``"f32"``), and nothing else."""
    world = mesh.shape[AXIS]
    dtypes = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64, "s32": jnp.int32}
    arrays = [
        [place(mesh, np.ones((world, *dims), np.float32), P(AXIS), dtypes.get(t, jnp.float32)) for t, dims in operands]
        for operands in ops
    ]

    def body(groups: list[list[jax.Array]]) -> list[Any]:
        return [jax.lax.psum(tuple(a[0] for a in g), AXIS) for g in groups]

    psums = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P()))
    return lambda: psums(arrays)


def comm_twin(mesh: Mesh, hlo_text: str) -> Callable[[], Any]:
    """The step's all-reduces alone: one ``psum`` per all-reduce op of the compiled step, of its operands' shapes
    and dtypes (:func:`psum_program`). Other collective kinds are not replayed (the TP layouts here make none;
    :func:`count_collectives` reports them if XLA does)."""
    ops = [op["operands"] for op in hlo_collectives(hlo_text) if op["kind"] == "all-reduce"]
    return psum_program(mesh, ops) if ops else lambda: None


def allreduce_probe(world_size: int, nbytes: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """An all-reduce (sum) of an ``nbytes`` float32 buffer over the group's devices, and its sync (``Group``)."""
    return psum_program(make_mesh(world_size), [[("f32", (max(1, nbytes // 4),))]]), dev.sync


def prepared(
    mesh: Mesh,
    step: Jitted,
    *,
    to_numpy: Callable[[Any], dict[str, np.ndarray]],
    compute: Jitted,
    dtype: str,
    precision: dict[str, Any],
    setup_s: dict[str, float],
    layout: str,
    timed: bool = True,
    note: str = "",
) -> Prepared:
    """The ``Prepared`` of a TP ``step``: its collectives counted off the compiled HLO, its comm-only twin replaying
    them (:func:`comm_twin`), its compute-only twin ``compute``, every device's copy of its outputs read by
    ``to_numpy`` (:func:`device_copies`), its ``bind`` (the same compiled step on other inputs of the case
    ``dtype``, placed as the golden ones: :func:`place_inputs`, :attr:`Jitted.args_for`), and the single-device
    backends' profile (``jax_impl.profiling``, which works on the sharded step as it is)."""
    jitted, args = step.fn, step.args
    comm = comm_twin(mesh, jitted.lower(*args).compile().as_text())

    def bind(inputs: dict[str, np.ndarray], _slot: int) -> Callable[[], Any]:
        args = step.args_for(*place_inputs(mesh, inputs, dtype))
        return lambda: jitted(*args)

    # fields in order: step, sync, to_numpy, timed, note, device, threads, precision
    return Prepared(
        step,
        dev.sync,
        to_numpy,
        timed,
        note,
        dev.platform(),
        dev.threads(),
        precision,
        profile=lambda path: profiling.profile_jit(jitted, args, step, path),
        tp=TPParts(
            collectives=lambda: count_collectives(jitted.lower(*args).compile().as_text()),
            comm_only=comm,
            compute_only=compute,
            setup_s=setup_s,
            layout=layout,
            copies=device_copies(mesh, to_numpy),
        ),
        bind=bind,
    )
