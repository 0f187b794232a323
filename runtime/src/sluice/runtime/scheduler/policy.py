"""The order in which waiting requests are offered to the `PrefillAdder`.

- `fcfs`: arrival order (retracted requests were put back at the head).
- `lof`: longest output (max_new_tokens) first.
- `random`: a seeded shuffle.
- `lpm`: longest cached prefix first, with in-batch prefix de-duplication: a request whose
  cached prefix is short but which shares a long prefix with a request ahead of it in this
  same pass is moved back, so that the first one computes the shared prefix and the
  others reuse it from the cache on a later tick.
- `dfs-weight`: depth-first over the radix tree, heavier subtrees (more waiting requests)
  first, so requests sharing prefixes are admitted together.

Cache-aware policies fall back to fcfs when the queue is long: matching every waiting
request against the tree each tick would cost more than it saves.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from sluice.runtime.memory.radix_cache import Node, RadixCache
from sluice.runtime.scheduler.request import Req

CACHE_AWARE = ("lpm", "dfs-weight")


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "fcfs"
    in_batch_check_threshold: int = 32
    in_batch_deprioritize_threshold: int = 32
    cache_aware_max_queue: int = 128
    seed: int = 0


def order_waiting(queue: list[Req], config: PolicyConfig, radix: RadixCache | None, tick: int) -> list[Req]:
    name = config.name
    if name in CACHE_AWARE and (radix is None or len(queue) > config.cache_aware_max_queue):
        name = "fcfs"
    if name == "fcfs":
        return list(queue)
    if name == "lof":
        return sorted(queue, key=lambda r: -r.remaining_new_tokens)
    if name == "random":
        shuffled = list(queue)
        random.Random(config.seed * 1_000_003 + tick).shuffle(shuffled)
        return shuffled
    assert radix is not None
    if name == "lpm":
        return _longest_prefix_first(queue, config, radix)
    if name == "dfs-weight":
        return _dfs_weight(queue, radix)
    raise ValueError(f"unknown schedule policy {config.name!r}")


def _match_len(radix: RadixCache, req: Req) -> int:
    ids = req.fill_ids
    return radix.match_prefix(ids[: len(ids) - 1]).num_tokens


def _longest_prefix_first(queue: list[Req], config: PolicyConfig, radix: RadixCache) -> list[Req]:
    matched = {id(r): _match_len(radix, r) for r in queue}
    # in-batch de-duplication: a scratch tree of the prompts seen so far in this pass
    scratch = RadixCache(1, lambda pages: None)
    deprioritized: set[int] = set()
    for r in queue:
        if matched[id(r)] >= config.in_batch_check_threshold:
            continue
        ids = r.fill_ids
        shared = scratch.match_prefix(ids).num_tokens
        if shared >= config.in_batch_deprioritize_threshold:
            deprioritized.add(id(r))
        else:
            scratch.insert(ids, list(range(len(ids))))
    # stable sort: ties keep arrival order
    return sorted(queue, key=lambda r: (id(r) in deprioritized, -matched[id(r)]))


def _dfs_weight(queue: list[Req], radix: RadixCache) -> list[Req]:
    by_node: dict[int, list[Req]] = defaultdict(list)
    nodes: dict[int, Node] = {}
    for r in queue:
        ids = r.fill_ids
        node = radix.match_prefix(ids[: len(ids) - 1]).node
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
