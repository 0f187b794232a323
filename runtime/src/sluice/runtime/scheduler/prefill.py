"""Admitting waiting requests into a prefill batch: `PrefillAdder` and its three limits.

1. Request slots: a free row in the request->token table.
2. Token budget: at most `max_prefill_tokens` prompt tokens per batch; a prompt longer
   than what is left is chunked (`chunk_size`), and at most one request is chunked per tick.
3. KV capacity: free tokens minus what running requests are still expected to need
   (`remaining max_new_tokens x new_token_ratio`) minus what this batch already reserved
   must hold the new request's prompt and its (clipped) output.

Admission stops at the first request that does not fit: no skipping ahead of the queue head.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req

# A request's own max_new_tokens counts at most this much in the KV estimate, so one
# request asking for a huge output cannot block admission (SGLang clips the same way).
CLIP_MAX_NEW_TOKENS = 4096


class AddResult(enum.Enum):
    ADDED = "added"
    CHUNKED = "chunked"  # admitted with only part of its prompt this tick
    NO_SLOT = "no_slot"
    NO_TOKEN_BUDGET = "no_token_budget"
    NO_KV = "no_kv"


@dataclass
class PrefillAdder:
    cache: KVCacheManager
    token_budget: int
    chunk_size: int
    running_reserved: float  # expected remaining tokens of requests already decoding
    reqs: list[Req] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    chunked: Req | None = None
    _reserved: float = 0.0

    @property
    def kv_headroom(self) -> float:
        return self.cache.available_size - self.running_reserved - self._reserved

    def _fits_kv(self, req: Req, chunk_tokens: int) -> bool:
        expected = req.extend_len + min(req.remaining_new_tokens, CLIP_MAX_NEW_TOKENS)
        page_slack = self.cache.page_size  # a partly used last page
        return expected + page_slack <= self.kv_headroom and (
            self.cache.pages_needed(req, req.kv_len + chunk_tokens) * self.cache.page_size
            <= self.cache.available_size
        )

    def try_add(self, req: Req) -> AddResult:
        """Admit `req` (a new, retracted or chunked request) if all three limits allow."""
        if self.chunked is not None:
            return AddResult.NO_TOKEN_BUDGET
        if req.req_pool_idx is None and self.cache.free_slots == 0:
            return AddResult.NO_SLOT
        fresh = req.req_pool_idx is None
        if fresh:
            self.cache.match_prefix(req)
        result = self._try_add(req)
        if fresh and result not in (AddResult.ADDED, AddResult.CHUNKED):
            self.cache.unmatch(req)
        return result

    def _try_add(self, req: Req) -> AddResult:
        budget_left = self.token_budget - sum(self.extend_lens)
        if budget_left <= 0:
            return AddResult.NO_TOKEN_BUDGET
        take = min(req.extend_len, budget_left, self.chunk_size)
        if take < req.extend_len:
            take = self._page_aligned(req, take)
            if take <= 0:
                return AddResult.NO_TOKEN_BUDGET
        if not self._fits_kv(req, take):
            return AddResult.NO_KV
        if not self.cache.acquire_slot(req):
            return AddResult.NO_SLOT
        self.reqs.append(req)
        self.extend_lens.append(take)
        self._reserved += req.extend_len + min(req.remaining_new_tokens, CLIP_MAX_NEW_TOKENS)
        if take < req.extend_len:
            self.chunked = req
            return AddResult.CHUNKED
        return AddResult.ADDED

    def _page_aligned(self, req: Req, take: int) -> int:
        """Shorten a chunk so that it ends on a page boundary (full pages stay shareable)."""
        ps = self.cache.page_size
        end = (req.kv_len + take) // ps * ps
        return end - req.kv_len if end > req.kv_len else take
