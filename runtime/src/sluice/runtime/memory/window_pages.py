"""`WindowPages`: the sliding-window layers' KV, kept only inside the window.

A model whose layers mix full and sliding-window attention (Gemma 2/3, gpt-oss) has two
pools. The full pool (`TokenToKVPoolAllocator`) is the one every structure is keyed on: the
request holdings, the radix cache, the device's `req_to_token`. This smaller pool holds the
sliding layers' K/V. A full page may have a window page attached (`window_of[page]`, 0 when
none): the slots its tokens take in the sliding layers' buffers. A page gets one when it is
allocated and loses it when it is freed, when every query that may still read it has moved
past it (a request's own pages, as its window slides), or when this pool is short and no
live request's window holds it (a cached page: the radix cache keeps the full page).

A cached prefix is only usable up to where the window before its end is still attached
(`usable_prefix`); a request that matches more computes the rest again.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.runtime.memory.allocator import TokenToKVPoolAllocator


class WindowPages:
    def __init__(
        self,
        num_full_pages: int,
        window_tokens: int,
        page_size: int,
        window: int,
        holds_all_layers: bool = False,
    ) -> None:
        """`holds_all_layers`: every layer slides, so this pool holds all the K/V and the
        full pool's pages are keys only (its usage is the KV usage)."""
        if window < 1:
            raise ValueError(f"sliding window must be at least 1 token, got {window}")
        self.allocator = TokenToKVPoolAllocator(window_tokens, page_size)
        self.window = window
        self.page_size = page_size
        self.holds_all_layers = holds_all_layers
        self.window_of = [0] * (num_full_pages + 1)
        self.attached = 0

    @property
    def num_slots(self) -> int:
        """Rows the sliding layers' K/V buffers need, including the reserved page."""
        return self.allocator.num_slots

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free_pages

    def first_visible(self, query_pos: int) -> int:
        """The first key position a query at `query_pos` (or after it) reads."""
        return max(0, query_pos - self.window + 1)

    def first_needed_page(self, query_pos: int) -> int:
        """Index, in a sequence's pages, of the first page a query at `query_pos` reads."""
        return self.first_visible(query_pos) // self.page_size

    def attach(self, pages: list[int]) -> bool:
        """A window page for each of `pages` (freshly allocated full pages); all or none."""
        got = self.allocator.alloc_pages(len(pages))
        if got is None:
            return False
        for page, slot_page in zip(pages, got, strict=True):
            if self.window_of[page]:
                raise RuntimeError(f"full page {page} already has a window page")
            self.window_of[page] = slot_page
        self.attached += len(pages)
        return True

    def detach(self, pages: Iterable[int]) -> int:
        """Free the window pages of `pages` that have one; returns how many."""
        freed = []
        for page in pages:
            if slot_page := self.window_of[page]:
                self.window_of[page] = 0
                freed.append(slot_page)
        self.allocator.free(freed)
        self.attached -= len(freed)
        return len(freed)

    def detach_first(self, candidates: Iterable[int], count: int, keep: set[int]) -> int:
        """Detach the window pages of the first `count` of `candidates` that have one and
        are not in `keep`; returns how many."""
        window_of, chosen = self.window_of, []
        for page in candidates:
            if window_of[page] and page not in keep:
                chosen.append(page)
                if len(chosen) >= count:
                    break
        return self.detach(chosen)

    def has(self, page: int) -> bool:
        return self.window_of[page] != 0

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Window slots of positions [start, end) of a sequence on `pages`; a position whose
        page has no window page gets a slot of the reserved page 0 (never read: it is
        outside every window that reads this table row)."""
        ps = self.page_size
        return [self.window_of[pages[pos // ps]] * ps + pos % ps for pos in range(start, end)]

    def usable_prefix(self, pages: list[int]) -> int:
        """Longest page-aligned prefix of a cached sequence on `pages` whose last window is
        attached: a request continuing after it finds every key its first query reads."""
        ps = self.page_size
        last_missing = -1  # index of the last page without a window page, before `k`
        best = 0
        for k in range(1, len(pages) + 1):
            if not self.window_of[pages[k - 1]]:
                last_missing = k - 1
            if last_missing < self.first_needed_page(k * ps):
                best = k
        return best * ps

    def check_integrity(self, live_pages: Iterable[int]) -> None:
        """Window pages attached only to live full pages, each once; free + attached = all."""
        live = set(live_pages)
        owners = [p for p, w in enumerate(self.window_of) if w]
        if stray := [p for p in owners if p not in live]:
            raise AssertionError(f"window pages attached to free full pages {stray[:8]}")
        slot_pages = [self.window_of[p] for p in owners]
        if len(set(slot_pages)) != len(slot_pages) or len(slot_pages) != self.attached:
            raise AssertionError("window pages shared or miscounted")
        if self.allocator.num_free_pages + self.attached != self.allocator.num_pages:
            raise AssertionError(
                f"window pages leak: free {self.allocator.num_free_pages} + attached "
                f"{self.attached} != total {self.allocator.num_pages}"
            )


def window_pool_floor(max_running: int, window: int, page_size: int, prefill_tokens: int) -> int:
    """Window tokens that always suffice: every running request's window (plus the page its
    next token opens and one of page rounding) and one prefill budget of new tokens."""
    pages_per_request = -(-(window - 1) // page_size) + 2
    return (max_running * pages_per_request + -(-prefill_tokens // page_size)) * page_size
