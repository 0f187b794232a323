"""`KVCacheManager`: which KV pages and request row each request holds (host bookkeeping).

The scheduler asks it: how much of a request is already cached (`match_prefix`, `peek`),
how much can be allocated (`available_size`, counting evictable cached pages), give a
request KV slots for its next tokens (`extend`, evicting cached pages when the pool runs
short), and take everything back (`release`). Every path that ends a request's residence
(finish, abort, retraction) goes through `release`, so a page or a row is returned exactly
once; the request's computed full pages stay in the prefix cache for later requests.

What each request holds is kept here, by request id (`KVHolding`, as vLLM's
`req_to_blocks`): a `Req` says what a request is, this manager says where it sits. A
holding's `pages[:shared_pages]` belong to the prefix cache (locked while in use); the rest
belong to the request. With `--disable-radix-cache` the prefix cache is a `NoPrefixCache`:
the same code, nothing kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.prefix_cache import NoPrefixCache, PrefixCache
from sluice.runtime.memory.radix_cache import RadixCache
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.memory.window_pages import WindowPages
from sluice.runtime.scheduler.request import Req, cache_key

if TYPE_CHECKING:
    from sluice.runtime.engine.executor import DeviceRowReader


@dataclass
class KVHolding:
    """What one request holds.

    `kv_len` tokens of its sequence (prompt, then everything generated so far) have their
    K/V in the pool, laid out on `pages` (position p lives in page `pages[p // page_size]`);
    the leading `shared_pages` of them belong to the prefix cache, locked through
    `prefix_node`. A retracted request gives all of it back and keeps its output, so it
    re-prefills exactly what it had.

    `row` is its row of the request tables. `table_slots` and `table_tokens` say how far
    the device copies of that row (KV slots, token ids) have been written by launched
    forwards; they restart at 0 with every new row.

    With a window pool: no query still to run reads a key before `window_start`, and the
    window pages of its own pages before `window_released` have been given back.
    """

    row: int | None = None
    pages: list[int] = field(default_factory=list)
    kv_len: int = 0
    shared_pages: int = 0
    prefix_node: Any = None
    table_slots: int = 0
    table_tokens: int = 0
    window_start: int = 0
    window_released: int = 0


_NOTHING = KVHolding()  # what a request holding nothing reads (never written)


@dataclass
class KVCacheManager:
    allocator: TokenToKVPoolAllocator
    rows: RequestSlots
    prefix: PrefixCache
    # the sliding-window layers' pool, for a model with both kinds of layers (else None)
    window: WindowPages | None = None
    held: dict[str, KVHolding] = field(default_factory=dict)  # by request id

    @classmethod
    def create(
        cls,
        allocator: TokenToKVPoolAllocator,
        rows: RequestSlots,
        enable_radix: bool,
        window: WindowPages | None = None,
    ) -> KVCacheManager:
        kind = RadixCache if enable_radix else NoPrefixCache
        manager = cls(allocator, rows, NoPrefixCache(allocator.page_size, allocator.free), window)
        manager.prefix = kind(allocator.page_size, manager._free)
        return manager

    def _free(self, pages: list[int]) -> None:
        """Give full pages back, with their window pages."""
        if self.window is not None:
            self.window.detach(pages)
        self.allocator.free(pages)

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

    # ---- what a request holds -----------------------------------------------------------
    def holding(self, req: Req) -> KVHolding:
        """What `req` holds (read only: the manager changes it)."""
        return self.held.get(req.rid, _NOTHING)

    def _own(self, req: Req) -> KVHolding:
        return self.held.setdefault(req.rid, KVHolding())

    def kv_len(self, req: Req) -> int:
        """Positions of `req` with K/V in the pool (or being written by a launched forward)."""
        return self.holding(req).kv_len

    def has_row(self, req: Req) -> bool:
        return self.holding(req).row is not None

    def extend_len(self, req: Req) -> int:
        """Tokens still to prefill before `req` can decode."""
        return req.seq_len - self.kv_len(req)

    def holds_id(self, rid: str) -> bool:
        """Whether a request with id `rid` still holds KV or a row (a finished one may,
        until the forward that uses them is done)."""
        return rid in self.held

    def pages_needed(self, req: Req, new_kv_len: int) -> int:
        return max(0, self.allocator.pages_for(new_kv_len) - len(self.holding(req).pages))

    def decode_pages_needed(self, reqs: list[Req]) -> int:
        """Pages a decode step over `reqs` must allocate (one per request whose last page is full)."""
        return sum(self.pages_needed(r, self.kv_len(r) + 1) for r in reqs)

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
        if self.window is None:
            return self.prefix.prefix_len(self._matchable(req))
        return self.window.usable_prefix(self.prefix.prefix_pages(self._matchable(req)))

    def match_prefix(self, req: Req) -> int:
        """Point a request holding no KV at the longest cached prefix of its tokens (locked);
        with a window pool, only as far as the window before its end is still cached."""
        if self.holding(req).pages:
            return 0
        match = self.prefix.match_prefix(self._matchable(req))
        usable = match.num_tokens
        if self.window is not None:
            usable = self.window.usable_prefix(match.pages)
        if usable:
            # the lock covers the whole match; the pages past `usable` stay the cache's
            self.prefix.inc_lock_ref(match.node)
            h = self._own(req)
            h.pages = match.pages[: usable // self.page_size]
            h.shared_pages = len(h.pages)
            h.prefix_node = match.node
            h.kv_len = usable
            if self.window is not None:
                h.window_start = self.window.first_visible(usable)
        return usable

    def _unlock(self, h: KVHolding) -> None:
        if h.prefix_node is not None:
            self.prefix.dec_lock_ref(h.prefix_node)
        h.prefix_node = None

    # ---- allocation ---------------------------------------------------------------------
    def acquire_row(self, req: Req) -> bool:
        if self.has_row(req):
            return True
        row = self.rows.alloc()
        if row is None:
            return False
        h = self._own(req)
        h.row, h.table_slots, h.table_tokens = row, 0, 0
        return True

    def _alloc_pages(self, n: int) -> list[int] | None:
        short = n - self.allocator.num_free_pages
        if short > 0:
            self.prefix.evict(short * self.page_size)
        pages = self.allocator.alloc_pages(n)
        if pages is None or self.window is None:
            return pages
        if n > self.window.num_free_pages:
            self._evict_window_pages(n)
        if not self.window.attach(pages):
            self.allocator.free(pages)
            return None
        return pages

    def _evict_window_pages(self, want_free: int) -> None:
        """Until `want_free` window pages are free (and a sixteenth of the pool more, so
        that the next allocations need not come back): detach them from cached pages no
        live request's window holds, least recently used first; failing that, evict cached
        pages outright."""
        window = self.window
        assert window is not None
        needed = self.live_window_pages()
        slack = window.allocator.num_pages // 16
        short = want_free + slack - window.num_free_pages
        window.detach_first(self.prefix.pages_oldest_first(), short, needed)
        while window.num_free_pages < want_free and self.prefix.evict(self.page_size):
            pass

    def live_window_pages(self) -> set[int]:
        """The full pages inside some live request's window (their window pages stay)."""
        return {
            page
            for h in self.held.values()
            for page in h.pages[h.window_start // self.page_size :]
        }

    def live_window_count(self) -> int:
        """`len(live_window_pages())` at a tick's cost: a request's own pages are its alone,
        so only the shared (cached) pages inside windows need a set."""
        own, shared = 0, set()
        for h in self.held.values():
            first = h.window_start // self.page_size
            own += max(0, len(h.pages) - max(first, h.shared_pages))
            shared.update(h.pages[first : h.shared_pages])
        return own + len(shared)

    def slide_windows(self) -> None:
        """At the start of a tick, before anything is scheduled: every request's next query
        is at its `kv_len` (launched forwards run before the next one, so the window pages
        they read are only overwritten after them)."""
        if self.window is not None:
            for h in self.held.values():
                self._slide_window(h, h.kv_len)

    def _slide_window(self, h: KVHolding, query_pos: int) -> None:
        """The next forward's first query is at `query_pos`: nothing still to run reads a key
        before its window, so the request's own pages wholly before it give their window
        pages back (cached pages keep theirs until the window pool is short)."""
        assert self.window is not None
        h.window_start = max(h.window_start, self.window.first_visible(query_pos))
        end = h.window_start // self.page_size
        first = max(h.window_released, h.shared_pages)
        if end > first:
            self.window.detach(h.pages[first:end])
        h.window_released = max(h.window_released, end)

    def extend(self, req: Req, new_kv_len: int) -> bool:
        """Give `req` KV slots for positions [kv_len, new_kv_len); False if the pool is short.

        On success its `kv_len` becomes `new_kv_len`: the caller runs the forward that fills
        them."""
        h = self.holding(req)
        assert h.row is not None, "extend() before acquire_row()"
        if new_kv_len > self.rows.max_context_len:
            raise ValueError(f"request {req.rid} exceeds the context length")
        if self.window is not None:
            self._slide_window(h, h.kv_len)
        need = self.pages_needed(req, new_kv_len)
        if need:
            pages = self._alloc_pages(need)
            if pages is None:
                return False
            h.pages.extend(pages)
        h.kv_len = new_kv_len
        return True

    def roll_back(self, req: Req, computed: int) -> None:
        """Only the first `computed` positions hold K/V a completed forward wrote (the rest
        were a failed forward's): releasing it caches nothing else."""
        if (h := self.held.get(req.rid)) is not None:
            h.kv_len = min(h.kv_len, computed)

    def slots(self, req: Req, start: int, end: int) -> list[int]:
        return self.allocator.slots(self.holding(req).pages, start, end)

    def window_slots(self, req: Req, start: int, end: int) -> list[int]:
        """The sliding layers' slots of positions [start, end) (none without a window pool)."""
        if self.window is None:
            return []
        return self.window.slots(self.holding(req).pages, start, end)

    def table_write(self, req: Req, end: int, sample: bool) -> tuple[int, int, int]:
        """A launched forward writes `req`'s device table row up to position `end` (and its
        sampled token at `end`): (row, first slot and first token it must write)."""
        h = self.holding(req)
        assert h.row is not None
        written = (h.row, h.table_slots, min(h.table_tokens, end))
        h.table_slots = end
        h.table_tokens = end + 1 if sample else end  # the sampled token lands at `end`
        return written

    def cache_unfinished(self, req: Req, computed: int) -> None:
        """Share the computed full pages of a request that is still running (after its
        prefill or one of its chunks), so a request with the same prefix can reuse them
        before this one finishes. `computed`: positions whose KV a completed forward wrote.

        Only when the cache holds exactly what the request already shares: then its own
        full pages move to the cache (same pages, same table row) and stay locked."""
        h = self.holding(req)
        full = min(computed, h.kv_len) // self.page_size
        if full <= h.shared_pages:
            return
        tokens = cache_key(req, full * self.page_size)
        if self.prefix.prefix_len(tokens) != h.shared_pages * self.page_size:
            return  # someone cached more of it meanwhile; the finish-time insert sorts it out
        inserted = self.prefix.insert(tokens, h.pages[:full])
        if inserted.num_tokens != h.shared_pages * self.page_size:
            return  # the cache kept none of it (prefix caching is off)
        self.prefix.inc_lock_ref(inserted.node)
        self._unlock(h)
        h.prefix_node = inserted.node
        h.shared_pages = full

    # ---- release ------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """Return the request's pages and row; its computed full pages stay cached. Safe to
        call on a request holding nothing."""
        h = self.held.pop(req.rid, None)
        if h is None:
            return
        if h.kv_len:
            full = h.kv_len // self.page_size
            cached = self.prefix.insert(cache_key(req, full * self.page_size), h.pages[:full])
            dup_end = max(h.shared_pages, cached.num_tokens // self.page_size)
            # pages the cache already had a copy of, and the partly filled last page; pages
            # [dup_end, full) now belong to the cache
            self._free(h.pages[h.shared_pages : dup_end] + h.pages[full:])
        else:
            self._free(h.pages[h.shared_pages :])
        self._unlock(h)
        if h.row is not None:
            self.rows.free(h.row)

    def flush(self) -> None:
        self.prefix.reset()

    def check_integrity(self, live: list[Req], device_row: DeviceRowReader | None = None) -> None:
        """free + cached + in-use pages = total; rows are not shared; with `device_row`, each
        live request's device table row holds its pages' slots."""
        if leaked := set(self.held) - {r.rid for r in live}:
            raise AssertionError(f"KV held by requests no longer live: {sorted(leaked)}")
        owned = sum(len(h.pages) - h.shared_pages for h in self.held.values())
        cached = len(self.prefix.all_pages())
        free = self.allocator.num_free_pages
        if free + cached + owned != self.allocator.num_pages:
            raise AssertionError(
                f"KV pages leak: free {free} + cached {cached} + in use {owned} "
                f"!= total {self.allocator.num_pages}"
            )
        self.prefix.check_integrity()
        if self.window is not None:
            self.window.check_integrity(
                [p for h in self.held.values() for p in h.pages[h.shared_pages :]]
                + self.prefix.all_pages()
            )
        rows = [h.row for h in self.held.values() if h.row is not None]
        if len(rows) != len(set(rows)) or self.rows.available_size + len(rows) != self.rows.size:
            raise AssertionError("request rows leak or are shared")
        if device_row is None:
            return
        for r in live:
            h = self.holding(r)
            if h.row is not None and h.table_slots:
                written = min(h.table_slots, h.kv_len)
                if device_row(h.row, written) != self.slots(r, 0, written):
                    raise AssertionError(f"table row of {r.rid} does not match its pages")
