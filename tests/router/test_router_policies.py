"""Routing policies: which worker gets a request, and why (the reason the router counts)."""

from __future__ import annotations

import pytest

from sluice.runtime.router.policies import (
    REASON_IMBALANCE,
    REASON_NO_MATCH,
    REASON_PREFIX_MATCH,
    CacheAware,
    CacheAwareConfig,
    LeastLoad,
    RoundRobin,
    make_policy,
)
from sluice.runtime.router.prefix_tree import PrefixTree
from sluice.runtime.router.workers import Worker


def workers(*loads: int) -> list[Worker]:
    return [Worker(f"http://w{i}", PrefixTree(10_000), healthy=True, in_flight=n)
            for i, n in enumerate(loads)]  # fmt: skip


def test_round_robin_takes_workers_in_turn():
    ws = workers(0, 0, 0)
    rr = RoundRobin()
    assert [rr.choose(ws, "x").worker.url for _ in range(5)] == [
        "http://w0", "http://w1", "http://w2", "http://w0", "http://w1"]  # fmt: skip


def test_least_load_takes_the_fewest_in_flight_and_rotates_among_ties():
    ll = LeastLoad()
    assert ll.choose(workers(3, 1, 2), "").worker.url == "http://w1"
    idle = workers(0, 0)
    assert [ll.choose(idle, "").worker.url for _ in range(4)] == [
        "http://w1", "http://w0", "http://w1", "http://w0"]  # fmt: skip


def test_cache_aware_sends_a_known_prefix_back_to_its_worker():
    ws = workers(0, 0)
    ca = CacheAware(CacheAwareConfig(cache_threshold=0.5))
    first = ca.choose(ws, "You are a helpful assistant. Question one?")
    assert first.reason == REASON_NO_MATCH
    again = ca.choose(ws, "You are a helpful assistant. Question two?")
    assert again.reason == REASON_PREFIX_MATCH and again.worker is first.worker
    assert again.match_len == len("You are a helpful assistant. Question ")


def test_cache_aware_below_the_threshold_goes_to_the_least_loaded():
    ws = workers(0, 0)
    ca = CacheAware(CacheAwareConfig(cache_threshold=0.5))
    ca.choose(ws, "abcdefghij")  # into one worker's tree
    holder = next(w for w in ws if w.tree.size)
    other = next(w for w in ws if w is not holder)
    holder.in_flight, other.in_flight = 1, 0
    d = ca.choose(ws, "abcd" + "z" * 10)  # 4/14 matched < 0.5
    assert d.reason == REASON_NO_MATCH and d.worker is other


def test_new_prefixes_spread_over_idle_workers_by_tree_size():
    ws = workers(0, 0)
    ca = CacheAware(CacheAwareConfig())
    chosen = [ca.choose(ws, f"{c}" * 20).worker for c in "abcd"]
    assert {w.url for w in chosen} == {"http://w0", "http://w1"}
    assert ws[0].tree.size == ws[1].tree.size == 40


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ((100, 10), True),  # 90 > 64 and 100 > 15
        ((70, 10), False),  # 60 <= 64: absolute threshold not passed
        ((200, 150), False),  # 50 <= 64
        ((300, 220), False),  # 80 > 64 but 300 <= 220 * 1.5: relative threshold not passed
        ((400, 200), True),  # 200 > 64 and 400 > 300
    ],
)
def test_the_balance_guard_needs_both_thresholds(loads, imbalanced):
    ws = workers(*loads)
    ca = CacheAware(CacheAwareConfig(0.3, 64, 1.5))
    ws[0].tree.insert("shared prefix " * 10)
    d = ca.choose(ws, "shared prefix " * 10 + "tail")
    if imbalanced:
        assert d.reason == REASON_IMBALANCE and d.worker is ws[1]
    else:
        assert d.reason == REASON_PREFIX_MATCH and d.worker is ws[0]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("sticky", CacheAwareConfig())
