"""`KVCacheManager`: which KV pages and request row each request holds (host bookkeeping).

The scheduler asks it: how much of a request is already cached (`match_prefix`, `peek`),
how much can be allocated (`available_size`, counting evictable cached pages), give a
request KV slots for its next tokens (`extend`, evicting cached pages when the pool runs
short), and take everything back (`release`). Every path that ends a request's residence
(finish, abort, retraction) goes through `release`, so a page or a row is returned exactly
once; the request's computed full pages stay in the prefix cache for later requests.

A request's `kv_pages[:shared_pages]` belong to the prefix cache (locked while in use);
the rest belong to the request. With `--disable-radix-cache` the prefix cache is a
`NoPrefixCache`: the same code, nothing kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.prefix_cache import NoPrefixCache, PrefixCache
from sluice.runtime.memory.radix_cache import RadixCache
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.request import Req, cache_key

if TYPE_CHECKING:
    from sluice.runtime.engine.executor import DeviceRowReader


@dataclass
class KVCacheManager:
    allocator: TokenToKVPoolAllocator
    rows: RequestSlots
    prefix: PrefixCache

    @classmethod
    def create(
        cls, allocator: TokenToKVPoolAllocator, rows: RequestSlots, enable_radix: bool
    ) -> KVCacheManager:
        kind = RadixCache if enable_radix else NoPrefixCache
        return cls(allocator, rows, kind(allocator.page_size, allocator.free))

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    @property
    def total_tokens(self) -> int:
        return self.allocator.size

    @property
    def cached_size(self) -> int:
        return self.prefix.total_tokens

    @property
    def available_size(self) -> int:
        """Tokens that can be allocated now: free pages plus evictable cached pages."""
        return self.allocator.available_size + self.prefix.evictable_tokens

    @property
    def free_rows(self) -> int:
        return self.rows.available_size

    def pages_needed(self, req: Req, new_kv_len: int) -> int:
        return max(0, self.allocator.pages_for(new_kv_len) - len(req.kv_pages))

    def decode_pages_needed(self, reqs: list[Req]) -> int:
        """Pages a decode step over `reqs` must allocate (one per request whose last page is full)."""
        return sum(self.pages_needed(r, r.kv_len + 1) for r in reqs)

    # ---- prefix reuse -------------------------------------------------------------------
    @staticmethod
    def _matchable(req: Req) -> list[int]:
        # at least one token is left to compute: its logits give the next token; and every
        # position whose logits give a wanted prompt logprob is computed, not reused
        end = req.seq_len - 1
        if (wanted := req.prompt_logprob_from) is not None:
            end = min(end, wanted - 1)
        return cache_key(req, max(end, 0))

    def peek(self, req: Req) -> int:
        """Cached prefix length of a request, changing nothing (for admission policies)."""
        return self.prefix.prefix_len(self._matchable(req))

    def match_prefix(self, req: Req) -> int:
        """Point a request holding no KV at the longest cached prefix of its tokens (locked)."""
        if req.kv_pages:
            return 0
        match = self.prefix.match_prefix(self._matchable(req))
        if match.num_tokens:
            self.prefix.inc_lock_ref(match.node)
            req.kv_pages = list(match.pages)
            req.shared_pages = len(match.pages)
            req.prefix_node = match.node
            req.kv_len = match.num_tokens
        return match.num_tokens

    def _unlock(self, req: Req) -> None:
        if req.prefix_node is not None:
            self.prefix.dec_lock_ref(req.prefix_node)
        req.prefix_node = None

    # ---- allocation ---------------------------------------------------------------------
    def acquire_row(self, req: Req) -> bool:
        if req.row is not None:
            return True
        row = self.rows.alloc()
        if row is None:
            return False
        req.row, req.table_slots, req.table_tokens = row, 0, 0
        return True

    def _alloc_pages(self, n: int) -> list[int] | None:
        short = n - self.allocator.num_free_pages
        if short > 0:
            self.prefix.evict(short * self.page_size)
        return self.allocator.alloc_pages(n)

    def extend(self, req: Req, new_kv_len: int) -> bool:
        """Give `req` KV slots for positions [kv_len, new_kv_len); False if the pool is short.

        On success `req.kv_len` becomes `new_kv_len`: the caller runs the forward that fills
        them."""
        assert req.row is not None, "extend() before acquire_row()"
        if new_kv_len > self.rows.max_context_len:
            raise ValueError(f"request {req.rid} exceeds the context length")
        need = self.pages_needed(req, new_kv_len)
        if need:
            pages = self._alloc_pages(need)
            if pages is None:
                return False
            req.kv_pages.extend(pages)
        req.kv_len = new_kv_len
        return True

    def slots(self, req: Req, start: int, end: int) -> list[int]:
        return self.allocator.slots(req.kv_pages, start, end)

    def cache_unfinished(self, req: Req, computed: int) -> None:
        """Share the computed full pages of a request that is still running (after its
        prefill or one of its chunks), so a request with the same prefix can reuse them
        before this one finishes. `computed`: positions whose KV a completed forward wrote.

        Only when the cache holds exactly what the request already shares: then its own
        full pages move to the cache (same pages, same table row) and stay locked."""
        full = min(computed, req.kv_len) // self.page_size
        if full <= req.shared_pages:
            return
        tokens = cache_key(req, full * self.page_size)
        if self.prefix.prefix_len(tokens) != req.shared_pages * self.page_size:
            return  # someone cached more of it meanwhile; the finish-time insert sorts it out
        inserted = self.prefix.insert(tokens, req.kv_pages[:full])
        if inserted.num_tokens != req.shared_pages * self.page_size:
            return  # the cache kept none of it (prefix caching is off)
        self.prefix.inc_lock_ref(inserted.node)
        self._unlock(req)
        req.prefix_node = inserted.node
        req.shared_pages = full

    # ---- release ------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """Return the request's pages and row; its computed full pages stay cached. Safe to
        call on a request holding nothing."""
        if req.kv_len:
            full = req.kv_len // self.page_size
            cached = self.prefix.insert(cache_key(req, full * self.page_size), req.kv_pages[:full])
            dup_end = max(req.shared_pages, cached.num_tokens // self.page_size)
            # pages the cache already had a copy of, and the partly filled last page; pages
            # [dup_end, full) now belong to the cache
            self.allocator.free(req.kv_pages[req.shared_pages : dup_end] + req.kv_pages[full:])
        else:
            self.allocator.free(req.kv_pages[req.shared_pages :])
        self._unlock(req)
        req.kv_pages, req.shared_pages, req.kv_len = [], 0, 0
        if req.row is not None:
            self.rows.free(req.row)
            req.row = None

    def flush(self) -> None:
        self.prefix.reset()

    def check_integrity(self, live: list[Req], device_row: DeviceRowReader | None = None) -> None:
        """free + cached + in-use pages = total; rows are not shared; with `device_row`, each
        live request's device table row holds its pages' slots."""
        owned = sum(len(r.kv_pages) - r.shared_pages for r in live)
        cached = len(self.prefix.all_pages())
        free = self.allocator.num_free_pages
        if free + cached + owned != self.allocator.num_pages:
            raise AssertionError(
                f"KV pages leak: free {free} + cached {cached} + in use {owned} "
                f"!= total {self.allocator.num_pages}"
            )
        self.prefix.check_integrity()
        rows = [r.row for r in live if r.row is not None]
        if len(rows) != len(set(rows)) or self.rows.available_size + len(rows) != self.rows.size:
            raise AssertionError("request rows leak or are shared")
        if device_row is None:
            return
        for r in live:
            if r.row is not None and r.table_slots:
                written = min(r.table_slots, r.kv_len)
                if device_row(r.row, written) != self.slots(r, 0, written):
                    raise AssertionError(f"table row of {r.rid} does not match its pages")
