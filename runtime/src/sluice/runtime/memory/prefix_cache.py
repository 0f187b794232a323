"""The prefix cache's contract, and the null cache used with `--disable-radix-cache`.

The scheduler's KV cache manager talks to a `PrefixCache` only, so turning prefix sharing
off swaps the object, not the code paths: `NoPrefixCache` matches nothing, keeps nothing,
and hands every page it is given straight back to the allocator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class PrefixMatch:
    """`num_tokens` leading tokens are cached on `pages`; `node` is the handle to lock."""

    num_tokens: int
    pages: list[int] = field(default_factory=list)
    node: Any = None


class PrefixCache(Protocol):
    """Page-aligned token prefixes whose KV pages the cache owns.

    Invariants: a page is owned by the cache or by a request, never both; a locked entry
    (`inc_lock_ref`) is never evicted; `evictable_tokens + protected_tokens` is what the
    cache holds; `all_pages()` lists exactly the pages it owns.
    """

    evictable_tokens: int
    protected_tokens: int

    @property
    def total_tokens(self) -> int: ...

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of `tokens` (refreshes its LRU position)."""

    def prefix_len(self, tokens: list[int]) -> int:
        """Length of that prefix without changing the cache (no split, no LRU touch)."""

    def prefix_pages(self, tokens: list[int]) -> list[int]:
        """The pages of that prefix, changing nothing."""

    def insert(self, tokens: list[int], pages: list[int]) -> PrefixMatch:
        """Cache page-aligned `tokens` on `pages`; `num_tokens` of the result is how many
        were cached already (the caller still owns those pages of its own)."""

    def inc_lock_ref(self, node: Any) -> None: ...

    def dec_lock_ref(self, node: Any) -> None: ...

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` unlocked tokens if possible; returns how many."""

    def reset(self) -> None: ...

    def all_pages(self) -> list[int]: ...

    def pages_oldest_first(self) -> list[int]:
        """Every cached page, least recently used first."""

    def check_integrity(self) -> None: ...


class NoPrefixCache:
    """A prefix cache that caches nothing: every inserted page goes back at once."""

    evictable_tokens = 0
    protected_tokens = 0

    def __init__(self, page_size: int, free_pages: Callable[[list[int]], None]) -> None:
        self.page_size = page_size
        self._free_pages = free_pages

    @property
    def total_tokens(self) -> int:
        return 0

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        return PrefixMatch(0)

    def prefix_len(self, tokens: list[int]) -> int:
        return 0

    def prefix_pages(self, tokens: list[int]) -> list[int]:
        return []

    def insert(self, tokens: list[int], pages: list[int]) -> PrefixMatch:
        # nothing is kept, so from the caller's view all of it was "already cached":
        # the caller frees its own copy of every page
        return PrefixMatch(len(tokens))

    def inc_lock_ref(self, node: Any) -> None:
        pass

    def dec_lock_ref(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def reset(self) -> None:
        pass

    def all_pages(self) -> list[int]:
        return []

    def pages_oldest_first(self) -> list[int]:
        return []

    def check_integrity(self) -> None:
        pass
