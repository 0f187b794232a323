"""The TCP transfer (`--disaggregation-transfer-backend tcp`): a prefill server's KV pages
to a decode server over ZeroMQ, one thread per scheduler process.

The protocol, per request (a `room` both halves share):

1. The decode server reserves pages for the prompt, then sends `reserve` (room, prompt
   tokens, its `KVLayout`) from a DEALER to the prefill server's bootstrap port (a ROUTER).
   The prefill server sends nothing before this arrives.
2. Once the prompt is computed (its first token sampled) and the reservation is there,
   the prefill side reads the pages out in chunks of whole pages and sends one `kv`
   message per chunk (positions [start, end), K and V of every layer), then `done` with
   the first token. It tells its scheduler `KVSent` as soon as the last chunk is read: its
   pages may be freed while the bytes travel.
3. The decode side writes each chunk into its reserved pages as it arrives; on `done`
   with every position written it tells its scheduler `KVReceived`.

Either side can end a room: `fail` (prefill -> decode: the request failed there, the
layout differs, or nobody reserved in time) or `cancel` (decode -> prefill: the decode
side's request ended). A side that hears nothing for `timeout_s` gives up: the prefill side
frees a computed prompt nobody reserved, the decode side frees reserved pages no KV came
into. Every end reaches the scheduler as `KVTransferFailed`, which frees the pages.

Pages are read and written on this thread while the scheduler runs forwards on others:
`cancel` takes the room out under the lock the reads and writes hold, so once it returns
nothing touches the room's pages again and the scheduler may free them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from sluice.runtime.disagg.kv_pages import KVLayout, KVPages
from sluice.runtime.ipc.codec import decode, encode
from sluice.runtime.ipc.messages import FirstToken, KVReceived, KVSent, KVTransferFailed
from sluice.runtime.ipc.sockets import push_socket, send

logger = logging.getLogger("sluice.disagg")

CHUNK_TOKENS = 512  # positions per `kv` message (rounded down to whole pages)
POLL_MS = 50
GIVEN_UP = "the decode server gave the request up"  # how often the thread looks at its deadlines when nothing arrives


@dataclass
class _Computed:
    """Prefill side: a computed prompt waiting for its reservation."""

    pages: list[int]
    tokens: int
    first: FirstToken
    since: float


@dataclass
class _Reservation:
    """Prefill side: a decode server's reservation waiting for its prompt."""

    peer: bytes
    tokens: int
    layout: KVLayout
    since: float


@dataclass
class _Receiving:
    """Decode side: reserved pages waiting for their KV."""

    bootstrap: str
    pages: list[int]
    tokens: int
    since: float
    written: int = 0  # positions written so far


