"""Prefill/decode disaggregation's transfer: a prefill server's KV pages to a decode server.

`open_transfer` is the seam `--disaggregation-transfer-backend` names: "tcp" (`tcp.py`)
moves pages over ZeroMQ on any network; an RDMA backend (NIXL, Mooncake) would be another
entry with the same calls (`KVTransfer`). The scheduler side (who reserves, sends and frees
what) is `scheduler/disagg.py`.
"""

from __future__ import annotations

from typing import Protocol

from sluice.runtime.disagg.kv_pages import KVPages
from sluice.runtime.ipc.messages import FirstToken


class KVTransfer(Protocol):
    bootstrap_port: int

    def send(self, room: int, pages: list[int], tokens: int, first: FirstToken) -> None: ...
    def fail(self, room: int, message: str) -> None: ...
    def reserve(self, room: int, bootstrap: str, pages: list[int], tokens: int) -> None: ...
    def cancel(self, room: int, bootstrap: str = "") -> None: ...
    def close(self) -> None: ...


def open_transfer(
    backend: str,
    role: str,
    pages: KVPages,
    notify_address: str,
    timeout_s: float,
    bootstrap_port: int,
) -> KVTransfer:
    """The transfer `backend` for a `role` ("prefill" or "decode") server."""
    if backend == "tcp":
        from sluice.runtime.disagg.tcp import TcpTransfer

        return TcpTransfer(role, pages, notify_address, timeout_s, bootstrap_port)
    raise ValueError(f"no KV transfer backend {backend!r} (built: tcp)")
