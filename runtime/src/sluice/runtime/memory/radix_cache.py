"""`RadixCache`: a token-id radix tree whose nodes own KV pages, for prefix sharing.

Keys are whole pages: a node's `key` holds `len(pages) * page_size` token ids, so a match
is always page-aligned and a page is owned by exactly one node. A node with `lock_ref > 0`
(some running request uses its pages as a prefix, or a descendant's) is never evicted;
unlocked leaves are evicted least recently used first.

Invariant (see `check_integrity`): every cached token is either evictable (in an unlocked
node) or protected (in a locked one), and the sums match a walk of the tree. The unlocked
leaves are kept in a set as the tree changes, so eviction looks at them only, never at the
whole tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.runtime.memory.prefix_cache import PrefixMatch


@dataclass(eq=False)
class Node:
    key: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    parent: Node | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    # creation order: breaks LRU ties the same way in every process (tensor-parallel ranks
    # must evict the same nodes; `id()` differs by process)
    seq: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache:
    def __init__(self, page_size: int, free_pages: Callable[[list[int]], None]) -> None:
        self.page_size = page_size
        self._free_pages = free_pages
        self.root = Node()
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = itertools.count(1)
        self._seq = itertools.count(1)
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self._evictable_leaves: set[Node] = set()

    # ---- lookup -------------------------------------------------------------------------
    def _child_key(self, tokens: list[int], start: int) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.page_size])

    def prefix_len(self, tokens: list[int]) -> int:
        """Length of the longest cached page-aligned prefix, leaving the tree untouched."""
        return len(self.prefix_pages(tokens)) * self.page_size

    def prefix_pages(self, tokens: list[int]) -> list[int]:
        """The pages of that prefix, leaving the tree untouched."""
        usable = len(tokens) // self.page_size * self.page_size
        node, pos, pages = self.root, 0, []
        while pos < usable:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            n = self._common_pages(child.key, tokens, pos, usable)
            pages.extend(child.pages[:n])
            pos += n * self.page_size
            if n * self.page_size < len(child.key):
                break
            node = child
        return pages

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of `tokens` (splits the last node at the match
        end and refreshes the matched path's LRU position)."""
        usable = len(tokens) // self.page_size * self.page_size
        node, pos, pages = self.root, 0, []
        now = next(self._clock)
        node.last_access = now
        while pos < usable:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            n = self._common_pages(child.key, tokens, pos, usable)
            if n * self.page_size < len(child.key):
                child = self._split(child, n)
            pages.extend(child.pages)
            pos += len(child.key)
            node = child
            node.last_access = now
        return PrefixMatch(pos, pages, node)

    def _common_pages(self, key: list[int], tokens: list[int], start: int, end: int) -> int:
        ps, n = self.page_size, 0
        limit = min(len(key), end - start) // ps
        while n < limit and key[n * ps : (n + 1) * ps] == tokens[start + n * ps : start + (n + 1) * ps]:
            n += 1
        return n

    def _split(self, node: Node, num_pages: int) -> Node:
        """Cut `node` after `num_pages` pages; returns the new upper part."""
        cut = num_pages * self.page_size
        upper = Node(
            key=node.key[:cut], pages=node.pages[:num_pages], parent=node.parent, seq=next(self._seq)
        )
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        assert node.parent is not None
        node.parent.children[self._child_key(upper.key, 0)] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[num_pages:], upper
        upper.children[self._child_key(node.key, 0)] = node
        return upper

    # ---- insertion ----------------------------------------------------------------------
    def insert(self, tokens: list[int], pages: list[int]) -> PrefixMatch:
        """Cache `tokens` (page-aligned) backed by `pages`. Returns how many tokens were
        already cached (the caller frees its own pages for that range) and the node that now
        ends `tokens`; `pages` of the result is left empty (callers never need it)."""
        assert len(tokens) == len(pages) * self.page_size
        node, pos = self.root, 0
        now = next(self._clock)
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                new = Node(
                    key=tokens[pos:],
                    pages=pages[pos // self.page_size :],
                    parent=node,
                    last_access=now,
                    seq=next(self._seq),
                )
                node.children[self._child_key(tokens, pos)] = new
                self._account(new, +1)
                self._evictable_leaves.discard(node)
                self._evictable_leaves.add(new)
                return PrefixMatch(pos, [], new)
            n = self._common_pages(child.key, tokens, pos, len(tokens))
            if n * self.page_size < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pos += len(child.key)
            node = child
        return PrefixMatch(pos, [], node)

    # ---- locking ------------------------------------------------------------------------
    def inc_lock_ref(self, node: Node) -> None:
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.evictable_tokens -= len(node.key)
                self.protected_tokens += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: Node) -> None:
        while node is not self.root and node is not None:
            if node.lock_ref <= 0:
                raise RuntimeError("radix node unlocked more often than locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_tokens += len(node.key)
                self.protected_tokens -= len(node.key)
                if node.is_leaf:
                    self._evictable_leaves.add(node)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction -----------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` cached tokens if possible (LRU leaves first)."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.seq, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self._free_pages(node.pages)
            freed += len(node.key)
            self._account(node, -1)
            self._evictable_leaves.discard(node)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0)]
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                self._evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.seq, parent))
        return freed

    def reset(self) -> None:
        """Drop every unlocked entry (used by cache flushes and tests)."""
        self.evict(self.evictable_tokens)

    # ---- bookkeeping --------------------------------------------------------------------
    @property
    def total_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens

    def _account(self, node: Node, sign: int) -> None:
        if node.lock_ref == 0:
            self.evictable_tokens += sign * len(node.key)
        else:
            self.protected_tokens += sign * len(node.key)

    def _nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def all_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def pages_oldest_first(self) -> list[int]:
        """Every cached page, least recently used node first, a node's pages in sequence
        order (a match needs the pages just before its end: the earlier ones go first)."""
        nodes = sorted(self._nodes(), key=lambda n: (n.last_access, n.seq))
        return [p for n in nodes for p in n.pages]

    def check_integrity(self) -> None:
        evictable = protected = 0
        for n in self._nodes():
            if len(n.key) != len(n.pages) * self.page_size or not n.key:
                raise AssertionError("radix node key and pages disagree")
            locked_children = sum(c.lock_ref for c in n.children.values())
            if n.lock_ref < 0 or n.lock_ref < max((c.lock_ref for c in n.children.values()), default=0):
                raise AssertionError(f"radix lock refs inconsistent ({n.lock_ref} < {locked_children})")
            if n.lock_ref:
                protected += len(n.key)
            else:
                evictable += len(n.key)
            if (n.is_leaf and n.lock_ref == 0) != (n in self._evictable_leaves):
                raise AssertionError("radix evictable-leaf set out of step with the tree")
        if len(self._evictable_leaves) != sum(
            1 for n in self._nodes() if n.is_leaf and n.lock_ref == 0
        ):
            raise AssertionError("radix evictable-leaf set holds removed nodes")
        if (evictable, protected) != (self.evictable_tokens, self.protected_tokens):
            raise AssertionError(
                f"radix sizes drifted: walk {evictable}/{protected}, "
                f"kept {self.evictable_tokens}/{self.protected_tokens}"
            )
