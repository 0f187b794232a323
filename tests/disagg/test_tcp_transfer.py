"""The TCP KV transfer between two pools in one process: pages arrive bit for bit, in
either order of reservation and computation, and every way a room can end reaches both
schedulers' inboxes (so their pages are freed)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import zmq
from server_process import wait_for

from sluice.runtime.disagg.kv_pages import KVPages
from sluice.runtime.disagg.tcp import TcpTransfer
from sluice.runtime.ipc.messages import FirstToken, KVReceived, KVSent, KVTransferFailed
from sluice.runtime.ipc.sockets import pull_socket, recv
from sluice.runtime.memory.kv_buffers import KVBuffers

PAGE = 4
WAIT_MS = 20_000


def _pool(seed: int, dtype: torch.dtype = torch.float32, heads: int = 2) -> KVBuffers:
    kv = KVBuffers(64 * PAGE, 3, heads, 8, dtype, "cpu")
    g = torch.Generator().manual_seed(seed)
    for layer in range(3):
        kv.k[layer].copy_(torch.randn(kv.k[layer].shape, generator=g).to(dtype))
        kv.v[layer].copy_(torch.randn(kv.v[layer].shape, generator=g).to(dtype))
    return kv


class Side:
    def __init__(self, role: str, kv: KVBuffers, ctx: zmq.Context, timeout_s: float = 30.0,
                 chunk_tokens: int = 8) -> None:  # fmt: skip
        address = f"ipc://{tempfile.mkdtemp(prefix='sluice-test-')}/inbox"
        self.inbox = pull_socket(ctx, address)
        self.kv = kv
        self.transfer = TcpTransfer(role, KVPages(kv, PAGE), address, timeout_s, 0, chunk_tokens)
        self.bootstrap = f"127.0.0.1:{self.transfer.bootstrap_port}"
        self.closed = False

    def next(self) -> object:
        msg = recv(self.inbox, WAIT_MS)
        assert msg is not None, "no transfer event within the deadline"
        return msg

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transfer.close()


@pytest.fixture
def side() -> Iterator[Callable[..., Side]]:
    """Makes a `Side(role, kv, ...)`; every one made is closed at the end of the test."""
    ctx = zmq.Context()
    made: list[Side] = []

    def make(role: str, kv: KVBuffers, **kw: Any) -> Side:
        made.append(Side(role, kv, ctx, **kw))
        return made[-1]

    yield make
    for each in made:
        each.close()
    ctx.destroy(linger=0)


def _slots(pages: list[int], n: int) -> list[int]:
    return [pages[p // PAGE] * PAGE + p % PAGE for p in range(n)]


def _same_kv(a: KVBuffers, a_pages: list[int], b: KVBuffers, b_pages: list[int], n: int) -> bool:
    sa, sb = _slots(a_pages, n), _slots(b_pages, n)
    return all(torch.equal(a.k[i][sa], b.k[i][sb]) and torch.equal(a.v[i][sa], b.v[i][sb])
               for i in range(3))  # fmt: skip


@pytest.mark.parametrize("reserve_first", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pages_arrive_bit_for_bit_in_either_order(side, reserve_first, dtype):
    p, d = side("prefill", _pool(1, dtype)), side("decode", _pool(2, dtype))
    n = 27  # not a whole number of pages, nor of chunks
    p_pages, d_pages = [9, 3, 17, 5, 30, 2, 11], [40, 41, 7, 8, 50, 12, 13]
    before = d.kv.k[0].clone()
    first = FirstToken(123, -0.5, [123, 7], [-0.5, -2.0], [-1.0, -2.0], b"\x01\x02")
    bootstrap = p.bootstrap
    if reserve_first:
        d.transfer.reserve(77, bootstrap, d_pages, n)
        p.transfer.send(77, p_pages, n, first)
    else:
        p.transfer.send(77, p_pages, n, first)
        d.transfer.reserve(77, bootstrap, d_pages, n)
    sent, received = p.next(), d.next()
    assert sent == KVSent(77, n)
    assert isinstance(received, KVReceived) and received.room == 77 and received.tokens == n
    assert received.first == first and received.seconds >= 0
    assert _same_kv(p.kv, p_pages, d.kv, d_pages, n)
    # nothing outside the reserved positions changed
    untouched = sorted(set(range(d.kv.k[0].shape[0])) - set(_slots(d_pages, n)))
    assert torch.equal(d.kv.k[0][untouched], before[untouched])


def test_a_failed_prefill_fails_the_reservation_before_or_after_it_comes(side):
    p, d = side("prefill", _pool(1)), side("decode", _pool(2))
    bootstrap = p.bootstrap
    p.transfer.fail(5, "prompt too long")  # before the reservation
    d.transfer.reserve(5, bootstrap, [1, 2], 8)
    failed = d.next()
    assert isinstance(failed, KVTransferFailed) and failed.room == 5
    assert "prompt too long" in failed.message
    d.transfer.reserve(6, bootstrap, [3, 4], 8)  # a reservation first
    p.transfer.fail(6, "aborted by the client")
    failed = d.next()
    assert isinstance(failed, KVTransferFailed) and "aborted by the client" in failed.message


def test_different_layouts_are_refused_on_both_sides(side):
    p, d = side("prefill", _pool(1)), side("decode", _pool(2, heads=4))
    p.transfer.send(9, [1, 2], 8, FirstToken(1))
    d.transfer.reserve(9, p.bootstrap, [1, 2], 8)
    for each in (p, d):
        failed = each.next()
        assert isinstance(failed, KVTransferFailed) and "kv_heads 2" in failed.message


def test_a_cancelled_reservation_frees_the_prefill_side_and_writes_nothing(side):
    p, d = side("prefill", _pool(1)), side("decode", _pool(2))
    before = [t.clone() for t in d.kv.k]
    bootstrap = p.bootstrap
    d.transfer.reserve(3, bootstrap, [1, 2, 3], 12)
    d.transfer.cancel(3)  # the decode request ended before the prompt was computed
    p.transfer.send(3, [4, 5, 6], 12, FirstToken(1))
    # the prefill side lets go of the pages either way: failed if the cancel came first,
    # sent (and dropped by the decode side) if the send did
    assert isinstance(p.next(), KVSent | KVTransferFailed)
    assert all(torch.equal(a, b) for a, b in zip(before, d.kv.k, strict=True))
    # the decode side's events are ordered: the next one is the next room's, not room 3's
    p.transfer.send(4, [7, 8], 8, FirstToken(2))
    d.transfer.reserve(4, bootstrap, [9, 10], 8)
    assert p.next() == KVSent(4, 8)
    assert isinstance(received := d.next(), KVReceived) and received.room == 4
    assert all(torch.equal(a[:36], b[:36]) for a, b in zip(before, d.kv.k, strict=True))


def test_nothing_waits_past_the_timeout(side):
    p, d = side("prefill", _pool(1), timeout_s=0.3), side("decode", _pool(2), timeout_s=0.3)
    p.transfer.send(1, [1, 2], 8, FirstToken(1))  # nobody reserves
    failed = p.next()
    assert isinstance(failed, KVTransferFailed) and "no decode server reserved" in failed.message
    p.close()  # the prefill server is gone
    d.transfer.reserve(2, p.bootstrap, [1, 2], 8)
    failed = d.next()
    assert isinstance(failed, KVTransferFailed) and "sent no KV within" in failed.message


def test_a_connection_to_a_prefill_server_unused_for_a_timeout_is_closed(side):
    p, d = side("prefill", _pool(1)), side("decode", _pool(2), timeout_s=0.3)
    bootstrap = p.bootstrap
    p.transfer.send(1, [1, 2], 8, FirstToken(1))
    d.transfer.reserve(1, bootstrap, [3, 4], 8)
    assert isinstance(d.next(), KVReceived)
    # closed by the transfer's own thread once unused for its timeout
    wait_for(lambda: bootstrap not in d.transfer._dealers, timeout=30,
             what="the idle connection closed")  # fmt: skip
    # and a new transfer opens a new one
    p.transfer.send(2, [5, 6], 8, FirstToken(2))
    d.transfer.reserve(2, bootstrap, [7, 8], 8)
    assert isinstance(received := d.next(), KVReceived) and received.room == 2
