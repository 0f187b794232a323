"""The seed's A/B/C walk-through and the basic life of a request."""

from __future__ import annotations

from sluice.runtime.forward import ForwardMode

EXTEND, DECODE = ForwardMode.EXTEND, ForwardMode.DECODE


def test_abc_walkthrough_matches_the_seed_table(make_harness):
    # two request slots; A, B, C need 2 / 5 / 2 tokens; C arrives after round 0; prefill
    # ticks run alone (mini-sglang's loop, the seed's table)
    h = make_harness(max_running_requests=2, disable_mixed_chunk=True)
    h.submit("A", [5, 6, 7], max_new_tokens=2, ignore_eos=True)
    h.submit("B", [8, 9, 10, 11], max_new_tokens=5, ignore_eos=True)

    rounds = []

    def tick():
        t = h.step()
        rounds.append((t.mode, t.rids))
        return t

    tick()  # round 0: prefill A, B -> first token each
    assert {k: len(v) for k, v in h.outputs.items()} == {"A": 1, "B": 1}
    h.submit("C", [12, 13], max_new_tokens=2, ignore_eos=True)
    tick()  # round 1: decode A, B -> A has 2 tokens and finishes
    assert "A" in h.finished and h.finished["A"].kind == "length"
    tick()  # round 2: prefill C into A's slot; B waits this round
    tick()  # round 3: decode B, C -> C finishes
    assert "C" in h.finished and len(h.outputs["C"]) == 2
    tick()  # round 4: decode B -> 4th token
    assert len(h.outputs["B"]) == 4 and "B" not in h.finished
    tick()  # round 5: decode B -> 5th token, B finishes
    assert rounds == [
        (EXTEND, ["A", "B"]),
        (DECODE, ["A", "B"]),
        (EXTEND, ["C"]),
        (DECODE, ["B", "C"]),
        (DECODE, ["B"]),
        (DECODE, ["B"]),
    ]
    assert {k: len(v) for k, v in h.outputs.items()} == {"A": 2, "B": 5, "C": 2}
    assert h.step() is None
    h.assert_all_free()


def test_abc_with_mixed_chunks_decodes_b_while_c_is_prefilled(make_harness):
    # the same walk-through, mixed (the default): B never pauses, so it finishes a round early
    h = make_harness(max_running_requests=2)
    h.submit("A", [5, 6, 7], max_new_tokens=2, ignore_eos=True)
    h.submit("B", [8, 9, 10, 11], max_new_tokens=5, ignore_eos=True)
    rounds = [h.step()]
    h.submit("C", [12, 13], max_new_tokens=2, ignore_eos=True)
    while (t := h.step()) is not None:
        rounds.append(t)
    assert [(t.mode, t.rids, t.num_decode) for t in rounds] == [
        (EXTEND, ["A", "B"], 0),
        (DECODE, ["A", "B"], 2),
        (EXTEND, ["B", "C"], 1),  # B's decode and C's prefill in one forward
        (DECODE, ["B", "C"], 2),
        (DECODE, ["B"], 1),
    ]
    assert {k: len(v) for k, v in h.outputs.items()} == {"A": 2, "B": 5, "C": 2}
    h.assert_all_free()


def test_a_request_stops_at_an_eos_token_unless_told_to_ignore_it(make_harness):
    h = make_harness()
    h.submit("probe", [5, 6, 7], max_new_tokens=4, ignore_eos=True)
    h.run_until_idle()
    first = h.outputs["probe"][0]
    # make the first greedy token a stop token: the request ends right there
    h.submit("stops", [5, 6, 7], max_new_tokens=4, stop_token_ids=[first])
    h.run_until_idle()
    assert h.outputs["stops"] == [first]
    assert h.finished["stops"].kind == "stop" and h.finished["stops"].matched_token == first


def test_min_tokens_holds_back_a_stop_token(make_harness):
    h = make_harness()
    h.submit("probe", [5, 6, 7], max_new_tokens=1, ignore_eos=True)
    h.run_until_idle()
    first = h.outputs["probe"][0]
    h.submit("min", [5, 6, 7], max_new_tokens=3, min_new_tokens=2, stop_token_ids=[first])
    h.run_until_idle()
    assert len(h.outputs["min"]) >= 2 and h.outputs["min"][0] != first


def test_prompt_longer_than_the_context_is_rejected_without_touching_the_pool(make_harness):
    h = make_harness(max_total_tokens=64)
    h.submit("long", list(range(5, 200)), max_new_tokens=4)
    h.collect()
    assert h.finished["long"].kind == "abort"
    assert "context" in h.finished["long"].message
    h.assert_all_free()


def test_max_new_tokens_is_clipped_to_the_context(make_harness):
    h = make_harness(max_total_tokens=64)
    context = h.worker.context_len
    h.submit("clip", list(range(5, 5 + context - 3)), max_new_tokens=100, ignore_eos=True)
    h.run_until_idle()
    assert len(h.outputs["clip"]) == 3 and h.finished["clip"].kind == "length"


def test_abort_returns_every_page_in_each_state(make_harness):
    h = make_harness(max_running_requests=2, chunked_prefill_size=8, max_prefill_tokens=8)
    h.submit("running", list(range(5, 10)), max_new_tokens=50, ignore_eos=True)
    h.step()
    h.submit("chunked", list(range(5, 40)), max_new_tokens=50, ignore_eos=True)
    h.step()  # first chunk of "chunked"
    assert h.scheduler.prefill.chunked is not None
    h.submit("waiting", list(range(5, 12)), max_new_tokens=5, ignore_eos=True)
    for rid in ("waiting", "chunked", "running"):
        h.abort(rid)
        assert h.finished[rid].kind == "abort"
    assert not h.scheduler.has_work
    h.assert_all_free()


def test_finished_request_frees_its_slot_at_once(make_harness):
    h = make_harness(max_running_requests=1)
    h.submit("first", [5, 6], max_new_tokens=1, ignore_eos=True)
    h.submit("second", [7, 8], max_new_tokens=1, ignore_eos=True)
    t0 = h.step()
    t1 = h.step()
    assert (t0.rids, t1.rids) == (["first"], ["second"])
    assert t1.mode is EXTEND
