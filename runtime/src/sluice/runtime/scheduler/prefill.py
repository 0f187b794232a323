"""Admission: `PrefillManager` owns the waiting queue and the request being chunked, and
builds each tick's prefill batch with `schedule(budget)`.

A request is admitted when all three limits allow, checked and allocated in one step (so
what a request takes is counted once):

1. Request slots: a free row of the request tables.
2. Token budget: at most `budget.tokens` prompt tokens this batch; a prompt longer than
   what is left is chunked (page-aligned), and at most one request is chunked at a time.
3. KV capacity: the tokens it still needs over its life (the rest of its prompt and its
   clipped output) must fit in what is available now, minus what running requests are
   expected to still need (`budget.running_reserved`), minus what requests admitted
   earlier in this pass will still need beyond what they were just given.

Admission stops at the first request that does not fit: no skipping ahead of the queue head.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.policy import PolicyConfig, order_waiting
from sluice.runtime.scheduler.request import Req


class AddResult(enum.Enum):
    ADDED = "added"
    CHUNKED = "chunked"  # admitted with only part of its prompt this tick
    NO_SLOT = "no_slot"
    NO_TOKEN_BUDGET = "no_token_budget"
    NO_KV = "no_kv"
    NO_LORA_SLOT = "no_lora_slot"  # its adapter would be one more than --max-loras


@dataclass(frozen=True)
class PrefillBudget:
    tokens: int  # prompt tokens this batch may compute
    running_reserved: float  # KV tokens the decoding requests are expected to still need
    max_loras: int = 0  # distinct LoRA adapters a batch may hold (0: no limit)
    running_loras: frozenset[int] = frozenset()  # the decoding requests' adapters (0: base)


@dataclass
class PrefillBatch:
    """Request i computes positions [starts[i], starts[i] + lens[i]); `complete[i]` is False
    for the request being chunked (an intermediate chunk samples no token)."""

    reqs: list[Req] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    complete: list[bool] = field(default_factory=list)
    admitted: list[Req] = field(default_factory=list)  # first admission out of the queue

    @property
    def num_tokens(self) -> int:
        return sum(self.lens)


class WaitingQueue:
    """Requests waiting for admission, in arrival order, with O(1) removal by identity."""

    def __init__(self) -> None:
        self._reqs: OrderedDict[int, Req] = OrderedDict()

    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self) -> Iterator[Req]:
        return iter(self._reqs.values())

    def __contains__(self, req: Req) -> bool:
        return id(req) in self._reqs

    def append(self, req: Req) -> None:
        self._reqs[id(req)] = req

    def push_front(self, reqs: list[Req]) -> None:
        for req in reversed(reqs):
            self._reqs[id(req)] = req
            self._reqs.move_to_end(id(req), last=False)

    def remove(self, req: Req) -> bool:
        return self._reqs.pop(id(req), None) is not None


@dataclass
class PrefillAdder:
    """One admission pass: decides and allocates request by request."""

    cache: KVCacheManager
    budget: PrefillBudget
    chunk_size: int
    batch: PrefillBatch = field(default_factory=PrefillBatch)
    chunked: Req | None = None
    reserved: float = 0.0  # what requests admitted in this pass still need beyond this tick

    @property
    def tokens_left(self) -> int:
        return self.budget.tokens - self.batch.num_tokens

    @property
    def kv_headroom(self) -> float:
        return self.cache.available_size - self.budget.running_reserved - self.reserved

    def lifetime_pages(self, req: Req) -> int:
        """New pages `req` needs for the rest of its prompt and its clipped output."""
        return self.cache.pages_needed(req, req.seq_len + req.clipped_remaining_new_tokens)

    def lora_fits(self, req: Req) -> bool:
        """Its adapter is the base model, already in the batch, or one more still allowed."""
        lora, limit = req.sampling.lora_id, self.budget.max_loras
        if not lora or not limit:
            return True
        held = {r.sampling.lora_id for r in self.batch.reqs} | self.budget.running_loras
        held.discard(0)
        return lora in held or len(held) < limit

    def try_add(self, req: Req) -> AddResult:
        """Admit `req` (new, retracted, or the one being chunked) if all three limits allow."""
        if self.chunked is not None:
            return AddResult.NO_TOKEN_BUDGET
        if not self.lora_fits(req):
            return AddResult.NO_LORA_SLOT
        fresh = not self.cache.has_row(req)
        if fresh and self.cache.free_rows == 0:
            return AddResult.NO_SLOT
        if fresh:
            self.cache.match_prefix(req)
        result = self._try_add(req)
        if fresh and result not in (AddResult.ADDED, AddResult.CHUNKED):
            self.cache.release(req)  # undo the match (and the row)
        return result

    def _try_add(self, req: Req) -> AddResult:
        todo = self.cache.extend_len(req)
        take = min(todo, self.tokens_left, self.chunk_size)
        if take < todo:
            take = self._page_aligned(req, take)
        if take <= 0:
            return AddResult.NO_TOKEN_BUDGET
        need = self.lifetime_pages(req) * self.cache.page_size
        if need > self.kv_headroom:
            return AddResult.NO_KV
        if not self.cache.acquire_row(req):
            return AddResult.NO_SLOT
        start = self.cache.kv_len(req)
        chunked = take < todo
        before = self.cache.available_size
        if not self.cache.extend(req, start + take):
            return AddResult.NO_KV  # the caller's release returns the row
        # what it still needs beyond what it was just given
        self.reserved += max(0.0, need - (before - self.cache.available_size))
        self.batch.reqs.append(req)
        self.batch.starts.append(start)
        self.batch.lens.append(take)
        self.batch.complete.append(not chunked)
        if chunked:
            self.chunked = req
            return AddResult.CHUNKED
        return AddResult.ADDED

    def _page_aligned(self, req: Req, take: int) -> int:
        """Shorten a chunk so that it ends on a page boundary (full pages stay shareable)."""
        ps = self.cache.page_size
        kv_len = self.cache.kv_len(req)
        end = (kv_len + take) // ps * ps
        return end - kv_len if end > kv_len else take


@dataclass
class PrefillManager:
    cache: KVCacheManager
    chunk_size: int
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    waiting: WaitingQueue = field(default_factory=WaitingQueue)
    chunked: Req | None = None
    passes: int = 0  # prefill passes so far (the clock of policies' starvation rule)

    @property
    def runnable(self) -> bool:
        return bool(self.waiting) or self.chunked is not None

    def add(self, req: Req) -> None:
        req.enqueued_tick = self.passes
        self.waiting.append(req)

    def requeue_front(self, reqs: list[Req]) -> None:
        """Retracted requests go back to the head of the queue, in the given order."""
        for req in reqs:
            req.enqueued_tick = self.passes
        self.waiting.push_front(reqs)

    def remove(self, req: Req) -> bool:
        """Take `req` out of admission (abort); True if it was here."""
        if req is self.chunked:
            self.chunked = None
            return True
        return self.waiting.remove(req)

    def schedule(self, budget: PrefillBudget) -> PrefillBatch | None:
        """The next prefill batch within `budget`, allocated; None if nothing fits."""
        if not self.runnable or budget.tokens <= 0:
            return None
        self.passes += 1
        adder = PrefillAdder(self.cache, budget, self.chunk_size)
        candidates = [self.chunked] if self.chunked else []
        candidates += order_waiting(list(self.waiting), self.policy, self.cache, self.passes)
        for req in candidates:
            result = adder.try_add(req)
            if result not in (AddResult.ADDED, AddResult.CHUNKED):
                break
        batch = adder.batch
        if not batch.reqs:
            return None
        for req in batch.reqs:
            if self.waiting.remove(req) and req.retractions == 0:
                batch.admitted.append(req)
        self.chunked = adder.chunked
        return batch

    def head(self) -> Req | None:
        """The request admission would offer first."""
        if self.chunked is not None:
            return self.chunked
        ordered = order_waiting(list(self.waiting), self.policy, self.cache, self.passes)
        return ordered[0] if ordered else None

    def fits(self, req: Req, running_reserved: float) -> bool:
        """Whether `req` alone would be admitted now (a row, and KV for its whole life,
        counting what its cached prefix already holds), changing nothing."""
        fresh = not self.cache.has_row(req)
        if fresh and self.cache.free_rows == 0:
            return False
        cached = self.cache.peek(req) if fresh else 0
        held = max(len(self.cache.holding(req).pages), cached // self.cache.page_size)
        end = req.seq_len + req.clipped_remaining_new_tokens
        need = max(0, self.cache.allocator.pages_for(end) - held) * self.cache.page_size
        return need <= self.cache.available_size - running_reserved

    def abort_stuck_chunk(self) -> Req | None:
        """The request being chunked, taken out, when it can never get its next chunk (the
        pool cannot hold it while nothing else runs); the caller fails it."""
        stuck, self.chunked = self.chunked, None
        return stuck
