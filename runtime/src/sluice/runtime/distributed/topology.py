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
