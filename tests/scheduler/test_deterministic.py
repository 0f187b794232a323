"""--enable-deterministic-inference: a request's tokens do not depend on its batch."""

from __future__ import annotations

import random

import pytest

PROMPTS = [[5 + (i * 13 + j * 7) % 180 for j in range(6 + (i * 5) % 37)] for i in range(32)]
NEW = 20


def run_all(h, order, **sampling):
    for i in order:
        h.submit(f"p{i}", PROMPTS[i], max_new_tokens=NEW, ignore_eos=True, **sampling)
    h.run_until_idle()
    return {i: h.outputs[f"p{i}"] for i in order}


_ALONE: dict[int, list[int]] = {}


@pytest.fixture
def alone(make_harness):
    """Each prompt run on its own (computed once per module)."""
    if not _ALONE:
        h = make_harness(enable_deterministic_inference=True, disable_radix_cache=True)
        for i in range(len(PROMPTS)):
            _ALONE.update(run_all(h, [i]))
    return _ALONE


def test_batch_of_32_in_any_order_matches_alone(make_harness, alone):
    order = list(range(32))
    random.Random(7).shuffle(order)
    h = make_harness(enable_deterministic_inference=True, max_running_requests=32)
    assert run_all(h, order) == alone


def test_chunked_prefill_matches_alone(make_harness, alone):
    h = make_harness(
        enable_deterministic_inference=True, chunked_prefill_size=8, max_prefill_tokens=8
    )
    assert run_all(h, range(32)) == alone


def test_retraction_under_a_tiny_pool_matches_alone(make_harness, alone):
    h = make_harness(
        enable_deterministic_inference=True, max_total_tokens=256, max_running_requests=16
    )
    assert run_all(h, range(32)) == alone
    assert h.scheduler.counters.retractions_total > 0


def test_seeded_sampling_is_reproducible_across_batches(make_harness):
    params = dict(temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    solo = make_harness(enable_deterministic_inference=True)
    first = run_all(solo, [3], **params)[3]
    crowd = make_harness(
        enable_deterministic_inference=True, max_total_tokens=256, max_running_requests=16
    )
    for i in range(32):
        if i != 3:
            crowd.submit(f"p{i}", PROMPTS[i], max_new_tokens=NEW, ignore_eos=True)
    assert run_all(crowd, [3], **params)[3] == first
