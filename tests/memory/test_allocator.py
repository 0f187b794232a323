import pytest

from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots


def test_pages_are_handed_out_until_the_pool_is_empty():
    alloc = TokenToKVPoolAllocator(max_total_tokens=64, page_size=16)
    assert alloc.num_pages == 4 and alloc.available_size == 64
    pages = alloc.alloc_pages(3)
    assert pages is not None and len(set(pages)) == 3 and 0 not in pages
    assert alloc.alloc_pages(2) is None  # all-or-nothing
    assert alloc.available_size == 16
    alloc.free(pages)
    assert alloc.available_size == 64


def test_double_free_raises():
    alloc = TokenToKVPoolAllocator(max_total_tokens=8, page_size=2)
    pages = alloc.alloc_pages(2)
    alloc.free(pages)
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.free(pages[:1])


def test_slots_follow_pages_and_skip_the_reserved_page():
    alloc = TokenToKVPoolAllocator(max_total_tokens=64, page_size=4)
    assert alloc.num_slots == 68  # reserved page 0 + 16 pages
    slots = alloc.slots([3, 1], 2, 7)
    assert slots == [14, 15, 4, 5, 6]


def test_request_slots_are_reused_and_double_free_raises():
    pool = RequestSlots(size=2, max_context_len=8)
    a, b = pool.alloc(), pool.alloc()
    assert {a, b} == {0, 1} and pool.alloc() is None
    pool.free(a)
    with pytest.raises(RuntimeError):
        pool.free(a)
    assert pool.alloc() == a
