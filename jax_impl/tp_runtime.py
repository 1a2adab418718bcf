"""The JAX worker runtime of the tensor-parallel backends (``compare.backends.tp``): how a group's ranks start and talk.

Two launches (:data:`LAUNCHES`):

``"devices"``
    one process holding all ``world_size`` ranks as devices: on CPU, ``jax_num_cpu_devices = world_size`` (XLA:CPU
    devices in one process share its thread pool; the all-reduce is a memory copy between them). The flag only
    takes effect before JAX initialises its backends, so :func:`init` must be the first thing that touches JAX; it
    fails with a clear error when the backend is already up with another device count. The group has one process:
    ``barrier`` is a no-op, ``max_all`` the identity, ``gather`` ``[obj]``.
``"processes"``
    one process per rank, each with one device, joined by ``jax.distributed.initialize`` (rank 0 hosts the
    coordination service at ``addr:port``); CPU collectives go through gloo (``jax_cpu_collectives_implementation``).
    Every wait is bounded: the rendezvous by ``initialization_timeout``, a dead peer by the coordination service's
    heartbeat (``heartbeat_timeout_seconds``; the survivors' client then fails), shutdown by
    ``shutdown_timeout_seconds``, all from ``launch.timeout_s``. ``barrier``, ``max_all`` and ``gather`` are
    ``jax.experimental.multihost_utils`` calls (``sync_global_devices``, ``process_allgather`` of raw bytes: float64
    values travel bit-exact, JSON as ``uint8`` padded to a common length).

Threads: XLA:CPU has no flag for its thread count; its intra-op pool (dots included) is sized from the process's CPU
affinity, which ``compare.run.tp_worker`` pins to ``launch.threads`` CPUs before this module is imported (verified: one
pinned CPU gives CPU time / wall time 1.0 on a matmul, two give 1.98). With one thread, :func:`init` also adds
``--xla_cpu_multi_thread_eigen=false`` to ``XLA_FLAGS`` (Eigen's own pool for elementwise ops) before the backend
starts. In ``"devices"`` all ranks share that one pool.

On a GPU machine the same code runs on GPUs: ``"devices"`` meshes the first ``world_size`` local GPUs of the one
process (no ``jax_num_cpu_devices`` involved), ``"processes"`` expects one visible GPU per process (the launcher sets
``CUDA_VISIBLE_DEVICES``, or ``local_device_ids`` would pick it) and XLA's collectives are NCCL's; nothing else
changes (the Pallas kernel then compiles through Triton instead of running interpreted).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from compare.backends.tp import Launch

#: The ways this runtime starts a group's ranks.
LAUNCHES: tuple[str, ...] = ("devices", "processes")
#: Added to ``XLA_FLAGS`` for a one-thread process (Eigen's elementwise pool; dots follow the CPU affinity).
ONE_THREAD_FLAG = "--xla_cpu_multi_thread_eigen=false"


class _JaxGroup:
    """What both launches' groups share: the transport's bandwidth probe, a psum over the mesh's devices."""

    world_size: int

    def allreduce_probe(self, nbytes: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """An all-reduce of ``nbytes`` of float32 over the group's devices (``jax_impl.tp_common.allreduce_probe``)."""
        from jax_impl import tp_common

        return tp_common.allreduce_probe(self.world_size, nbytes)


class DevicesGroup(_JaxGroup):
    """A group of one process holding every rank as a device."""

    nproc = 1
    rank = 0

    def __init__(self, world_size: int, platform: str) -> None:
        self.world_size = world_size
        self.backend = f"XLA:{platform.upper()}, {world_size} devices in 1 process"

    def barrier(self) -> None:
        return None

    def max_all(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def gather(self, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [obj]

    def close(self) -> None:
        return None


class ProcessesGroup(_JaxGroup):
    """A group of ``nproc`` processes, one device each, joined by ``jax.distributed``."""

    def __init__(self, world_size: int, rank: int, platform: str) -> None:
        self.world_size = world_size
        self.nproc = world_size
        self.rank = rank
        transport = "gloo" if platform == "cpu" else "NCCL"
        self.backend = f"XLA:{platform.upper()} {transport}, {world_size} processes x 1 device"
        self._calls = 0

    def _allgather(self, a: np.ndarray) -> np.ndarray:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a))

    def _gather_bytes(self, data: bytes) -> list[bytes]:
        sizes = self._allgather(np.array([len(data)], np.int32)).reshape(-1)
        top = int(sizes.max())
        buf = np.zeros(top, np.uint8)
        buf[: len(data)] = np.frombuffer(data, np.uint8)
        rows = self._allgather(buf).reshape(len(sizes), top)
        return [rows[i, : int(n)].tobytes() for i, n in enumerate(sizes)]

    def barrier(self) -> None:
        from jax.experimental import multihost_utils

        self._calls += 1
        multihost_utils.sync_global_devices(f"compare-barrier-{self._calls}")

    def max_all(self, values: Sequence[float]) -> list[float]:
        mine = np.asarray([float(v) for v in values], np.float64).tobytes()
        every = [np.frombuffer(b, np.float64) for b in self._gather_bytes(mine)]
        return [float(v) for v in np.max(np.stack(every), axis=0)]

    def gather(self, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        every = self._gather_bytes(json.dumps(obj, allow_nan=True).encode())
        return [json.loads(b) for b in every] if self.rank == 0 else None

    def close(self) -> None:
        import jax

        jax.distributed.shutdown()


def _set_threads(threads: int) -> None:
    if threads == 1 and ONE_THREAD_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {ONE_THREAD_FLAG}".strip()


def _backends_started() -> bool:
    from jax._src import xla_bridge  # no public query; a private one beats starting the backend to find out

    return bool(xla_bridge.backends_are_initialized())


def init(launch: Launch) -> DevicesGroup | ProcessesGroup:
    """Form the group of ``launch`` (see the module doc); call it before anything else touches JAX."""
    if launch.how not in LAUNCHES:
        raise ValueError(f"the JAX TP runtime starts ranks as {', '.join(LAUNCHES)}, not {launch.how!r}")
    _set_threads(launch.threads)
    import jax

    if _backends_started():
        have = jax.device_count()
        want = launch.world_size if launch.how == "devices" else 1
        if jax.local_device_count() != want or launch.how == "processes":
            raise RuntimeError(
                f"JAX's backend is already initialised in this process ({have} devices); the {launch.how!r} launch "
                f"must set it up itself (jax_num_cpu_devices={want}): call jax_impl.tp_runtime.init before any "
                "JAX computation or device query"
            )
        return DevicesGroup(launch.world_size, jax.default_backend())
    if launch.how == "devices":
        jax.config.update("jax_num_cpu_devices", launch.world_size)
        platform = jax.default_backend()
        if jax.device_count() < launch.world_size:
            raise RuntimeError(f"world size {launch.world_size} needs that many devices; JAX sees {jax.devices()}")
        return DevicesGroup(launch.world_size, platform)
    if launch.nproc != launch.world_size:
        raise ValueError(f"a 'processes' launch has one process per rank: nproc {launch.nproc} != {launch.world_size}")
    addr, port = launch.addr, launch.port
    if port == 0:  # a launcher that only sets the env:// variables (torchrun)
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    jax.config.update("jax_num_cpu_devices", 1)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = max(1, round(launch.timeout_s))
    jax.distributed.initialize(
        coordinator_address=f"{addr}:{port}",
        num_processes=launch.nproc,
        process_id=launch.rank,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=max(10, timeout),
        shutdown_timeout_seconds=timeout,
    )
    if jax.process_count() != launch.nproc or jax.device_count() != launch.world_size:
        jax.distributed.shutdown()
        raise RuntimeError(
            f"the group has {jax.process_count()} processes and {jax.device_count()} devices; the launch asked for "
            f"{launch.nproc} and {launch.world_size}"
        )
    return ProcessesGroup(launch.world_size, launch.rank, jax.default_backend())
