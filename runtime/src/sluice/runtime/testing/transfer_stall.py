"""A test-only wrapper of a prefill server's KV transfer that holds each computed prompt
back for a while before sending it. Off in production.

Tests of P/D faults need a transfer that stalls (the decode side must give up at its
timeout, and both sides free their pages) and a prefill server that can be killed while
a decode server waits for its KV. Off unless the scheduler process starts with
`SLUICE_TEST_DISAGG_STALL_S` set (read once by the process's composition root): then every
`send` happens that many seconds late, on a timer thread.
"""

from __future__ import annotations

import os
import threading

from sluice.runtime.disagg import KVTransfer
from sluice.runtime.ipc.messages import FirstToken

ENV_STALL = "SLUICE_TEST_DISAGG_STALL_S"


class StalledTransfer:
    def __init__(self, inner: KVTransfer, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.bootstrap_port = inner.bootstrap_port

    @classmethod
    def wrap_from_env(cls, inner: KVTransfer) -> KVTransfer:
        delay = os.environ.get(ENV_STALL)
        return cls(inner, float(delay)) if delay else inner

    def send(self, room: int, pages: list[int], tokens: int, first: FirstToken) -> None:
        timer = threading.Timer(self.delay_s, self.inner.send, (room, pages, tokens, first))
        timer.daemon = True
        timer.start()

    def fail(self, room: int, message: str) -> None:
        self.inner.fail(room, message)

    def reserve(self, room: int, bootstrap: str, pages: list[int], tokens: int) -> None:
        self.inner.reserve(room, bootstrap, pages, tokens)

    def cancel(self, room: int, bootstrap: str = "") -> None:
        self.inner.cancel(room, bootstrap)

    def close(self) -> None:
        self.inner.close()
