"""A running request keeps getting tokens while new requests keep arriving.

K, the bound a running request can wait for its next token (in ticks): with mixed chunks
(the default) every tick decodes every running request, so K = 1; without them prefill
ticks go first, but at most `--max-prefill-streak` (default 4) in a row, so K = 5.
"""

from __future__ import annotations

import pytest


def longest_gap(h, rid: str, ticks: int, arrivals) -> int:
    """Run `ticks` ticks, submitting `arrivals(i)` before tick i; the most ticks in a row
    `rid` went without a new token."""
    gap = longest = 0
    for i in range(ticks):
        for args in arrivals(i):
            h.submit(*args[:2], **args[2])
        before = len(h.outputs.get(rid, []))
        h.step()
        gap = 0 if len(h.outputs.get(rid, [])) > before else gap + 1
        longest = max(longest, gap)
    return longest


def one_per_tick(i: int):
    prompt = [7 + (i * 13 + j) % 200 for j in range(24)]
    return [(f"new{i}", prompt, {"max_new_tokens": 2, "ignore_eos": True})]


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_with_mixed_chunks_a_running_request_gets_a_token_every_tick(make_harness, overlap):
    h = make_harness(max_running_requests=32, disable_overlap_schedule=not overlap)
    h.submit("long", [5, 6, 7, 8], max_new_tokens=200, ignore_eos=True)
    h.step()  # its prefill
    h.step()
    assert longest_gap(h, "long", 40, one_per_tick) == 0  # a new token at every tick
    h.run_until_idle()


def test_without_mixed_chunks_a_running_request_waits_at_most_the_streak(make_harness):
    h = make_harness(max_running_requests=64, disable_mixed_chunk=True, max_prefill_streak=4)
    h.submit("long", [5, 6, 7, 8], max_new_tokens=200, ignore_eos=True)
    h.step()
    assert longest_gap(h, "long", 40, one_per_tick) == 4  # prefill is always waiting
    h.run_until_idle()


def test_a_long_chunked_prompt_does_not_stop_the_decodes(make_harness):
    h = make_harness(chunked_prefill_size=16, max_prefill_tokens=16)
    h.submit("running", [5, 6, 7], max_new_tokens=40, ignore_eos=True)
    h.step()
    h.submit("long", [9 + i % 100 for i in range(160)], max_new_tokens=2, ignore_eos=True)
    ticks = [h.step() for _ in range(10)]
    # every tick is the running request's decode plus 15 tokens of the long prompt
    assert all(
        t.rids == ["running", "long"] and t.num_decode == 1 and t.num_tokens == 16 for t in ticks
    )
    h.run_until_idle()
