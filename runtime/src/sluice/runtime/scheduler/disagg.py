"""Prefill/decode disaggregation in the scheduler: what a prefill server keeps of a
computed prompt until its KV is sent, and how a decode server reserves pages for a prompt
it will not compute.

Prefill (`PrefillHandoff`): a P/D request runs as one that asks for a single token (the
intake clips it). When it finishes with that token, `Intake.finish` asks `keep`: the
request's pages go to the transfer instead of back to the pool, and come back (freed, the
prompt's full pages cached) on `KVSent` or `KVTransferFailed`. A P/D request that ends
before its first token (refused, aborted, failed) tells its decode side so.

Decode (`DecodeReceiver`): a P/D request waits here instead of in the prefill queue. Each
tick, requests are given a row and the pages of their prompt, in arrival order, while
their whole life fits as admission counts it (the prompt, their clipped output, and what
the running and receiving requests will still need); then the transfer asks the prefill
server for the KV. On `KVReceived` the first token is applied as if this server had
sampled it and the request decodes; on `KVTransferFailed` it ends with an error. A request
that ends while its KV is coming cancels the transfer before its pages are freed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sluice.runtime.disagg import KVTransfer
from sluice.runtime.ipc.messages import (
    FinishReason,
    FirstToken,
    KVReceived,
    KVSent,
    KVTransferFailed,
    SchedulerStats,
)
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.prefill import WaitingQueue
from sluice.runtime.scheduler.request import Req


def first_token_of(req: Req) -> FirstToken:
    """What the decode side needs of a request whose first token was just sampled."""
    top = req.output_top_logprobs[0] if req.output_top_logprobs else None
    return FirstToken(
        token=req.output_ids[0],
        logprob=req.output_logprobs[0] if req.output_logprobs else None,
        top_ids=list(top[0]) if top else None,
        top_values=list(top[1]) if top else None,
        input_logprobs=list(req.input_logprobs),
        rng_state=req.generator.get_state().numpy().tobytes() if req.generator is not None else b"",
        cached_tokens=req.cached_tokens,
    )


def apply_first_token(req: Req, first: FirstToken) -> None:
    """Give `req` the first token its prefill server sampled, as if sampled here."""
    req.output_ids.append(first.token)
    if req.sampling.logprobs:
        req.output_logprobs.append(first.logprob if first.logprob is not None else 0.0)
    if first.top_ids is not None and first.top_values is not None:
        req.output_top_logprobs.append((first.top_ids, first.top_values))
    req.input_logprobs = list(first.input_logprobs)
    req.cached_tokens = first.cached_tokens
    if first.rng_state and req.generator is not None:
        req.generator.set_state(torch.frombuffer(bytearray(first.rng_state), dtype=torch.uint8))


class PrefillHandoff:
    def __init__(
        self, transfer: KVTransfer, cache: KVCacheManager, release: Callable[[Req], None]
    ) -> None:
        self.transfer = transfer
        self.cache = cache
        self.release = release
        self.sending: dict[int, Req] = {}  # by room
        self.sent_tokens = 0
        self.failed = 0

    def keep(self, req: Req) -> bool:
        """`req` is finishing: True when its pages now belong to the transfer."""
        if req.handoff is None:
            return False
        room = req.handoff.room
        if not req.output_ids:  # its prompt was never computed
            reason = req.finish_reason
            why = reason.message or reason.kind if reason is not None else "ended"
            self.transfer.fail(room, f"the request ended on the prefill server: {why}")
            return False
        n = len(req.input_ids)
        pages = self.cache.holding(req).pages[: self.cache.allocator.pages_for(n)]
        self.transfer.send(room, pages, n, first_token_of(req))
        self.sending[room] = req
        return True

    def on_sent(self, msg: KVSent) -> None:
        if (req := self.sending.pop(msg.room, None)) is not None:
            self.sent_tokens += msg.tokens
            self.release(req)

    def on_failed(self, msg: KVTransferFailed) -> None:
        if (req := self.sending.pop(msg.room, None)) is not None:
            self.failed += 1
            self.release(req)

    def live(self) -> list[Req]:
        return list(self.sending.values())


class DecodeReceiver:
    def __init__(self, transfer: KVTransfer, cache: KVCacheManager) -> None:
        self.transfer = transfer
        self.cache = cache
        self.waiting = WaitingQueue()
        self.receiving: dict[int, Req] = {}  # by room
        self.received_tokens = 0
        self.failed = 0
        self.transfer_seconds: list[float] = []  # since the last take

    def __len__(self) -> int:
        return len(self.waiting) + len(self.receiving)

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def remove(self, req: Req) -> bool:
        """Take `req` out (it is ending); its transfer is cancelled first, so its pages can
        be freed, and its prefill server frees the prompt's."""
        h = req.handoff
        if h is None or not (self.waiting.remove(req) or self.receiving.get(h.room) is req):
            return False
        self.receiving.pop(h.room, None)
        self.transfer.cancel(h.room, h.bootstrap)
        return True

    def refuse(self, req: Req) -> None:
        """`req` was refused on the way in: its prefill server need not keep its prompt."""
        if req.handoff is not None:
            self.transfer.cancel(req.handoff.room, req.handoff.bootstrap)

    def _lifetime_pages(self, req: Req) -> int:
        return self.cache.pages_needed(req, req.seq_len + req.clipped_remaining_new_tokens)

    def head_fits(self, running_reserved: float) -> bool:
        """Whether the first waiting request would get its pages now."""
        head = next(iter(self.waiting), None)
        return head is not None and self._fits(head, running_reserved)

    def _fits(self, req: Req, running_reserved: float) -> bool:
        receiving = sum(r.clipped_remaining_new_tokens for r in self.receiving.values())
        need = self._lifetime_pages(req) * self.cache.page_size
        return (
            self.cache.free_rows > 0
            and need <= self.cache.available_size - running_reserved - receiving
        )

    def reserve(self, running_reserved: float) -> None:
        """Reserve pages for waiting requests, in order, while they fit (the intake has
        refused a request whose context cannot fit the pool alone)."""
        for req in list(self.waiting):
            if not self._fits(req, running_reserved):
                break
            n = len(req.input_ids)
            if not self.cache.acquire_row(req) or not self.cache.extend(req, n):
                self.cache.release(req)
                break
            assert req.handoff is not None
            self.waiting.remove(req)
            self.receiving[req.handoff.room] = req
            pages = self.cache.holding(req).pages
            self.transfer.reserve(req.handoff.room, req.handoff.bootstrap, pages, n)

    def on_received(self, msg: KVReceived) -> Req | None:
        """The request whose KV is now in its pages, its first token applied."""
        req = self.receiving.pop(msg.room, None)
        if req is None:
            return None
        self.received_tokens += msg.tokens
        self.transfer_seconds.append(msg.seconds)
        apply_first_token(req, msg.first)
        return req

    def on_failed(self, msg: KVTransferFailed) -> tuple[Req, FinishReason] | None:
        req = self.receiving.pop(msg.room, None)
        if req is None:
            return None
        self.failed += 1
        return req, FinishReason("error", message=f"KV transfer failed: {msg.message}")

    def take_transfer_seconds(self) -> list[float]:
        seconds, self.transfer_seconds = self.transfer_seconds, []
        return seconds


def disagg_roles(
    mode: str, transfer: KVTransfer | None, cache: KVCacheManager, release: Callable[[Req], None]
) -> tuple[PrefillHandoff | None, DecodeReceiver | None]:
    """What a `mode` ("null", "prefill", "decode") server's scheduler holds for the transfer."""
    if mode == "null":
        return None, None
    assert transfer is not None, f"--disaggregation-mode {mode} needs a transfer"
    if mode == "prefill":
        return PrefillHandoff(transfer, cache, release), None
    return None, DecodeReceiver(transfer, cache)


def add_disagg_stats(
    stats: SchedulerStats, handoff: PrefillHandoff | None, receiver: DecodeReceiver | None
) -> None:
    """A P/D server's transfer counters and waiting requests, into its published stats."""
    if handoff is not None:
        stats.disagg_sent_tokens_total = handoff.sent_tokens
        stats.disagg_failed_transfers_total = handoff.failed
    if receiver is not None:
        stats.disagg_received_tokens_total = receiver.received_tokens
        stats.disagg_failed_transfers_total = receiver.failed
        stats.disagg_waiting_requests = len(receiver)
