"""The torch worker runtime of the tensor-parallel backends (``compare.backends.tp``): one process per rank, joined by
``torch.distributed``.

Transport: gloo on CPU; on a machine with CUDA, NCCL with this process on the CUDA device ``LOCAL_RANK`` (the rank
when unset), so the same worker runs unchanged on GPUs. Rendezvous: ``tcp://addr:port`` from the :class:`Launch`,
or, when ``launch.port`` is 0, torchrun's environment (``env://``: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``), so the same worker runs under ``torchrun``. Every collective (and the barrier) is bounded by
``launch.timeout_s``: a dead peer makes a call fail within it instead of hanging.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from compare.backends.tp import Launch

#: This runtime starts one process per rank.
LAUNCHES: tuple[str, ...] = ("processes",)


class TorchGroup:
    """A ``compare.backends.tp.Group`` over torch.distributed's default process group."""

    def __init__(self, world_size: int, rank: int, transport: str, device: torch.device) -> None:
        self.world_size = world_size
        self.nproc = world_size
        self.rank = rank
        self.backend = f"{transport}/{device.type}"
        self.device = device

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    def max_all(self, values: Sequence[float]) -> list[float]:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.cpu().tolist()]

    def gather(self, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
        """JSON text as bytes, padded to the longest, all-gathered (no pickling, unlike ``gather_object``)."""
        data = json.dumps(obj, allow_nan=True).encode()
        longest = int(self.max_all([len(data)])[0])
        buf = torch.zeros(longest + 8, dtype=torch.uint8, device=self.device)
        buf[:8] = torch.tensor(list(len(data).to_bytes(8, "little")), dtype=torch.uint8)
        buf[8 : 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        everyone = torch.empty(self.world_size * buf.numel(), dtype=torch.uint8, device=self.device)
        dist.all_gather_into_tensor(everyone, buf)
        if self.rank != 0:
            return None
        rows = everyone.cpu().view(self.world_size, -1)
        out = []
        for row in rows:
            n = int.from_bytes(bytes(row[:8].tolist()), "little")
            out.append(json.loads(bytes(row[8 : 8 + n].tolist()).decode()))
        return out

    def allreduce_probe(self, nbytes: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """An all-reduce (sum) of an ``nbytes`` float32 buffer, and its sync (``compare.backends.tp.Group``)."""
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=self.device)  # sums stay 0: no overflow

        def step() -> torch.Tensor:
            dist.all_reduce(buf)
            return buf

        def sync(_: Any) -> None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return step, sync

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init(launch: Launch) -> TorchGroup:
    """Join the group of ``launch`` (see the module doc) with ``launch.threads`` intra-op threads; returns it."""
    if launch.how not in LAUNCHES:
        raise ValueError(f"the torch TP runtime starts ranks as {', '.join(LAUNCHES)}, not {launch.how!r}")
    torch.set_num_threads(launch.threads)
    cuda = torch.cuda.is_available()
    transport = "nccl" if cuda else "gloo"
    timeout = timedelta(seconds=launch.timeout_s)
    if launch.port == 0:  # torchrun (or any launcher that sets the env:// variables)
        dist.init_process_group(transport, init_method="env://", timeout=timeout)
    else:
        dist.init_process_group(
            transport,
            init_method=f"tcp://{launch.addr}:{launch.port}",
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timeout,
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size != launch.world_size:
        dist.destroy_process_group()
        raise RuntimeError(f"the group has {world_size} processes; the launch asked for {launch.world_size}")
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    return TorchGroup(world_size, rank, transport, device)
