"""The overlap loop gives exactly the normal loop's outputs and leaks nothing."""

from __future__ import annotations

import pytest

PROMPTS = [[5 + (i * 11 + j * 3) % 170 for j in range(5 + (i * 7) % 29)] for i in range(24)]


def run(make_harness, overlap: bool, submit, **args):
    h = make_harness(
        enable_deterministic_inference=True, disable_overlap_schedule=not overlap, **args
    )
    submit(h)
    h.run_until_idle()
    assert not h.scheduler.inflight.deferred
    return h


def both(make_harness, submit, **args):
    normal = run(make_harness, False, submit, **args)
    overlap = run(make_harness, True, submit, **args)
    return normal, overlap


def many(**sampling):
    def submit(h):
        for i, p in enumerate(PROMPTS):
            h.submit(f"r{i}", p, **{"max_new_tokens": 12 + i % 9, "ignore_eos": True, **sampling})

    return submit


def test_single_request(make_harness):
    n, o = both(
        make_harness, lambda h: h.submit("one", PROMPTS[0], max_new_tokens=17, ignore_eos=True)
    )
    assert o.outputs == n.outputs and len(o.outputs["one"]) == 17


def test_heavy_concurrency(make_harness):
    n, o = both(make_harness, many(), max_running_requests=24)
    assert o.outputs == n.outputs
    assert any(t.mode.value == "decode" and len(t.rids) > 8 for t in o.ticks)


def test_seeded_sampling(make_harness):
    # penalties read the token still in flight in the overlap loop; greedy penalties are
    # checked against transformers in test_penalty_oracle.py, this is the sampled case
    sampled = dict(temperature=0.8, top_p=0.95, seed=7)
    penalised = dict(sampled, repetition_penalty=1.2, frequency_penalty=0.3)
    n, o = both(make_harness, many(**penalised), max_running_requests=24)
    assert o.outputs == n.outputs
    plain = run(make_harness, True, many(**sampled), max_running_requests=24)
    changed = sum(plain.outputs[k] != o.outputs[k] for k in o.outputs)
    assert changed >= len(o.outputs) // 2  # the penalties do change what users get


def test_chunked_prefill(make_harness):
    n, o = both(make_harness, many(), chunked_prefill_size=8, max_prefill_tokens=8)
    assert o.outputs == n.outputs


def test_forced_retraction(make_harness):
    n, o = both(
        make_harness, many(max_new_tokens=40), max_total_tokens=160, max_running_requests=24
    )
    assert o.outputs == n.outputs
    assert o.scheduler.counters.retractions_total > 0


def test_max_tokens_boundary_drops_the_extra_token(make_harness):
    # max_new_tokens=1: the request finishes with its prefill token; nothing more is streamed
    n, o = both(make_harness, many(max_new_tokens=1))
    assert o.outputs == n.outputs
    assert all(len(v) == 1 for v in o.outputs.values())


def test_eos_in_flight_drops_the_extra_token(make_harness):
    probe = run(
        make_harness, False, lambda h: h.submit("p", PROMPTS[3], max_new_tokens=6, ignore_eos=True)
    )
    stop = probe.outputs["p"][2]  # the third greedy token ends the request below

    def submit(h):
        h.submit("s", PROMPTS[3], max_new_tokens=30, stop_token_ids=[stop])

    n, o = both(make_harness, submit)
    assert o.outputs == n.outputs and o.outputs["s"][-1] == stop
    assert o.finished["s"].matched_token == stop


def test_stop_strings(make_harness):
    probe = run(
        make_harness, False, lambda h: h.submit("p", PROMPTS[5], max_new_tokens=8, ignore_eos=True)
    )
    text = probe.worker.decode_text(probe.outputs["p"])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("the tiny model produced whitespace only")

    def submit(h):
        h.submit("s", PROMPTS[5], max_new_tokens=8, ignore_eos=True, stop=[stop])

    n, o = both(make_harness, submit)
    assert o.outputs == n.outputs and o.finished["s"].matched_str == stop


@pytest.mark.parametrize("when", [0, 1, 3, 6])
def test_aborts_at_any_tick_free_everything(make_harness, when):
    h = make_harness(disable_overlap_schedule=False, max_running_requests=24,
                     chunked_prefill_size=16, max_prefill_tokens=16)  # fmt: skip
    many()(h)
    for _ in range(when):
        h.step()
    for i in range(0, len(PROMPTS), 2):
        h.abort(f"r{i}")
    h.run_until_idle()
    for i in range(0, len(PROMPTS), 2):
        assert h.finished[f"r{i}"].kind in ("abort", "length")
    for i in range(1, len(PROMPTS), 2):
        assert h.finished[f"r{i}"].kind == "length"
    h.assert_all_free()


@pytest.mark.parametrize("overlap", [False, True])
def test_tick_timing_shows_where_the_time_went(make_harness, overlap):
    h = make_harness(disable_overlap_schedule=not overlap)
    many()(h)
    h.run_until_idle()
    t = h.scheduler.timing.take()
    assert t.ticks >= len(h.ticks) and t.forward > 0 and t.schedule > 0 and t.process > 0
    assert "forward=" in t.summary() and "wait=" in t.summary()
    assert h.scheduler.timing.take().ticks == 0  # take() resets


def test_the_stream_executor_gives_the_normal_loops_outputs(make_harness):
    """The GPU's overlap executor (forward enqueued from the scheduler thread, sampling once
    the vocab mask is filled, results read after the stream's event), driven here through
    host streams: the same outputs as the normal loop, constrained and penalised rows
    included."""
    import json

    from sluice.runtime.engine.executor import HostStreams, StreamExecutor
    from sluice.runtime.ipc.messages import Constraint

    def submit(h):
        many(frequency_penalty=0.4)(h)
        for i in range(4):
            h.submit(f"c{i}", PROMPTS[i], max_new_tokens=16,
                     constraint=Constraint("choice", json.dumps(["yes", "no", "later"])))  # fmt: skip
            h.submit(f"lp{i}", PROMPTS[i + 4], max_new_tokens=5, ignore_eos=True, logprobs=True,
                     top_logprobs_num=3, logprob_start_len=0)  # fmt: skip

    normal = run(make_harness, False, submit, max_running_requests=24)
    h = make_harness(enable_deterministic_inference=True, disable_overlap_schedule=False,
                     max_running_requests=24)  # fmt: skip
    h.scheduler.executor.close()
    h.scheduler.executor = StreamExecutor(h.worker, HostStreams())
    submit(h)
    h.run_until_idle()
    assert h.outputs == normal.outputs
    assert all(h.finished[f"c{i}"].kind == "stop" for i in range(4))
