"""The sliding layers' window pool: what it frees, what a cached prefix may still be used for,
and that random admit / grow / share / release / evict sequences keep both pools' books
balanced while every live request's window stays attached."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.memory.window_pages import WindowPages, window_pool_floor
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req


def test_attach_detach_and_slots() -> None:
    w = WindowPages(num_full_pages=8, window_tokens=8, page_size=2, window=3)
    assert w.attach([5, 6])
    assert not w.attach([1, 2, 3])  # 4 window pages, 2 left: all or none
    assert w.num_free_pages == 2 and not w.has(1)
    slots = w.slots([5, 6], 0, 4)
    assert slots[1] == slots[0] + 1 and slots[3] == slots[2] + 1 and slots[0] // 2 != slots[2] // 2
    assert w.detach([5, 1]) == 1
    assert w.slots([5, 6], 0, 4)[:2] == [0, 1]  # a detached page reads the reserved page
    w.check_integrity([6])
    with pytest.raises(AssertionError, match="free full pages"):
        w.check_integrity([5])


def test_a_cached_prefix_is_usable_only_up_to_an_attached_window() -> None:
    w = WindowPages(num_full_pages=16, window_tokens=64, page_size=2, window=5)
    pages = list(range(1, 9))  # 8 pages: positions 0..15
    assert w.attach(pages)
    assert w.usable_prefix(pages) == 16
    w.detach([pages[5]])  # positions 10, 11
    # a continuation at 16 reads 12..15 (window 5: 12..16): fine
    assert w.usable_prefix(pages) == 16
    w.detach([pages[6]])  # positions 12, 13: now a continuation at 16 lacks them; at 10 it
    # reads 6..9, which are attached
    assert w.usable_prefix(pages) == 10
    w.detach([pages[0]])  # position 0 gone: a continuation at 10 still has 6..9
    assert w.usable_prefix(pages) == 10
    w.detach(pages[:5])
    assert w.usable_prefix(pages) == 0


def test_the_floor_holds_every_running_window_and_one_prefill_batch() -> None:
    # 4 requests x (ceil(11 / 4) + 2 pages) + 32 / 4 pages, of 4 tokens
    assert window_pool_floor(4, 12, 4, 32) == (4 * 5 + 8) * 4


ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "share", "release", "evict"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=24),
        st.integers(0, 7),
    ),
    max_size=80,
)


def assert_windows_attached(cache: KVCacheManager, live: list[Req]) -> None:
    """Every position a live request's next query may read has its window page."""
    w = cache.window
    assert w is not None
    for r in live:
        h = cache.holding(r)
        for pos in range(w.first_visible(h.kv_len), h.kv_len):
            assert w.has(h.pages[pos // cache.page_size]), (r.rid, pos)


def extend(cache: KVCacheManager, r: Req) -> bool:
    """`cache.extend` to the whole sequence; when it fails, the full pool was short (after
    evicting what it could), never the window pool (sized at its floor)."""
    need = cache.pages_needed(r, r.seq_len)
    if cache.extend(r, r.seq_len):
        return True
    assert cache.allocator.num_free_pages < need
    return False


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]), window=st.sampled_from([1, 3, 8]))
def test_both_pools_balance_and_live_windows_stay_attached(ops, page_size, window):
    rows, prefill = 4, 32
    alloc = TokenToKVPoolAllocator(256, page_size)
    floor = window_pool_floor(rows, window, page_size, prefill)
    pages = WindowPages(alloc.num_pages, min(floor, alloc.size), page_size, window)
    cache = KVCacheManager.create(alloc, RequestSlots(rows, 128), enable_radix=True, window=pages)
    live: list[Req] = []
    for n, (op, tokens, pick) in enumerate(ops):
        cache.slide_windows()  # each op is a tick of its own
        if op == "admit" and cache.free_rows:
            r = Req(rid=str(n), input_ids=tokens + [9], sampling=SamplingParams())
            cache.match_prefix(r)
            cache.acquire_row(r)
            if extend(cache, r):
                live.append(r)
            else:
                cache.release(r)
        elif op == "grow" and live:
            r = live[pick % len(live)]
            r.output_ids.append(tokens[0])
            # the full pool may be short; the window pool never is when the full one is not
            if not extend(cache, r):
                r.output_ids.pop()
        elif op == "share" and live:
            r = live[pick % len(live)]
            cache.cache_unfinished(r, cache.kv_len(r))
        elif op == "release" and live:
            cache.release(live.pop(pick % len(live)))
        elif op == "evict":
            cache.prefix.evict(pick * page_size)
        cache.check_integrity(live)
        assert_windows_attached(cache, live)
        assert cache.live_window_count() == len(cache.live_window_pages())
    for r in live:
        cache.release(r)
    cache.check_integrity([])
    cache.flush()
    assert alloc.available_size == alloc.size
    assert pages.num_free_pages == pages.allocator.num_pages


