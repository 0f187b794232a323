"""Random insert / match / lock / evict / free sequences keep the cache's books balanced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req

ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "share", "release", "evict"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=24),  # tokens from a small alphabet
        st.integers(0, 7),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]))
def test_free_plus_cached_plus_in_use_is_always_the_total(ops, page_size):
    alloc = TokenToKVPoolAllocator(64, page_size)
    cache = KVCacheManager.create(alloc, RequestSlots(4, 128), enable_radix=True)
    live: list[Req] = []
    for n, (op, tokens, pick) in enumerate(ops):
        if op == "admit" and cache.free_rows:
            r = Req(rid=str(n), input_ids=tokens + [9], sampling=SamplingParams())
            cache.match_prefix(r)
            cache.acquire_row(r)
            if cache.extend(r, r.seq_len):
                live.append(r)
            else:
                cache.release(r)
        elif op == "grow" and live:
            r = live[pick % len(live)]
            r.output_ids.append(tokens[0])
            if not cache.extend(r, r.seq_len):
                r.output_ids.pop()
        elif op == "share" and live:
            r = live[pick % len(live)]
            cache.cache_unfinished(r, cache.kv_len(r))
        elif op == "release" and live:
            cache.release(live.pop(pick % len(live)))
        elif op == "evict":
            cache.prefix.evict(pick * page_size)
        cache.check_integrity(live)
    for r in live:
        cache.release(r)
    cache.check_integrity([])
    cache.flush()
    assert alloc.available_size == alloc.size