class TcpTransfer:
    """One scheduler's end of every transfer. The scheduler thread calls `send`, `fail`
    (prefill), `reserve` (decode) and `cancel` (both); what happens comes back through
    a message to `notify_address` (the scheduler's inbox): `KVSent`, `KVReceived` or
    `KVTransferFailed`."""

    def __init__(
        self,
        role: str,
        pages: KVPages,
        notify_address: str,
        timeout_s: float,
        bootstrap_port: int = 0,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError(f"no transfer role {role!r}")
        self.role = role
        self.pages = pages
        self._notify_address = notify_address
        self._notify_sock: zmq.Socket | None = None
        self.timeout_s = timeout_s
        ps = pages.page_size
        self.chunk_tokens = max(ps, chunk_tokens // ps * ps)
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._live: set[int] = set()  # rooms whose pages this thread may still touch
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        wake_address = f"inproc://disagg-wake-{id(self)}"
        self._wake_in = self._ctx.socket(zmq.PULL)
        self._wake_in.bind(wake_address)
        self._wake = self._ctx.socket(zmq.PUSH)  # the scheduler thread's only socket
        self._wake.connect(wake_address)
        self._router: zmq.Socket | None = None
        self.bootstrap_port = 0
        if role == "prefill":
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.IPV6, 1)
            if bootstrap_port:
                self._router.bind(f"tcp://*:{bootstrap_port}")
                self.bootstrap_port = bootstrap_port
            else:
                self.bootstrap_port = self._router.bind_to_random_port("tcp://127.0.0.1")
        # prefill side
        self._computed: dict[int, _Computed] = {}
        self._reserved: dict[int, _Reservation] = {}
        self._failed: dict[int, tuple[str, float]] = {}
        # decode side
        # per prefill server: its connection, and when it was last given something to send
        self._dealers: dict[str, tuple[zmq.Socket, float]] = {}
        self._receiving: dict[int, _Receiving] = {}
        self._poller = zmq.Poller()
        self._poller.register(self._wake_in, zmq.POLLIN)
        if self._router is not None:
            self._poller.register(self._router, zmq.POLLIN)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kv-transfer", daemon=True)
        self._thread.start()

    # ---- the scheduler thread's calls ----------------------------------------------------
    def send(self, room: int, pages: list[int], tokens: int, first: FirstToken) -> None:
        """Prefill: room's prompt (positions [0, tokens) on `pages`) is computed; send it
        once its reservation is here. The pages stay the transfer's until `KVSent` or
        `KVTransferFailed`."""
        with self._lock:
            self._live.add(room)
        self._command("send", (room, _Computed(list(pages), tokens, first, time.monotonic())))

    def fail(self, room: int, message: str) -> None:
        """Prefill: room's request ended before its prompt was computed; its decode side is
        told so (now, or when its reservation comes)."""
        self._command("fail", (room, message))

    def reserve(self, room: int, bootstrap: str, pages: list[int], tokens: int) -> None:
        """Decode: `pages` are reserved for positions [0, tokens) of room's prompt; ask the
        prefill server at `bootstrap` (host:port) for them."""
        with self._lock:
            self._live.add(room)
        self._command(
            "reserve", (room, _Receiving(bootstrap, list(pages), tokens, time.monotonic()))
        )

    def cancel(self, room: int, bootstrap: str = "") -> None:
        """Either side: room's request ended; once this returns its pages are not touched
        again. A decode side tells its prefill server (the one it reserved from, else the
        one at `bootstrap`), which frees the prompt's pages as soon as it has them."""
        with self._lock:
            self._live.discard(room)
        self._command("cancel", (room, bootstrap))

    def close(self) -> None:
        self._stopping = True
        self._command("stop", None)
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

    def _command(self, kind: str, payload: Any) -> None:
        self._commands.put((kind, payload))
        self._wake.send(b"")

    # ---- this object's thread ------------------------------------------------------------
    def notify(self, msg: object) -> None:
        assert self._notify_sock is not None
        send(self._notify_sock, msg)

    def _run(self) -> None:
        self._notify_sock = push_socket(self._ctx, self._notify_address)
        try:
            while not self._stopping:
                events = dict(self._poller.poll(POLL_MS))
                if self._wake_in in events:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                    self._take_commands()
                if self._router is not None and self._router in events:
                    self._take_router()
                for sock, _ in list(self._dealers.values()):
                    if sock in events:
                        self._take_dealer(sock)
                self._expire(time.monotonic())
        except Exception:  # a bug here must not leave requests waiting silently
            logger.exception("KV transfer thread crashed")
            for room in list(self._computed) + list(self._receiving):
                self._end(room, "the KV transfer thread crashed")

    def _take_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "send":
                room, computed = payload
                self._computed[room] = computed
                if (failed := self._failed.pop(room, None)) is not None:
                    self._end(room, failed[0])  # its decode side gave it up already
                else:
                    self._try_send(room)
            elif kind == "fail":
                room, message = payload
                self._failed[room] = (message, time.monotonic())
                if (r := self._reserved.pop(room, None)) is not None:
                    self._to_peer(r.peer, b"fail", {"room": room, "message": message})
            elif kind == "reserve":
                room, receiving = payload
                self._receiving[room] = receiving
                header = {
                    "room": room,
                    "tokens": receiving.tokens,
                    "layout": self.pages.layout.as_dict(),
                }
                self._dealer(receiving.bootstrap).send_multipart([b"reserve", encode(header)])
            elif kind == "cancel":
                self._cancel(*payload)

    def _cancel(self, room: int, bootstrap: str) -> None:
        if (receiving := self._receiving.pop(room, None)) is not None:
            bootstrap = receiving.bootstrap
        if self.role == "decode" and bootstrap:
            self._dealer(bootstrap).send_multipart([b"cancel", encode({"room": room})])
        self._computed.pop(room, None)
        self._reserved.pop(room, None)

    # prefill side
    def _take_router(self) -> None:
        assert self._router is not None
        while self._router.poll(0):
            peer, kind, header_bytes = self._router.recv_multipart()
            header = decode(header_bytes)
            room = header["room"]
            if kind == b"cancel":
                self._reserved.pop(room, None)
                if room in self._computed:
                    self._end(room, GIVEN_UP)
                else:  # its prompt is still being computed: free it when it is
                    self._failed[room] = (GIVEN_UP, time.monotonic())
                continue
            if kind != b"reserve":
                continue
            layout = KVLayout.from_dict(header["layout"])
            if (failed := self._failed.pop(room, None)) is not None:
                self._to_peer(peer, b"fail", {"room": room, "message": failed[0]})
                continue
            if diff := self.pages.layout.difference(layout):
                self._to_peer(
                    peer, b"fail", {"room": room, "message": f"KV layouts differ: {diff}"}
                )
                if room in self._computed:
                    self._end(room, f"the decode server's KV layout differs: {diff}")
                continue
            self._reserved[room] = _Reservation(peer, header["tokens"], layout, time.monotonic())
            self._try_send(room)

    def _try_send(self, room: int) -> None:
        computed, reservation = self._computed.get(room), self._reserved.get(room)
        if computed is None or reservation is None:
            return
        del self._reserved[room]
        logger.debug("KV transfer: sending room=%d tokens=%d", room, computed.tokens)
        if reservation.tokens != computed.tokens:
            message = f"the decode server reserved {reservation.tokens} positions for a prompt of {computed.tokens}"
            self._to_peer(reservation.peer, b"fail", {"room": room, "message": message})
            self._end(room, message)
            return
        for start in range(0, computed.tokens, self.chunk_tokens):
            end = min(start + self.chunk_tokens, computed.tokens)
            with self._lock:
                if room not in self._live:
                    return  # cancelled meanwhile (the canceller frees the pages)
                k, v = self.pages.read(computed.pages, start, end)
            header = encode({"room": room, "start": start, "end": end})
            if not self._to_peer(reservation.peer, b"kv", header, k, v):
                self._end(room, "the decode server went away during the transfer")
                return
        with self._lock:
            self._live.discard(room)
        del self._computed[room]
        self.notify(KVSent(room, computed.tokens))
        done = {"room": room, "first": encode(computed.first)}
        self._to_peer(reservation.peer, b"done", encode(done))

    def _to_peer(self, peer: bytes, kind: bytes, header: Any, *frames: bytes) -> bool:
        assert self._router is not None
        data = header if isinstance(header, bytes) else encode(header)
        try:
            self._router.send_multipart([peer, kind, data, *frames], copy=False)
            return True
        except zmq.ZMQError as err:  # ROUTER_MANDATORY: the peer is gone
            logger.warning("KV transfer: decode peer unreachable (%s)", err)
            return False

    # decode side
    def _dealer(self, bootstrap: str) -> zmq.Socket:
        sock, _ = self._dealers.get(bootstrap) or (None, 0.0)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IPV6, 1)  # a bracketed IPv6 bootstrap host connects too
            sock.connect(f"tcp://{bootstrap}")
            self._poller.register(sock, zmq.POLLIN)
        self._dealers[bootstrap] = (sock, time.monotonic())
        return sock

    def _take_dealer(self, sock: zmq.Socket) -> None:
        while sock.poll(0):
            kind, header_bytes, *frames = sock.recv_multipart()
            header = decode(header_bytes)
            room = header["room"]
            receiving = self._receiving.get(room)
            if receiving is None:
                continue  # cancelled or expired: drop what still comes
            if kind == b"kv":
                start, end = header["start"], header["end"]
                with self._lock:
                    if room not in self._live:
                        continue
                    self.pages.write(receiving.pages, start, end, frames[0], frames[1])
                receiving.written += end - start
            elif kind == b"done":
                if receiving.written != receiving.tokens:
                    self._end(room, "the prefill server ended the transfer with pages missing")
                    continue
                with self._lock:
                    self._live.discard(room)
                del self._receiving[room]
                seconds = time.monotonic() - receiving.since
                logger.debug(
                    "KV transfer: received room=%d tokens=%d after %.3fs",
                    room,
                    receiving.tokens,
                    seconds,
                )
                self.notify(KVReceived(room, receiving.tokens, decode(header["first"]), seconds))
            elif kind == b"fail":
                self._end(room, f"the prefill server failed the transfer: {header['message']}")

    def _end(self, room: int, message: str) -> None:
        """Room's transfer is over without its KV: let go of its pages and say why."""
        with self._lock:
            self._live.discard(room)
        self._computed.pop(room, None)
        self._reserved.pop(room, None)
        self._receiving.pop(room, None)
        self.notify(KVTransferFailed(room, message))

    def _expire(self, now: float) -> None:
        limit = now - self.timeout_s
        for room, c in list(self._computed.items()):
            if c.since < limit:
                self._end(
                    room, f"no decode server reserved pages for it within {self.timeout_s:g}s"
                )
        for room, r in list(self._reserved.items()):
            if r.since < limit:
                del self._reserved[room]  # its request never came here; the decode side times out
        for room, (_, at) in list(self._failed.items()):
            if at < limit:
                del self._failed[room]
        for room, late in list(self._receiving.items()):
            if late.since < limit:
                self._dealer(late.bootstrap).send_multipart([b"cancel", encode({"room": room})])
                self._end(
                    room,
                    f"the prefill server at {late.bootstrap} sent no KV within {self.timeout_s:g}s",
                )
        # prefill servers come and go (pods): a connection unused for a timeout is closed
        waiting_on = {r.bootstrap for r in self._receiving.values()}
        for bootstrap, (sock, used) in list(self._dealers.items()):
            if used < limit and bootstrap not in waiting_on:
                del self._dealers[bootstrap]
                self._poller.unregister(sock)
                sock.close(linger=0)
