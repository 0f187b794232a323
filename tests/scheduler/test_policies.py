"""The order in which each policy offers waiting requests."""

from __future__ import annotations

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.radix_cache import RadixCache
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.policy import PolicyConfig, order_waiting
from sluice.runtime.scheduler.request import Req


def req(rid: str, ids: list[int], max_new: int = 16) -> Req:
    return Req(rid=rid, input_ids=ids, sampling=SamplingParams(max_new_tokens=max_new))


def cache_with(*prompts: list[int]) -> KVCacheManager:
    radix = RadixCache(1, lambda pages: None)
    next_page = 1
    for p in prompts:
        radix.insert(p, list(range(next_page, next_page + len(p))))
        next_page += len(p)
    return KVCacheManager(TokenToKVPoolAllocator(1024, 1), RequestSlots(4, 256), radix)


def rids(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


def test_fcfs_keeps_arrival_order():
    q = [req("a", [1]), req("b", [2]), req("c", [3])]
    assert rids(order_waiting(q, PolicyConfig("fcfs"), None, 0)) == ["a", "b", "c"]


def test_lof_puts_the_longest_output_first():
    q = [req("a", [1], 8), req("b", [2], 64), req("c", [3], 16)]
    assert rids(order_waiting(q, PolicyConfig("lof"), None, 0)) == ["b", "c", "a"]


def test_random_is_a_seeded_permutation():
    q = [req(str(i), [i]) for i in range(10)]
    one = rids(order_waiting(q, PolicyConfig("random", seed=3), None, 5))
    two = rids(order_waiting(q, PolicyConfig("random", seed=3), None, 5))
    assert one == two and sorted(one) == sorted(rids(q))


def test_lpm_prefers_the_longest_cached_prefix():
    cached = list(range(100, 150))
    cache = cache_with(cached)
    q = [req("none", [7] * 60), req("half", cached[:25] + [1] * 30), req("full", cached + [2])]
    assert rids(order_waiting(q, PolicyConfig("lpm"), cache, 0)) == ["full", "half", "none"]


def test_lpm_moves_back_a_request_sharing_a_long_prefix_with_an_earlier_one():
    shared = list(range(200, 240))  # 40 tokens, not cached yet
    q = [req("first", shared + [1]), req("twin", shared + [2]), req("other", [9] * 41)]
    order = rids(order_waiting(q, PolicyConfig("lpm"), cache_with(), 0))
    assert order == ["first", "other", "twin"]


def test_lpm_ignores_short_in_batch_overlaps():
    q = [req("first", [5] * 10 + [1] * 30), req("twin", [5] * 10 + [2] * 30)]
    assert rids(order_waiting(q, PolicyConfig("lpm"), cache_with(), 0)) == ["first", "twin"]


def test_dfs_weight_admits_the_heaviest_subtree_first():
    a, b = list(range(100, 120)), list(range(300, 320))
    cache = cache_with(a, b)
    q = [req("b1", b + [1]), req("a1", a + [1]), req("a2", a + [2]), req("a3", a + [3])]
    order = rids(order_waiting(q, PolicyConfig("dfs-weight"), cache, 0))
    assert order[:3] == ["a1", "a2", "a3"] and order[3] == "b1"


def test_cache_aware_policies_fall_back_to_fcfs_on_a_long_queue():
    cache = cache_with(list(range(100, 150)))
    q = [req(str(i), [7] * 5) for i in range(129)] + [req("hit", list(range(100, 150)) + [1])]
    assert rids(order_waiting(q, PolicyConfig("lpm"), cache, 0)) == rids(q)


def test_cache_aware_ordering_changes_nothing_in_the_cache():
    cached = list(range(100, 150))
    cache = cache_with(cached)
    radix = cache.prefix
    before = [(n.last_access, len(n.key)) for n in radix._nodes()]
    q = [req("half", cached[:25] + [1] * 30), req("full", cached + [2])]
    for policy in ("lpm", "dfs-weight"):
        order_waiting(q, PolicyConfig(policy), cache, 0)
    assert [(n.last_access, len(n.key)) for n in radix._nodes()] == before  # no split, no LRU touch


def test_retracted_requests_stay_at_the_head_under_every_policy():
    cache = cache_with(list(range(100, 150)))
    back = req("retracted", [9] * 40, max_new=1)
    back.retractions = 1
    q = [
        back,
        req("hit", list(range(100, 150)) + [1], max_new=64),
        req("other", [3] * 8, max_new=32),
    ]
    for policy in ("fcfs", "lof", "random", "lpm", "dfs-weight"):
        assert rids(order_waiting(q, PolicyConfig(policy), cache, 0))[0] == "retracted", policy


def test_lpm_cannot_starve_a_request_that_matches_nothing():
    cached = list(range(100, 150))
    cache = cache_with(cached)
    loner = req("loner", [7] * 60)
    loner.enqueued_tick = 0
    hits = [req(f"hit{i}", cached + [i]) for i in range(3)]
    config = PolicyConfig("lpm", starvation_passes=10)
    assert rids(order_waiting([loner, *hits], config, cache, 9))[-1] == "loner"
    assert rids(order_waiting([loner, *hits], config, cache, 10))[0] == "loner"
