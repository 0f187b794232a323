"""An approximate radix tree of what one worker has probably cached.

The router inserts every request's routing key into the tree of the worker it sent it to,
and asks each worker's tree how long a prefix of a new key it holds. "Approximate": the
tree is what the router sent, not what the worker kept (its radix cache may have evicted
it, or it may have restarted), so it only ever guides the choice.

Keys are sequences: `str` (characters) for text prompts and chat messages, `tuple[int]`
for prompts given as token ids. Over characters rather than tokens, like SGLang's router:
the router then needs neither the model's tokenizer nor its chat template (a router pod
carries no model files), costs no tokenization per request, and a shared character prefix
of a prompt is a shared token prefix once tokenized, up to the last token at the boundary.

Bounded: the characters the tree holds are capped; past the cap the least recently used
leaves are evicted (a node's time is the last match or insert that walked through it) down
to 90% of the cap, so the walk that finds the leaves is paid once per tenth of the cap.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

Key = Sequence[Hashable]  # str or tuple[int, ...]
LOW_WATER = 0.9  # eviction stops at this share of the cap


@dataclass(eq=False)
class _Node:
    edge: Key  # the symbols on the edge from the parent to this node
    parent: _Node | None
    children: dict[Hashable, _Node] = field(default_factory=dict)
    last_used: int = 0


def _common_len(a: Key, b: Key) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixTree:
    def __init__(self, max_size: int) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        self.max_size = max_size
        self.size = 0  # symbols on all edges
        self._root = _Node(edge=(), parent=None)
        self._clock = itertools.count(1)

    def match(self, key: Key) -> int:
        """Length of the longest prefix of `key` in the tree; marks the path as used."""
        now = next(self._clock)
        node, matched = self._root, 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            common = _common_len(child.edge, key[matched:])
            child.last_used = now
            matched += common
            if common < len(child.edge):
                break
            node = child
        return matched

    def insert(self, key: Key) -> None:
        """Add `key` (shares what is already there), then evict past the size bound."""
        now = next(self._clock)
        node, pos = self._root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = _Node(edge=key[pos:], parent=node, last_used=now)
                node.children[key[pos]] = leaf
                self.size += len(leaf.edge)
                break
            common = _common_len(child.edge, key[pos:])
            if common < len(child.edge):
                child = self._split(child, common)
            child.last_used = now
            node, pos = child, pos + common
        if self.size > self.max_size:
            self.evict(self.size - int(self.max_size * LOW_WATER))

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` symbols; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(edge=child.edge[:at], parent=parent, last_used=child.last_used)
        parent.children[upper.edge[0]] = upper
        child.edge = child.edge[at:]
        child.parent = upper
        upper.children[child.edge[0]] = child
        return upper

    def evict(self, amount: int) -> None:
        """Remove least recently used leaves until `amount` symbols are gone (or all)."""
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(leaves)
        freed = 0
        while leaves and freed < amount:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.edge[0]]
            freed += len(leaf.edge)
            self.size -= len(leaf.edge)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))

    def clear(self) -> None:
        self._root.children.clear()
        self.size = 0

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        """`size` is the symbols on all edges; every child is keyed by its edge's first one."""
        total = 0
        for node in self._nodes():
            assert node.edge, "empty edge"
            assert node.parent is not None and node.parent.children[node.edge[0]] is node
            total += len(node.edge)
        assert total == self.size, (total, self.size)
