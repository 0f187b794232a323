"""ZeroMQ ipc endpoints joining the runtime's processes.

Each process binds its own PULL socket and connects PUSH sockets to the others, so a
process can start in any order and messages queue until the receiver is up.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from sluice.runtime.ipc.codec import decode, encode


@dataclass(frozen=True)
class PortArgs:
    """ipc:// addresses of each process's input socket."""

    scheduler_input: str
    detokenizer_input: str
    tokenizer_input: str

    @classmethod
    def fresh(cls) -> PortArgs:
        folder = tempfile.mkdtemp(prefix="sluice-ipc-")
        return cls(
            scheduler_input=f"ipc://{os.path.join(folder, 'scheduler')}",
            detokenizer_input=f"ipc://{os.path.join(folder, 'detokenizer')}",
            tokenizer_input=f"ipc://{os.path.join(folder, 'tokenizer')}",
        )


def pull_socket(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    return sock


def push_socket(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def send(sock: zmq.Socket, msg: Any) -> None:
    sock.send(encode(msg), copy=False)


def recv_all_nowait(sock: zmq.Socket) -> list[Any]:
    """Every message already queued on `sock`, without blocking."""
    out = []
    while True:
        try:
            out.append(decode(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return out


def recv(sock: zmq.Socket, timeout_ms: int | None = None) -> Any | None:
    """One message, waiting at most `timeout_ms` (None: forever); None on time-out."""
    if timeout_ms is not None and not sock.poll(timeout_ms, zmq.POLLIN):
        return None
    return decode(sock.recv())


async def recv_async(sock: zmq.asyncio.Socket) -> Any:
    return decode(await sock.recv())
