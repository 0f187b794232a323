"""Chunked prefill, retraction and the radix prefix cache, tick by tick."""

from __future__ import annotations

import pytest

from sluice.runtime.forward import ForwardMode

EXTEND, DECODE = ForwardMode.EXTEND, ForwardMode.DECODE


def test_a_prompt_five_times_the_chunk_size_is_prefilled_in_five_ticks(make_harness):
    h = make_harness(chunked_prefill_size=16, max_prefill_tokens=16)
    h.submit("long", [5 + i % 200 for i in range(80)], max_new_tokens=3, ignore_eos=True)
    for _i in range(4):
        t = h.step()
        assert (t.mode, t.rids, t.num_tokens) == (EXTEND, ["long"], 16)
        assert "long" not in h.outputs  # intermediate chunks emit no token
        assert not h.scheduler.decode.running  # and never enter the decode set
    t = h.step()
    assert (t.mode, t.num_tokens) == (EXTEND, 16)
    assert len(h.outputs["long"]) == 1 and h.scheduler.decode.running
    h.run_until_idle()
    assert len(h.outputs["long"]) == 3


def test_only_one_request_is_chunked_at_a_time(make_harness):
    h = make_harness(chunked_prefill_size=16, max_prefill_tokens=16)
    h.submit("a", [7] * 40, max_new_tokens=1, ignore_eos=True)
    h.submit("b", [8] * 40, max_new_tokens=1, ignore_eos=True)
    seen = [(h.step().rids, h.scheduler.prefill.chunked) for _ in range(3)]
    # a: 16 + 16 + its last 8; b starts in the third tick's leftover 8 tokens, and only once
    # a is no longer being chunked
    assert [rids for rids, _ in seen] == [["a"], ["a"], ["a", "b"]]
    assert [c.rid if c else None for _, c in seen] == ["a", "a", "b"]
    h.run_until_idle()
    assert len(h.outputs["a"]) == 1 and len(h.outputs["b"]) == 1


def test_a_tiny_pool_forces_retraction_and_every_request_completes(make_harness):
    h = make_harness(max_total_tokens=96, max_running_requests=8, disable_radix_cache=True)
    for i in range(6):
        h.submit(f"r{i}", [5 + i, 6, 7, 8], max_new_tokens=24, ignore_eos=True)
    h.run_until_idle()
    assert all(len(h.outputs[f"r{i}"]) == 24 for i in range(6))
    assert h.scheduler.counters.retractions_total > 0
    assert any(t.retracted for t in h.ticks)
    h.assert_all_free()


def test_retraction_takes_fewest_generated_tokens_first_then_longest_prompt(make_harness):
    from sluice.runtime.ipc.messages import SamplingParams
    from sluice.runtime.scheduler.decode import retraction_order
    from sluice.runtime.scheduler.request import Req

    def req(rid, prompt, generated):
        r = Req(rid=rid, input_ids=[1] * prompt, sampling=SamplingParams())
        r.output_ids = [2] * generated
        return r

    reqs = [req("old", 4, 9), req("short", 3, 1), req("long", 8, 1)]
    order = sorted(reqs, key=retraction_order("length"))
    assert [r.rid for r in order] == ["long", "short", "old"]


def test_retraction_raises_new_token_ratio_and_logs(make_harness, caplog):
    h = make_harness(max_total_tokens=96, max_running_requests=8, disable_radix_cache=True)
    for i in range(6):
        h.submit(f"r{i}", [5 + i, 6, 7, 8], max_new_tokens=24, ignore_eos=True)
    with caplog.at_level("INFO", logger="sluice.scheduler"):
        while not any(t.retracted for t in h.ticks):
            before = h.scheduler.ratio.value
            h.step()
    (line,) = [m for m in caplog.messages if "retracted requests=" in m]
    logged = line.split("new_token_ratio=")[1].split()[0]
    logged_before, logged_after = map(float, logged.split("->"))
    assert line.endswith("reason=KV pool exhausted")
    assert logged_before == pytest.approx(before, abs=1e-3)
    # the survivors have used (decoded + 20 each) of their max_new_tokens: 24 each, clipped
    survivors = list(h.scheduler.decode.running.values())
    estimate = (sum(len(r.output_ids) for r in survivors) + 20 * len(survivors)) / (
        24 * len(survivors)
    )
    assert logged_after == pytest.approx(min(1.0, max(before, estimate)), abs=1e-3)
    assert logged_after > logged_before  # admission gets more careful after a retraction
    h.run_until_idle()