def test_a_short_window_pool_takes_cached_windows_no_live_request_reads() -> None:
    """Cached sequences keep their windows until the window pool is short; then cached pages
    outside every live window give theirs back (least recently used first) while their full
    pages stay cached, and what a match of them can still use shrinks accordingly."""
    window, ps = 4, 2
    alloc = TokenToKVPoolAllocator(200, ps)
    pages = WindowPages(alloc.num_pages, 24, ps, window)  # 12 window pages
    cache = KVCacheManager.create(alloc, RequestSlots(4, 64), enable_radix=True, window=pages)

    def run(rid: str, ids: list[int]) -> Req:
        r = Req(rid=rid, input_ids=ids, sampling=SamplingParams())
        cache.match_prefix(r)
        assert cache.acquire_row(r) and cache.extend(r, r.seq_len)
        cache.cache_unfinished(r, r.seq_len)  # its prompt's full pages become the cache's
        cache.slide_windows()  # the next tick
        return r

    def usable(ids: list[int]) -> int:
        return cache.peek(Req(rid="probe", input_ids=ids + [1], sampling=SamplingParams()))

    live = run("live", list(range(100, 110)))  # 5 pages, cached and attached
    for i in range(2):
        cache.release(run(f"done{i}", [i] * 8))  # 4 pages each, cached and attached
    assert pages.num_free_pages == 0 and usable([0] * 8) == usable([1] * 8) == 8
    full_cached = len(cache.prefix.all_pages())
    newcomer = run("new", [7] * 8)  # 4 more window pages: they come from the cache
    assert len(cache.prefix.all_pages()) == full_cached + 4  # no full page was evicted
    assert_windows_attached(cache, [live, newcomer])
    # the oldest: live's prompt, before its window (pages 0-2: positions 0-5, its next query
    # at 10 reads 7-10), then done0's first page
    assert [pages.has(p) for p in cache.holding(live).pages] == [False] * 3 + [True] * 2
    assert usable(list(range(100, 110))) == 10
    assert usable([0] * 8) == 8 and usable([0] * 2) == 0  # a match ending at 2 reads 0-1
    cache.check_integrity([live, newcomer])


def test_a_window_pool_at_its_floor_serves_request_after_request() -> None:
    """Thirty distinct 20-token requests, four at a time, through a window pool sized at
    its floor: every extend succeeds, cached windows are taken back as the pool fills (the
    full pages stay cached while the full pool has room), and the books balance."""
    import random

    window, rows = 8, 4
    alloc = TokenToKVPoolAllocator(1024, 1)
    pages = WindowPages(alloc.num_pages, window_pool_floor(rows, window, 1, 32), 1, window)
    cache = KVCacheManager.create(alloc, RequestSlots(rows, 128), enable_radix=True, window=pages)
    rng = random.Random(0)
    live: list[Req] = []
    released: list[list[int]] = []
    for i in range(30):
        cache.slide_windows()
        if len(live) == rows:
            done = live.pop(0)
            cache.release(done)
            released.append(done.input_ids)
        r = Req(rid=str(i), input_ids=[rng.randrange(100) for _ in range(20)],
                sampling=SamplingParams())  # fmt: skip
        cache.match_prefix(r)
        assert cache.acquire_row(r) and cache.extend(r, r.seq_len)
        live.append(r)
        assert_windows_attached(cache, live)
        cache.check_integrity(live)
    cached = cache.prefix.all_pages()
    # every released request's tokens (a prefix two share is cached once): none evicted
    assert len(cached) == len({tuple(ids[:k]) for ids in released for k in range(1, 21)})
    assert sum(pages.has(p) for p in cached) < len(cached)  # their windows were taken back
