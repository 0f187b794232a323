"""`--schedule-policy priority`: lower `priority` first; a more important arrival preempts
less important running requests when the pool cannot hold it, and they resume unchanged."""

from __future__ import annotations

PROMPTS = {f"low{i}": [5 + i, 6, 7, 8, 9 + i] for i in range(4)}


def fill_with_low_priority(h):
    for rid, prompt in PROMPTS.items():
        h.submit(rid, prompt, max_new_tokens=40, ignore_eos=True, priority=10)
    for _ in range(3):
        h.step()


def test_waiting_requests_are_admitted_by_priority_then_arrival(make_harness):
    h = make_harness(schedule_policy="priority", max_running_requests=1)
    h.submit("busy", [5, 6, 7], max_new_tokens=3, ignore_eos=True)
    h.step()
    for rid, prio in (("b", 5), ("a", 1), ("c", 5), ("d", 0)):
        h.submit(rid, [8, 9, 10], max_new_tokens=1, ignore_eos=True, priority=prio)
    h.run_until_idle()
    firsts = [t.rids[-1] for t in h.ticks if t.mode.value == "extend"]
    assert firsts == ["busy", "d", "a", "b", "c"]


def test_an_important_arrival_preempts_less_important_running_requests(make_harness):
    kw = dict(schedule_policy="priority", max_running_requests=4, max_total_tokens=120,
              enable_deterministic_inference=True, init_new_token_ratio=0.05)  # fmt: skip
    h = make_harness(**kw)
    fill_with_low_priority(h)
    assert len(h.scheduler.decode.running) == 4  # the table is full
    h.submit("urgent", [30, 31, 32, 33, 34, 35], max_new_tokens=20, ignore_eos=True, priority=0)
    t = h.step()
    assert "urgent" in t.rids and t.retracted  # admitted at once, by preempting
    assert all(rid.startswith("low") for rid in t.retracted)
    h.run_until_idle()
    # the preempted ones resumed and finished with exactly what they would have produced
    alone = make_harness(**kw)
    for rid, prompt in PROMPTS.items():
        alone.submit(rid, prompt, max_new_tokens=40, ignore_eos=True, priority=10)
    alone.run_until_idle()
    assert {r: h.outputs[r] for r in PROMPTS} == {r: alone.outputs[r] for r in PROMPTS}
    assert len(h.outputs["urgent"]) == 20


def test_equal_priority_never_preempts(make_harness):
    h = make_harness(schedule_policy="priority", max_running_requests=4, max_total_tokens=120,
                     init_new_token_ratio=0.05)  # fmt: skip
    fill_with_low_priority(h)
    h.submit("same", [30, 31, 32], max_new_tokens=5, ignore_eos=True, priority=10)
    t = h.step()
    assert not t.retracted and "same" not in t.rids
    h.run_until_idle()
