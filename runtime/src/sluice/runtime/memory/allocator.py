"""`TokenToKVPoolAllocator`: hands out KV slots a page at a time (host-side bookkeeping).

The pool has `num_pages` pages of `page_size` slots; page 0 is reserved so that slot 0 is
never a real token (padded writes may target it). A double free raises: in tests that is a
bug caught, in production a bug that would otherwise corrupt another request's KV. The K/V
buffers themselves live on the device, owned by the model worker; this class only decides
which slots are whose.
"""

from __future__ import annotations


class TokenToKVPoolAllocator:
    def __init__(self, max_total_tokens: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self.num_pages = max_total_tokens // page_size
        if self.num_pages < 1:
            raise ValueError(f"KV pool of {max_total_tokens} tokens holds no page of {page_size}")
        # page ids 1..num_pages are real; the buffers have num_pages + 1 pages
        self._free: list[int] = list(range(self.num_pages, 0, -1))
        self._is_free = [False] + [True] * self.num_pages

    @property
    def size(self) -> int:
        """Usable tokens (excluding the reserved page)."""
        return self.num_pages * self.page_size

    @property
    def num_slots(self) -> int:
        """Rows the K/V buffers need, including the reserved page."""
        return (self.num_pages + 1) * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def available_size(self) -> int:
        return len(self._free) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def alloc_pages(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if p == 0 or self._is_free[p]:
                raise RuntimeError(f"KV page {p} freed twice (or reserved page freed)")
            self._is_free[p] = True
        self._free.extend(pages)

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """KV slots of token positions [start, end) of a sequence laid out on `pages`."""
        ps = self.page_size
        if ps == 1:
            return pages[start:end]
        return [pages[pos // ps] * ps + pos % ps for pos in range(start, end)]
