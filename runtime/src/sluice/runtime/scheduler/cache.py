"""`KVCacheManager`: which KV pages and request slot each request holds.

The scheduler asks it four things: how much a request can reuse (`match_prefix`), does a
request fit (`available_size`, counting evictable cached pages), give a request KV slots
for its next tokens (`extend`, evicting cached pages when the pool runs short), and take
everything back (`release`). Every path that ends a request's residence (finish, abort,
retraction) goes through `release`, so a page or a slot is returned exactly once; with the
radix cache on, the request's computed prefix stays cached for later requests.

A request's `kv_pages[:shared_pages]` belong to the radix cache (locked while in use);
the rest belong to the request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.radix_cache import RadixCache
from sluice.runtime.memory.req_to_token import ReqToTokenPool
from sluice.runtime.scheduler.request import Req


@dataclass
class KVCacheManager:
    allocator: TokenToKVPoolAllocator
    req_pool: ReqToTokenPool
    radix: RadixCache | None = None

    @classmethod
    def create(
        cls, allocator: TokenToKVPoolAllocator, req_pool: ReqToTokenPool, enable_radix: bool
    ) -> KVCacheManager:
        radix = RadixCache(allocator.page_size, allocator.free) if enable_radix else None
        return cls(allocator, req_pool, radix)

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    @property
    def total_tokens(self) -> int:
        return self.allocator.size

    @property
    def evictable_size(self) -> int:
        return self.radix.evictable_tokens if self.radix else 0

    @property
    def cached_size(self) -> int:
        return self.radix.total_tokens if self.radix else 0

    @property
    def available_size(self) -> int:
        """Tokens that can be allocated now: free pages plus evictable cached pages."""
        return self.allocator.available_size + self.evictable_size

    @property
    def free_slots(self) -> int:
        return self.req_pool.available_size

    def pages_needed(self, req: Req, new_kv_len: int) -> int:
        return max(0, self.allocator.pages_for(new_kv_len) - len(req.kv_pages))

    def decode_pages_needed(self, reqs: list[Req]) -> int:
        """Pages a decode step over `reqs` must allocate (one per request whose last page is full)."""
        return sum(self.pages_needed(r, r.kv_len + 1) for r in reqs)

    # ---- prefix reuse -------------------------------------------------------------------
    def match_prefix(self, req: Req) -> int:
        """Point a request holding no KV at the longest cached prefix of its tokens (locked).

        At least one token is left to compute: its logits give the next token.
        """
        if self.radix is None or req.kv_pages:
            return 0
        ids = req.fill_ids
        match = self.radix.match_prefix(ids[: len(ids) - 1])
        if match.num_tokens:
            self.radix.inc_lock_ref(match.node)
            req.kv_pages = list(match.pages)
            req.shared_pages = len(match.pages)
            req.prefix_node = match.node
            req.kv_len = match.num_tokens
        return match.num_tokens

    def unmatch(self, req: Req) -> None:
        """Undo `match_prefix` for a request that was not admitted after all."""
        if req.prefix_node is not None and req.shared_pages == len(req.kv_pages):
            self._unlock(req)
            req.kv_pages, req.shared_pages, req.kv_len = [], 0, 0

    def _unlock(self, req: Req) -> None:
        if req.prefix_node is not None and self.radix is not None:
            self.radix.dec_lock_ref(req.prefix_node)
        req.prefix_node = None

    # ---- allocation ---------------------------------------------------------------------
    def acquire_slot(self, req: Req) -> bool:
        if req.req_pool_idx is not None:
            return True
        row = self.req_pool.alloc()
        if row is None:
            return False
        req.req_pool_idx = row
        if req.kv_len:  # a matched prefix: its slots go into the fresh row
            self.req_pool.write(row, 0, self.allocator.slots(req.kv_pages, 0, req.kv_len))
        return True

    def _alloc_pages(self, n: int) -> list[int] | None:
        short = n - self.allocator.num_free_pages
        if short > 0 and self.radix is not None:
            self.radix.evict(short * self.page_size)
        return self.allocator.alloc_pages(n)

    def extend(self, req: Req, new_kv_len: int) -> torch.Tensor | None:
        """Give `req` KV slots for positions [kv_len, new_kv_len); None if the pool is short.

        On success the slots are written into the request's table row and `req.kv_len`
        becomes `new_kv_len`: the caller runs the forward that fills them this tick.
        """
        assert req.req_pool_idx is not None, "extend() before acquire_slot()"
        if new_kv_len > self.req_pool.max_context_len:
            raise ValueError(f"request {req.rid} exceeds the context length")
        need = self.pages_needed(req, new_kv_len)
        if need:
            pages = self._alloc_pages(need)
            if pages is None:
                return None
            req.kv_pages.extend(pages)
        slots = self.allocator.slots(req.kv_pages, req.kv_len, new_kv_len)
        self.req_pool.write(req.req_pool_idx, req.kv_len, slots)
        req.kv_len = new_kv_len
        return slots

    def cache_unfinished(self, req: Req, computed: int) -> None:
        """Share the computed full pages of a request that is still running (after its
        prefill or one of its chunks), so a request with the same prefix can reuse them
        before this one finishes. `computed`: positions whose KV the forward just wrote (in
        the overlap loop `kv_len` may already count positions of the next, in-flight batch).

        Only when the tree holds nothing past what the request already shares: then its own
        full pages simply move to the tree (same pages, same table row) and stay locked."""
        if self.radix is None:
            return
        full = min(computed, req.kv_len) // self.page_size
        if full <= req.shared_pages:
            return
        tokens = req.fill_ids[: full * self.page_size]
        if self.radix.match_prefix(tokens).num_tokens > req.shared_pages * self.page_size:
            return  # someone cached more of it meanwhile; the finish-time insert sorts it out
        node = self.radix.insert(tokens, req.kv_pages[:full]).node
        self.radix.inc_lock_ref(node)
        self._unlock(req)
        req.prefix_node = node
        req.shared_pages = full

    # ---- release ------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """Return the request's pages and table row; its computed full pages stay cached
        when the radix cache is on. Safe to call on a request holding nothing."""
        own = req.kv_pages[req.shared_pages :]
        if self.radix is not None and req.kv_len:
            full = req.kv_len // self.page_size
            cached = self.radix.insert(req.fill_ids[: full * self.page_size], req.kv_pages[:full]).num_tokens
            dup_end = max(req.shared_pages, cached // self.page_size)
            # pages the tree already had a copy of, and the partly filled last page
            self.allocator.free(req.kv_pages[req.shared_pages : dup_end] + req.kv_pages[full:])
            # (pages [dup_end, full) now belong to the tree)
            self._unlock(req)
        elif own:
            self.allocator.free(own)
            self._unlock(req)
        else:
            self._unlock(req)
        req.kv_pages, req.shared_pages, req.kv_len = [], 0, 0
        if req.req_pool_idx is not None:
            self.req_pool.free(req.req_pool_idx)
            req.req_pool_idx = None

    def flush(self) -> None:
        if self.radix is not None:
            self.radix.reset()

    def check_integrity(self, live: list[Req]) -> None:
        """free + cached + in-use pages = total; each live request's table row is its pages."""
        owned = sum(len(r.kv_pages) - r.shared_pages for r in live)
        cached = len(self.radix.all_pages()) if self.radix else 0
        free = self.allocator.num_free_pages
        if free + cached + owned != self.allocator.num_pages:
            raise AssertionError(
                f"KV pages leak: free {free} + cached {cached} + in use {owned} "
                f"!= total {self.allocator.num_pages}"
            )
        if self.radix is not None:
            self.radix.check_integrity()
        rows = [r.req_pool_idx for r in live if r.req_pool_idx is not None]
        if len(rows) != len(set(rows)) or self.req_pool.available_size + len(rows) != self.req_pool.size:
            raise AssertionError("request slots leak or are shared")
        for r in live:
            if r.kv_len and r.req_pool_idx is not None:
                want = self.allocator.slots(r.kv_pages, 0, r.kv_len).to(torch.int32)
                have = self.req_pool.req_to_token[r.req_pool_idx, : r.kv_len].cpu()
                if not torch.equal(want, have):
                    raise AssertionError(f"table row of {r.rid} does not match its pages")

