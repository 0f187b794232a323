"""`sluice serve --schedule-trace`: the real server's trace holds what it was sent, checked
against the requests themselves (every prompt arrives with its length, every prompt
token is computed once by a prefill row when nothing is cached, every later token by a
decode row, forwards in launch order), and the calibration's served phase fits its
`ServingCost` from such a trace through a real server on the tiny model."""

from __future__ import annotations

import httpx
import pytest
from server_process import serve

from sluice.runtime.scheduler.schedule_trace import read_trace
from sluice.runtime.sim.cost_model import LinearCost, LoopCost
from sluice.runtime.sim.served import measure_serving

pytestmark = pytest.mark.integration

PROMPTS = [list(range(10, 10 + n)) for n in (7, 33, 90)]
MAX_NEW = (5, 3, 8)


def test_the_trace_holds_what_the_server_was_sent(tiny_llama_path, tmp_path):
    trace = tmp_path / "trace.jsonl"
    with serve(
        tiny_llama_path, tmp_path / "log", "--schedule-trace", str(trace), "--disable-radix-cache"
    ) as srv:
        for ids, n in zip(PROMPTS, MAX_NEW, strict=True):
            body = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0},
            }
            r = httpx.post(srv.url + "/generate", json=body, timeout=60)
            assert r.status_code == 200, r.text
    events = list(read_trace(trace))
    arrivals = [e for e in events if e["event"] == "arrival"]
    # the server's own warm-up generation first, then ours in the order sent (one at a time)
    assert [a["prompt_tokens"] for a in arrivals[1:]] == [len(p) for p in PROMPTS]
    # handed over by the API server (its wall clock, put on the monotonic one) before the
    # scheduler took it in, and after the previous request was taken in (sent one at a time)
    for prev, a in zip(arrivals, arrivals[1:], strict=False):
        assert prev["t"] < a["handed"] <= a["t"] + 1e-3, (prev, a)
    ours = [e for e in events if e["event"] == "forward" and e["submitted"] >= arrivals[1]["t"]]
    assert sum(e["prefill_tokens"] for e in ours) == sum(len(p) for p in PROMPTS)
    assert sum(e["decode_rows"] for e in ours) == sum(n - 1 for n in MAX_NEW)
    assert sum(e["sampled_rows"] for e in ours) == sum(MAX_NEW)
    for e in ours:
        assert e["submitted"] <= e["end"] and e["seconds"] > 0
        assert sum(r[2] for r in e["rows"]) == e["decode_rows"] + e["prefill_tokens"]
    assert [e["submitted"] for e in ours] == sorted(e["submitted"] for e in ours)


def test_the_served_phase_fits_the_serving_costs_through_a_real_server(tiny_llama_path):
    from sluice.runtime.model.loader import load_tokenizer

    scheduler_alone = LoopCost(LinearCost(("one", "tokens"), (0.001, 1e-5)), LinearCost.constant(1e-4),
                               LinearCost.constant(1e-4))  # fmt: skip
    measured = measure_serving(
        str(tiny_llama_path), ["--device", "cpu"], load_tokenizer(tiny_llama_path), scheduler_alone,
        context_len=512, max_rows=16, scale=0.1, log=lambda line: None,
    )  # fmt: skip
    s = measured.serving
    report = measured.report
    assert (
        s.hand_over_s + s.hand_over_per_token_s > 0
    )  # a request takes time to reach the scheduler
    assert s.forward_scale >= 1.0 and s.tick_s >= 0 and s.per_sampled_row_s >= 0
    assert len(report["hand_over_ms"]) >= 3 and all(v > 0 for v in report["hand_over_ms"].values())
    assert report["return_ms"] and all(v > 0 for v in report["return_ms"])
    assert report["burst_ticks"] >= 10