def test_a_shared_prefix_is_computed_once(make_harness):
    h = make_harness(page_size=4)
    prefix = [5 + (i * 7) % 150 for i in range(40)]
    h.submit("first", prefix + [9, 9], max_new_tokens=2, ignore_eos=True)
    h.run_until_idle()
    first_prefill = h.ticks[0].num_tokens
    h.ticks.clear()
    h.submit("second", prefix + [11, 12, 13], max_new_tokens=2, ignore_eos=True)
    h.run_until_idle()
    assert first_prefill == 42
    assert h.ticks[0].num_tokens == 43 - 40  # the 40-token prefix (10 pages) was reused
    stats = h.scheduler.stats()
    assert stats.prefix_cache_hit_ratio > 0
    h.assert_all_free()


def test_the_prefix_cache_is_evicted_when_the_pool_runs_short(make_harness):
    h = make_harness(max_total_tokens=64)
    h.submit("a", list(range(5, 45)), max_new_tokens=2, ignore_eos=True)
    h.run_until_idle()
    assert h.scheduler.cache.cached_size > 0
    h.submit("b", list(range(100, 150)), max_new_tokens=2, ignore_eos=True)
    h.run_until_idle()
    assert len(h.outputs["b"]) == 2
    h.assert_all_free()


def test_disable_radix_cache_reuses_nothing(make_harness):
    h = make_harness(disable_radix_cache=True)
    prompt = list(range(5, 30))
    for rid in ("a", "b"):
        h.submit(rid, prompt, max_new_tokens=1, ignore_eos=True)
        h.run_until_idle()
    assert [t.num_tokens for t in h.ticks] == [25, 25]


def test_a_prompt_shares_its_prefix_before_it_finishes(make_harness):
    h = make_harness(chunked_prefill_size=16, max_prefill_tokens=16, page_size=4)
    prompt = [5 + (i * 3) % 150 for i in range(64)]
    h.submit("first", prompt, max_new_tokens=2, ignore_eos=True)
    h.step()
    h.step()  # two chunks (32 tokens) of "first" are computed and cached
    assert h.scheduler.cache.cached_size == 32
    h.submit("twin", prompt[:32] + [7] * 8, max_new_tokens=1, ignore_eos=True)
    h.run_until_idle()
    assert h.cached["twin"] == 32  # reused while "first" was still being chunked
    assert h.outputs["first"] and h.outputs["twin"]


def test_n_choices_of_one_prompt_share_one_prefill(make_harness):
    # what the API does for n > 1: a prefill-only request (max_new_tokens 0) caches the
    # prompt, then each choice computes only the prompt's last token
    h = make_harness(page_size=4)
    prompt = [5 + (i * 11) % 170 for i in range(41)]
    h.submit("prefill", prompt, max_new_tokens=0)
    h.run_until_idle()
    assert h.finished["prefill"].kind == "length" and h.outputs.get("prefill", []) == []
    assert h.ticks[0].num_tokens == 41
    h.ticks.clear()
    for j in range(3):
        h.submit(f"choice{j}", prompt, max_new_tokens=2, ignore_eos=True, temperature=1.0, seed=j)
    h.step()
    assert h.ticks[0].num_tokens == 3 * (41 - 40)  # 40 tokens (10 pages) reused by each
    h.run_until_idle()
    assert all(len(h.outputs[f"choice{j}"]) == 2 for j in range(3))
    h.assert_all_free()
