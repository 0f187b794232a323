"""Routing policies: which healthy worker gets a request.

`choose(workers, key)` is given the healthy candidates (never empty) in pool order and the
request's routing key (see `keys.py`), and returns a `Decision` with the reason, which the
router counts in `sluice_router_routing_decisions_total{reason}`.

cache-aware (SGLang's router's algorithm, over one approximate tree per worker):
1. If the load is imbalanced, i.e. `max - min > balance_abs_threshold` and
   `max > min * balance_rel_threshold` (in-flight requests), go to the least-loaded worker
   whatever the prefixes say (reason `imbalance`).
2. Else find the worker whose tree holds the longest prefix of the key; if that prefix is
   more than `cache_threshold` of the key, go there (`prefix_match`).
3. Else go to the least-loaded worker (`no_match`), ties broken by the smallest tree (the
   most room for new prefixes), then in turn.
The key is then inserted into the chosen worker's tree.

Adapter affinity (any policy; `choose_for_adapters`): a request that needs LoRA adapters
goes, among the workers that list them all in their /v1/models, where the policy chooses
(reason `adapter_affinity`); when none lists them, to the least-loaded worker (reason
`adapter_fallback`), which serves it if it has the adapter by then or answers its own 404.

Response affinity (any policy; `pinned`): a request that names a stored response (see
`responses.py`) goes to the worker holding it while that worker is a candidate (reason
`response_affinity`), before adapter affinity or the policy: the response is nowhere else.

Ties between equally loaded workers are broken in turn (a rotating start), so that
sequential requests spread over idle workers instead of all landing on the first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.runtime.router.prefix_tree import Key
from sluice.runtime.router.workers import Worker

REASON_ROUND_ROBIN = "round_robin"
REASON_RANDOM = "random"
REASON_LEAST_LOAD = "least_load"
REASON_PREFIX_MATCH = "prefix_match"
REASON_NO_MATCH = "no_match"
REASON_IMBALANCE = "imbalance"
REASON_ADAPTER_AFFINITY = "adapter_affinity"
REASON_ADAPTER_FALLBACK = "adapter_fallback"
REASON_RESPONSE_AFFINITY = "response_affinity"
REASONS = (
    REASON_ROUND_ROBIN, REASON_RANDOM, REASON_LEAST_LOAD, REASON_PREFIX_MATCH,
    REASON_NO_MATCH, REASON_IMBALANCE, REASON_ADAPTER_AFFINITY, REASON_ADAPTER_FALLBACK,
    REASON_RESPONSE_AFFINITY,
)  # fmt: skip


@dataclass(frozen=True)
class Decision:
    worker: Worker
    reason: str
    match_len: int | None = None  # cache-aware: prefix of the key the worker's tree held


class Policy(Protocol):
    name: str

    def choose(self, workers: Sequence[Worker], key: Key) -> Decision: ...


class _InTurn:
    """Picks among tied candidates in turn."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, tied: Sequence[Worker]) -> Worker:
        worker = tied[self._turn % len(tied)]
        self._turn += 1
        return worker


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, workers: Sequence[Worker], key: Key) -> Decision:
        worker = workers[self._next % len(workers)]
        self._next += 1
        return Decision(worker, REASON_ROUND_ROBIN)


class Random:
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, workers: Sequence[Worker], key: Key) -> Decision:
        return Decision(self._rng.choice(list(workers)), REASON_RANDOM)


def least_loaded(workers: Sequence[Worker]) -> list[Worker]:
    fewest = min(w.in_flight for w in workers)
    return [w for w in workers if w.in_flight == fewest]


class LeastLoad:
    name = "least-load"

    def __init__(self) -> None:
        self._turn = _InTurn()

    def choose(self, workers: Sequence[Worker], key: Key) -> Decision:
        return Decision(self._turn.pick(least_loaded(workers)), REASON_LEAST_LOAD)


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5


class CacheAware:
    name = "cache-aware"

    def __init__(self, config: CacheAwareConfig) -> None:
        self.config = config
        self._turn = _InTurn()

    def imbalanced(self, workers: Sequence[Worker]) -> bool:
        loads = [w.in_flight for w in workers]
        high, low = max(loads), min(loads)
        return (
            high - low > self.config.balance_abs_threshold
            and high > low * self.config.balance_rel_threshold
        )

    def choose(self, workers: Sequence[Worker], key: Key) -> Decision:
        if self.imbalanced(workers):
            worker = self._least_loaded(workers)
            decision = Decision(worker, REASON_IMBALANCE, worker.tree.match(key))
        else:
            matches = [(w.tree.match(key), w) for w in workers]
            best_len = max(m for m, _ in matches)
            if key and best_len / len(key) > self.config.cache_threshold:
                best = [w for m, w in matches if m == best_len]
                worker = best[0] if len(best) == 1 else self._least_loaded(best)
                decision = Decision(worker, REASON_PREFIX_MATCH, best_len)
            else:
                worker = self._least_loaded(workers)
                held = next(m for m, w in matches if w is worker)
                decision = Decision(worker, REASON_NO_MATCH, held)
        if key:
            decision.worker.tree.insert(key)
        return decision

    def _least_loaded(self, workers: Sequence[Worker]) -> Worker:
        tied = least_loaded(workers)
        smallest = min(w.tree.size for w in tied)
        return self._turn.pick([w for w in tied if w.tree.size == smallest])


def choose_for_adapters(
    policy: Policy,
    fallback: LeastLoad,
    workers: Sequence[Worker],
    key: Key,
    adapters: frozenset[str],
) -> Decision:
    """`policy`'s choice among the workers holding every adapter in `adapters` (all of
    `workers` when it is empty), else `fallback`'s among all."""
    if not adapters:
        return policy.choose(workers, key)
    holders = [w for w in workers if adapters <= w.adapters]
    if holders:
        chosen = policy.choose(holders, key)
        return Decision(chosen.worker, REASON_ADAPTER_AFFINITY, chosen.match_len)
    return Decision(fallback.choose(workers, key).worker, REASON_ADAPTER_FALLBACK)


def pinned(workers: Sequence[Worker], url: str | None) -> Decision | None:
    """The worker at `url` if it is among `workers` (response affinity), else None."""
    if url is None:
        return None
    worker = next((w for w in workers if w.url == url), None)
    return None if worker is None else Decision(worker, REASON_RESPONSE_AFFINITY)


def make_policy(name: str, config: CacheAwareConfig) -> Policy:
    if name == CacheAware.name:
        return CacheAware(config)
    if name == RoundRobin.name:
        return RoundRobin()
    if name == LeastLoad.name:
        return LeastLoad()
    if name == Random.name:
        return Random()
    raise ValueError(f"unknown routing policy {name!r}")
