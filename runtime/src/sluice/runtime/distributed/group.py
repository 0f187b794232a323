"""The collectives tensor parallelism issues, behind one object per process.

`TensorParallelGroup` itself is the single-rank case: every collective is the identity, so
the model and the worker call them unconditionally and TP=1 pays nothing. `ProcessGroup`
runs them over `torch.distributed` on two groups:

- the device group (NCCL on CUDA, gloo on the CPU): the model's all-reduces, the logits'
  all-gather and the sampled tokens' broadcast. Only the forward issues them: on the
  overlap loop's forward thread, in launch order, which is the same on every rank;
- the control group (always gloo, on host memory): the scheduler thread's per-tick
  broadcast of messages and decisions, and start-up agreements (the KV pool size).

Two groups, because with one the scheduler thread's broadcast and the forward thread's
all-reduce could be issued in different orders on different ranks and deadlock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import torch

from sluice.runtime.distributed.topology import RankSpec

logger = logging.getLogger("sluice.distributed")

# a collective waits this long for a peer (a live server broadcasts at least once a second;
# start-up waits on the slowest rank's model load)
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class TensorParallelGroup:
    """Rank `rank` of `size`; this base class runs no collective (size 1, or a rank built
    only to compute its shard shapes, as the loader tests do)."""

    rank: int = 0
    size: int = 1
    local_size: int = 1  # ranks on this machine (they share its cores and memory)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def _single(self) -> None:
        if self.size != 1:
            raise RuntimeError(f"rank {self.rank} of {self.size} has no process group")

    # ---- device group: the forward (forward thread) -------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks (in place)."""
        self._single()
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' `x` side by side along the last dimension, in rank order."""
        self._single()
        return x

    def broadcast_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Rank 0's `ids` on every rank (the others pass a buffer of the same shape)."""
        self._single()
        return ids

    # ---- control group: the scheduler (scheduler thread) --------------------------------
    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (the others pass None)."""
        self._single()
        assert data is not None
        return data

    def min_over_ranks(self, value: int) -> int:
        self._single()
        return value


@dataclass(frozen=True)
class ProcessGroup(TensorParallelGroup):
    """A rank of a `torch.distributed` group (see the module docstring); build it with
    `init_process_group`."""

    device_group: object = None
    control_group: object = None
    # --enable-deterministic-inference: every element summed in rank order, whatever the
    # message size (NCCL's ring and tree cut a message into chunks by its size, and so
    # change the order in which an element's partial sums meet). Two ranks need nothing:
    # one addition per element, and a + b == b + a.
    ordered_sum: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.ordered_sum and self.size > 2:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            torch.distributed.all_gather(parts, x.contiguous(), group=self.device_group)
            total = parts[0]
            for part in parts[1:]:
                total += part
            x.copy_(total)
            return x
        torch.distributed.all_reduce(x, group=self.device_group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        torch.distributed.all_gather(parts, x, group=self.device_group)
        return torch.cat(parts, dim=-1)

    def broadcast_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        torch.distributed.broadcast(ids, src=0, group=self.device_group)
        return ids

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        dist = torch.distributed
        length = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(length, src=0, group=self.control_group)
        n = int(length.item())
        if n == 0:
            return b""
        if self.is_leader:
            assert data is not None
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.control_group)
        return data if self.is_leader and data is not None else buf.numpy().tobytes()

    def min_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.control_group)
        return int(t.item())


def init_process_group(spec: RankSpec, device: str, ordered_sum: bool = False) -> ProcessGroup:
    """Join the rendezvous at `spec.init_method` as `spec.rank`; on CUDA, this rank's GPU is
    `cuda:<local rank>` from here on (it is the current device). `ordered_sum`: all-reduces
    add the ranks' values in rank order (deterministic inference)."""
    dist = torch.distributed
    backend = "gloo"
    device_id = None
    if device.startswith("cuda"):
        torch.cuda.set_device(spec.local_rank)
        backend, device_id = "nccl", torch.device("cuda", spec.local_rank)
    logger.info(
        "tp rank %d/%d joining %s (%s, local rank %d)",
        spec.rank, spec.size, spec.init_method, backend, spec.local_rank,
    )
    dist.init_process_group(
        backend,
        init_method=spec.init_method,
        rank=spec.rank,
        world_size=spec.size,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device_id,
    )
    control = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return ProcessGroup(
        rank=spec.rank,
        size=spec.size,
        local_size=spec.local_size,
        device_group=dist.group.WORLD,
        control_group=control,
        ordered_sum=ordered_sum,
    )


SINGLE_RANK = TensorParallelGroup()
