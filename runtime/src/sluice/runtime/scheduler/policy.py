"""The order in which waiting requests are offered for admission.

- `fcfs`: arrival order.
- `lof`: longest output (max_new_tokens) first.
- `random`: a seeded shuffle.
- `lpm`: longest cached prefix first, with in-batch prefix de-duplication: a request whose
  cached prefix is short but which shares a long prefix with a request ahead of it in this
  same pass is moved back, so that the first one computes the shared prefix and the
  others reuse it from the cache on a later tick.
- `dfs-weight`: depth-first over the radix tree, heavier subtrees (more waiting requests)
  first, so requests sharing prefixes are admitted together.
- `priority`: the request's `priority` (lower first, vLLM's convention), then arrival;
  a waiting request may also preempt running ones of lower priority (see scheduler.py).

Whatever the policy (but `priority`, where priority comes before everything), two groups go
first, in queue order: retracted requests (they were
running; the queue's head is theirs), then requests that have waited `starvation_passes`
prefill passes or more (a reordering policy must not starve a request forever, e.g. one
that matches nothing under `lpm`). The policy orders the rest.

Cache-aware policies read the cache without changing it (no node splits, no LRU refresh)
and fall back to fcfs when the queue is long: matching every waiting request each tick
would cost more than it saves.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.runtime.memory.radix_cache import Node, RadixCache
from sluice.runtime.scheduler.request import Req, cache_key

if TYPE_CHECKING:
    from sluice.runtime.scheduler.cache import KVCacheManager

CACHE_AWARE = ("lpm", "dfs-weight")


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "fcfs"
    in_batch_check_threshold: int = 32
    in_batch_deprioritize_threshold: int = 32
    cache_aware_max_queue: int = 128
    starvation_passes: int = 64
    seed: int = 0


def order_waiting(
    queue: list[Req], config: PolicyConfig, cache: KVCacheManager | None, tick: int
) -> list[Req]:
    """`queue` (in arrival order, retracted requests at its head) in admission order."""
    if config.name == "priority":  # stable: retracted first and arrival order within a level
        return sorted(queue, key=lambda r: (r.sampling.priority, not r.retractions))
    first = [r for r in queue if r.retractions or tick - r.enqueued_tick >= config.starvation_passes]
    if first:
        chosen = {id(r) for r in first}
        rest = [r for r in queue if id(r) not in chosen]
        return first + _by_policy(rest, config, cache, tick)
    return _by_policy(queue, config, cache, tick)


def _by_policy(
    queue: list[Req], config: PolicyConfig, cache: KVCacheManager | None, tick: int
) -> list[Req]:
    name = config.name
    radix = cache.prefix if cache is not None else None
    if name in CACHE_AWARE and (
        not isinstance(radix, RadixCache) or len(queue) > config.cache_aware_max_queue
    ):
        name = "fcfs"
    if name == "fcfs":
        return list(queue)
    if name == "lof":
        return sorted(queue, key=lambda r: -r.remaining_new_tokens)
    if name == "random":
        shuffled = list(queue)
        random.Random(config.seed * 1_000_003 + tick).shuffle(shuffled)
        return shuffled
    assert cache is not None and isinstance(radix, RadixCache)
    if name == "lpm":
        return _longest_prefix_first(queue, config, cache)
    if name == "dfs-weight":
        return _dfs_weight(queue, radix)
    raise ValueError(f"unknown schedule policy {config.name!r}")


def _longest_prefix_first(queue: list[Req], config: PolicyConfig, cache: KVCacheManager) -> list[Req]:
    matched = {id(r): cache.peek(r) for r in queue}
    # in-batch de-duplication: a scratch tree of the prompts seen so far in this pass
    scratch = RadixCache(1, lambda pages: None)
    deprioritized: set[int] = set()
    for r in queue:
        if matched[id(r)] >= config.in_batch_check_threshold:
            continue
        ids = cache_key(r, r.seq_len)  # the adapter is part of the key
        if scratch.prefix_len(ids) >= config.in_batch_deprioritize_threshold:
            deprioritized.add(id(r))
        else:
            scratch.insert(ids, list(range(len(ids))))
    # stable sort: ties keep arrival order
    return sorted(queue, key=lambda r: (id(r) in deprioritized, -matched[id(r)]))


def _deepest_node(radix: RadixCache, tokens: list[int]) -> Node:
    """The deepest node wholly matched by `tokens`, without changing the tree."""
    node, pos, ps = radix.root, 0, radix.page_size
    while True:
        child = node.children.get(tuple(tokens[pos : pos + ps]))
        if child is None or tokens[pos : pos + len(child.key)] != child.key:
            return node
        node, pos = child, pos + len(child.key)


def _dfs_weight(queue: list[Req], radix: RadixCache) -> list[Req]:
    by_node: dict[int, list[Req]] = defaultdict(list)
    nodes: dict[int, Node] = {}
    for r in queue:
        node = _deepest_node(radix, cache_key(r, r.seq_len - 1))
        by_node[id(node)].append(r)
        nodes[id(node)] = node
    weight: dict[int, int] = defaultdict(int)
    for nid, reqs in by_node.items():
        walk: Node | None = nodes[nid]
        while walk is not None:
            weight[id(walk)] += len(reqs)
            walk = walk.parent
    out: list[Req] = []

    def visit(node: Node) -> None:
        out.extend(by_node.get(id(node), []))
        children = [c for c in node.children.values() if weight.get(id(c), 0)]
        for child in sorted(children, key=lambda c: -weight[id(c)]):
            visit(child)

    visit(radix.root)
    return out
