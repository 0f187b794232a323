"""Where the tensor-parallel ranks run, how they meet, and what is refused at start-up.

One node (the default): `sluice serve --tensor-parallel-size N` starts N scheduler + worker
processes; they meet at a free port on 127.0.0.1. Several nodes (`--nnodes M`, untested):
every node runs `sluice serve` with the same flags, `--node-rank` 0..M-1 and
`--dist-init-addr` naming a `host:port` on node 0 that every node reaches; node k runs
ranks `k * N/M .. (k+1) * N/M - 1`, node 0 also the HTTP server, the tokenizer and the
detokenizer. Rank r uses GPU `r mod N/M` of its node.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from sluice.runtime.model.config import ModelConfig

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class RankSpec:
    """One rank's place: its global rank, the group's size, its index on its node, and the
    rendezvous (`tcp://host:port`)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    init_method: str

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def process_name(self) -> str:
        return process_name(self.rank, self.size)


def process_name(rank: int, size: int) -> str:
    """How logs name a rank's process ("scheduler" without tensor parallelism)."""
    return "scheduler" if size == 1 else f"scheduler (tp rank {rank})"


def free_port(host: str = LOCALHOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def node_ranks(tp: int, nnodes: int, node_rank: int, dist_init_addr: str) -> list[RankSpec]:
    """The ranks node `node_rank` runs; the rendezvous is `dist_init_addr` or, on one node
    without it, a free port on 127.0.0.1."""
    per_node = tp // nnodes
    address = dist_init_addr or f"{LOCALHOST}:{free_port()}"
    init = f"tcp://{address}"
    first = node_rank * per_node
    return [RankSpec(first + i, tp, i, per_node, init) for i in range(per_node)]


def parse_host_port(value: str) -> tuple[str, int] | None:
    """`host:port` (IPv6 in brackets), or None when it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def tensor_parallel_problem(
    tp: int, nnodes: int, config: ModelConfig, device: str, visible_gpus: int
) -> str | None:
    """Why the model cannot be split `tp` ways here (one line), or None."""
    if tp == 1:
        return None
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    flag = f"--tensor-parallel-size {tp}"
    if heads % tp:
        return f"{flag} does not divide the model's {heads} attention heads"
    if kv % tp and tp % kv:
        return (
            f"{flag} and the model's {kv} KV heads: one must divide the other "
            "(KV heads are split across ranks, or replicated when there are fewer than ranks)"
        )
    if config.intermediate_size % tp:
        return f"{flag} does not divide the model's MLP width {config.intermediate_size}"
    if config.moe is not None and config.moe.intermediate_size % tp:
        return f"{flag} does not divide the model's expert width {config.moe.intermediate_size}"
    per_node = tp // nnodes
    if device.startswith("cuda") and per_node > visible_gpus:
        return (
            f"{flag} needs {per_node} GPUs on this node but {visible_gpus} "
            f"{'is' if visible_gpus == 1 else 'are'} visible"
        )
    return None
