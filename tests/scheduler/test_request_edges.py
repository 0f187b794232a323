"""Edges of a request's life that used to go wrong: a request the pool cannot hold alone,
stop strings and special tokens, and where an unseeded request's randomness comes from."""

from __future__ import annotations

import random

from tiny_model import IM_END, make_tokenizer

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeManager, DecodeRows, NewTokenRatio
from sluice.runtime.scheduler.request import Req
from sluice.runtime.scheduler.stop_strings import StopStringMatcher


def test_a_lone_request_that_cannot_get_its_next_slot_is_given_up_not_raised():
    cache = KVCacheManager.create(TokenToKVPoolAllocator(8, 1), RequestSlots(2, 8), False)
    lone = Req("lone", [1, 2, 3, 4], SamplingParams(max_new_tokens=10))
    assert cache.acquire_row(lone) and cache.extend(lone, 4)
    squatter = cache.allocator.alloc_pages(4)  # the rest of the pool, held elsewhere
    assert squatter is not None
    decode = DecodeManager(cache, NewTokenRatio())
    decode.add([lone])
    rows = decode.schedule(lambda r: 0, allow_retract=True)
    assert isinstance(rows, DecodeRows)
    assert rows.reqs == [] and rows.given_up == [lone] and lone not in decode
    cache.release(lone)
    cache.allocator.free(squatter)
    cache.check_integrity([])


def _output_with_im_end(tokenizer) -> list[int]:
    return tokenizer.encode("Paris", add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids(IM_END)
    ]


def test_stop_strings_are_matched_in_the_text_the_request_asked_for():
    tokenizer = make_tokenizer()

    def decode_text(ids: list[int], skip_special_tokens: bool) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    matcher = StopStringMatcher(decode_text)
    for skip, stops in ((False, True), (True, False)):
        r = Req("r", [1], SamplingParams(stop=[IM_END], skip_special_tokens=skip))
        r.output_ids = _output_with_im_end(tokenizer)
        matcher.check(r)
        # with special tokens kept in the text, "<|im_end|>" is a stop string it can meet
        assert (r.finish_reason is not None) is stops


def test_unseeded_requests_draw_fresh_randomness_unless_a_seed_is_given(make_harness):
    assert isinstance(make_harness().scheduler.intake._rng, random.SystemRandom)
    fixed = [make_harness(random_seed=5).scheduler.intake._rng.getrandbits(63) for _ in range(2)]
    assert fixed[0] == fixed[1]  # --random-seed 5: restarts repeat


def test_a_request_past_the_context_is_capped_on_its_own_copy_of_the_parameters(make_harness):
    """The scheduler caps max_new_tokens to the room left in the context; the message it was
    handed (which tensor-parallel ranks replay, and the sender may keep) stays as sent."""
    from sluice.runtime.ipc.messages import TokenizedGenerateReq

    h = make_harness(max_context_len=16)
    params = SamplingParams(temperature=0.0, max_new_tokens=100, ignore_eos=True)
    h.scheduler.handle(TokenizedGenerateReq("long", [5, 6, 7, 8, 9, 10], params))
    assert params.max_new_tokens == 100
    h.run_until_idle()
    assert len(h.outputs["long"]) == 16 - 6  # the room the context left
