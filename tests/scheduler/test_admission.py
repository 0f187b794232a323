"""Admission's three limits, each at its boundary: request slots, the token budget (with
chunking) and KV capacity (with the running requests' reservation). The real
`PrefillManager`, `DecodeManager` and `KVCacheManager` on a pool with no model behind it;
every expected number is worked out by hand from the rules in prefill.py."""

from __future__ import annotations

import pytest

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeManager, NewTokenRatio
from sluice.runtime.scheduler.prefill import PrefillBudget, PrefillManager
from sluice.runtime.scheduler.request import CLIP_MAX_NEW_TOKENS, Req

_ids = iter(range(10**9))


def pool(tokens: int, rows: int = 8, page_size: int = 1, radix: bool = False) -> KVCacheManager:
    return KVCacheManager.create(
        TokenToKVPoolAllocator(tokens, page_size), RequestSlots(rows, tokens), enable_radix=radix
    )


def req(prompt: int, max_new: int) -> Req:
    n = next(_ids)
    return Req(f"r{n}", [1000 + n % 7] + [3] * (prompt - 1), SamplingParams(max_new_tokens=max_new))


def admit(cache: KVCacheManager, reqs: list[Req], tokens: int = 10_000, chunk: int = 10_000,
          running: DecodeManager | None = None):  # fmt: skip
    prefill = PrefillManager(cache, chunk)
    for r in reqs:
        prefill.add(r)
    reserved = running.reserved_tokens() if running else 0.0
    batch = prefill.schedule(PrefillBudget(tokens, reserved))
    return prefill, batch


def rids(batch) -> list[str]:
    return [r.rid for r in batch.reqs] if batch else []


# ---- KV capacity ------------------------------------------------------------------------
def test_two_prompts_that_fit_together_are_admitted_in_one_pass():
    # the case: a 100-token pool, A (40 + 10) and B (30 + 10): 90 tokens over their lives
    cache = pool(100)
    a, b = req(40, 10), req(30, 10)
    _, batch = admit(cache, [a, b])
    assert rids(batch) == [a.rid, b.rid] and batch.lens == [40, 30]


@pytest.mark.parametrize("extra,admitted", [(0, True), (1, False)])
def test_a_request_that_fits_exactly_is_admitted_and_one_token_more_is_not(extra, admitted):
    # after A (40 + 10) and B (30 + 10): 30 free, 20 of it promised to A's and B's outputs
    cache = pool(100)
    a, b, c = req(40, 10), req(30, 10), req(5, 5 + extra)
    _, batch = admit(cache, [a, b, c])
    assert (c.rid in rids(batch)) is admitted
    assert rids(batch)[:2] == [a.rid, b.rid]


def test_admission_stops_at_the_first_request_that_does_not_fit():
    cache = pool(100)
    big, small = req(80, 30), req(2, 2)
    prefill, batch = admit(cache, [req(10, 5), big, small])
    assert len(batch.reqs) == 1 and big in prefill.waiting and small in prefill.waiting
    assert cache.allocator.available_size == 90  # the refused ones hold nothing


def test_pages_round_up_the_need():
    # page size 4: 9 + 3 = 12 tokens is 3 pages, 9 + 4 = 13 is 4 pages
    cache = pool(16, page_size=4)
    fill, fits, too_big = req(2, 2), req(9, 3), req(9, 4)
    _, batch = admit(cache, [fill, fits])
    assert rids(batch) == [fill.rid, fits.rid]
    cache2 = pool(16, page_size=4)
    _, batch2 = admit(cache2, [req(2, 2), too_big])
    assert too_big.rid not in rids(batch2)


# ---- request slots ----------------------------------------------------------------------
def test_a_full_request_table_admits_no_more_and_nothing_skips_ahead():
    cache = pool(1000, rows=2)
    first, second, third, tiny = req(10, 5), req(10, 5), req(10, 5), req(1, 1)
    prefill, batch = admit(cache, [first, second, third, tiny])
    assert rids(batch) == [first.rid, second.rid]
    assert list(prefill.waiting) == [third, tiny]
    assert cache.free_rows == 0


# ---- token budget and chunking ----------------------------------------------------------
@pytest.mark.parametrize("prompt,lens,chunked", [(32, [32], False), (33, [32], True)])
def test_a_prompt_of_exactly_the_budget_is_not_chunked_and_one_token_more_is(prompt, lens, chunked):
    cache = pool(1000)
    r = req(prompt, 4)
    prefill, batch = admit(cache, [r], tokens=32)
    assert batch.lens == lens and (prefill.chunked is r) is chunked
    assert batch.complete == [not chunked]


def test_the_budget_left_after_one_prompt_chunks_the_next_on_a_page_boundary():
    cache = pool(1000, page_size=4)
    a, b, c = req(20, 4), req(20, 4), req(3, 1)
    prefill, batch = admit(cache, [a, b, c], tokens=30)
    # 30 - 20 = 10 left for b, cut to 8 so the chunk ends on a page boundary; c must wait
    assert rids(batch) == [a.rid, b.rid] and batch.lens == [20, 8]
    assert batch.complete == [True, False] and prefill.chunked is b
    assert c in prefill.waiting
    # next pass: b's remaining 12 tokens first, then c
    nxt = prefill.schedule(PrefillBudget(30, 0.0))
    assert rids(nxt) == [b.rid, c.rid] and nxt.starts == [8, 0] and nxt.lens == [12, 3]
    assert prefill.chunked is None


def test_the_chunk_size_caps_one_prompt_even_under_a_larger_budget():
    cache = pool(1000)
    r = req(50, 1)
    prefill, batch = admit(cache, [r], tokens=100, chunk=16)
    assert batch.lens == [16] and prefill.chunked is r


# ---- the running requests' reservation --------------------------------------------------
def running_set(
    cache: KVCacheManager, prompts: list[int], max_new: int, ratio: float
) -> DecodeManager:
    decode = DecodeManager(cache, NewTokenRatio(init=ratio))
    for p in prompts:
        r = req(p, max_new)
        assert cache.acquire_row(r) and cache.extend(r, p)
        decode.add([r])
    return decode


def test_running_requests_without_max_tokens_reserve_at_most_the_clip():
    # a chat request without max_tokens gets the rest of the context (19,000) as its limit;
    # once running it reserves min(19,000, 4096) x 0.7, not 19,000 x 0.7
    cache = pool(20_000)
    decode = running_set(cache, [100] * 4, max_new=19_000, ratio=0.7)
    assert decode.reserved_tokens() == pytest.approx(4 * CLIP_MAX_NEW_TOKENS * 0.7)
    fifth = req(100, 19_000)
    _, batch = admit(cache, [fifth], running=decode)
    # 19,600 free - 11,468.8 reserved leaves room for 100 + 4,096
    assert rids(batch) == [fifth.rid]


def test_running_requests_with_max_tokens_reserve_what_is_left_times_the_ratio():
    cache = pool(1000)
    decode = running_set(cache, [100, 100], max_new=200, ratio=0.5)
    assert decode.reserved_tokens() == pytest.approx(2 * 200 * 0.5)
    # 800 free - 200 reserved = 600: a request of 500 + 100 fits exactly, 500 + 101 does not
    fits, too_big = req(500, 100), req(500, 101)
    assert rids(admit(cache, [fits], running=decode)[1]) == [fits.rid]
    cache2 = pool(1000)
    decode2 = running_set(cache2, [100, 100], max_new=200, ratio=0.5)
    assert admit(cache2, [too_big], running=decode2)[1] is None
