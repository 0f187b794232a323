"""Run a function on every rank of an in-process tensor-parallel group (gloo on the CPU).

`run_ranks(fn, size, *args)` spawns `size` processes (torch.multiprocessing), joins them
into one group at a free port on 127.0.0.1 and calls `fn(tp, *args)` on each with its
`ProcessGroup`; a failure on any rank fails the call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from sluice.runtime.distributed.group import TensorParallelGroup, init_process_group
from sluice.runtime.distributed.topology import RankSpec, free_port


def _rank_main(
    rank: int, size: int, port: int, device: str, fn: Callable[..., None], args: tuple
) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)  # the ranks share the machine's cores
    spec = RankSpec(rank, size, rank, size, f"tcp://127.0.0.1:{port}")
    tp = init_process_group(spec, device)  # NCCL on cuda (rank r on GPU r), else gloo
    try:
        fn(tp, *args)
    finally:
        torch.distributed.destroy_process_group()


def run_ranks(fn: Callable[..., None], size: int, *args: Any, device: str = "cpu") -> None:
    mp.spawn(_rank_main, args=(size, free_port(), device, fn, args), nprocs=size, join=True)


def single(rank: int = 0, size: int = 1) -> TensorParallelGroup:
    """A rank without a process group: enough to build and load its shard."""
    return TensorParallelGroup(rank=rank, size=size)
