"""The server around the scheduler, in the simulator (`ServingCost`): the hand-over puts a
burst into the scheduler one request after another, the return delays what the client
sees, and each tick pays the streaming and the slower forward. The costs are chosen, so
every time is known exactly; then `fit_serving` must recover chosen costs from a trace
made with them."""

from __future__ import annotations

import dataclasses

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.scheduler.schedule_trace import read_trace
from sluice.runtime.sim.cost_model import LinearCost, LoopCost, ServingCost
from sluice.runtime.sim.replica import SimReplica, SimRequest
from sluice.runtime.sim.served import SentRequest, fit_serving

H_SCHED, H_PROC = 0.002, 0.001
F_BASE, F_TOKEN = 0.030, 0.0001
SERVING = ServingCost(hand_over_s=0.004, hand_over_per_token_s=0.00001, return_s=0.003,
                      forward_scale=1.1, tick_s=0.002, per_sampled_row_s=0.0005)  # fmt: skip


@pytest.fixture(scope="module")
def calibration(tiny_llama_path):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    base = synthetic_calibration(
        worker, LinearCost(("one", "tokens"), (F_BASE, F_TOKEN)), H_SCHED, H_PROC
    )
    return dataclasses.replace(base, serving=SERVING)


def forward(tokens: int, sampled: int) -> float:
    f = F_BASE + F_TOKEN * tokens
    return f * SERVING.forward_scale + SERVING.tick_s + SERVING.per_sampled_row_s * sampled


def test_a_burst_reaches_the_scheduler_one_request_after_another(
    tiny_llama_path, calibration, tmp_path
):
    trace = tmp_path / "t.jsonl"
    r = SimReplica(
        server_args(tiny_llama_path, disable_overlap_schedule=True),
        calibration,
        trace_path=str(trace),
    )
    for i, n in enumerate((100, 60, 60)):
        r.submit(SimRequest(f"r{i}", list(range(5 + i, 5 + i + n)), 3, arrival=1.0))
    r.run_to_completion()
    r.trace.close()
    events = list(read_trace(trace))
    arrivals = [e["t"] for e in events if e["event"] == "arrival"]
    h = [SERVING.hand_over(n) for n in (100, 60, 60)]
    assert arrivals[0] == pytest.approx(1.0 + h[0])
    # the first is scheduled alone; the others were handed over during its forward and
    # are taken in at the next tick (the loop reads its inbox between ticks)
    first = next(e for e in events if e["event"] == "forward")
    assert first["submitted"] == pytest.approx(1.0 + h[0])
    assert first["prefill_rows"] == 1 and first["prefill_tokens"] == 100
    assert arrivals[1:] == pytest.approx([first["end"] + H_PROC] * 2)
    # ... though the API server had handed them over one after another, during that forward
    handed = [e["handed"] for e in events if e["event"] == "arrival"]
    assert handed == pytest.approx([1.0 + h[0], 1.0 + h[0] + h[1], 1.0 + h[0] + h[1] + h[2]])
    # what the client sees: the first token after its forward, its processing and the return
    tr = r.traces["r0"]
    assert tr.ttft == pytest.approx(h[0] + H_SCHED + forward(100, 1) + H_PROC + SERVING.return_s)


def test_the_serving_costs_are_what_the_simulator_adds(tiny_llama_path, calibration):
    plain = dataclasses.replace(calibration, serving=ServingCost())
    ttft = {}
    for name, cal in (("plain", plain), ("served", calibration)):
        r = SimReplica(server_args(tiny_llama_path, disable_overlap_schedule=True), cal)
        r.submit(SimRequest("a", list(range(5, 105)), 4, arrival=0.0))
        r.run_to_completion()
        ttft[name] = r.traces["a"]
    assert ttft["plain"].ttft == pytest.approx(H_SCHED + F_BASE + F_TOKEN * 100 + H_PROC)
    assert ttft["served"].itl == pytest.approx([H_SCHED + forward(1, 1) + H_PROC] * 3)


def test_fit_serving_recovers_chosen_costs():
    cost = LoopCost(LinearCost(("one", "tokens"), (F_BASE, F_TOKEN)), LinearCost.constant(H_SCHED),
                    LinearCost.constant(H_PROC))  # fmt: skip
    events: list[dict] = []
    sent: list[SentRequest] = []
    t = 100.0

    def fwd(f: BatchFeatures) -> None:
        nonlocal t
        seconds = forward(f.tokens, f.sampled_rows)
        start = t + H_SCHED
        events.append({"event": "forward", "submitted": t, "end": start + seconds, "seconds": seconds,
                       "rows": [], **f.to_dict()})  # fmt: skip
        t = start + seconds + H_PROC

    for n in (16, 128, 512, 1024):  # single requests to an idle server
        send = t
        t += SERVING.hand_over(n)
        events.append({"event": "arrival", "t": t, "rid": f"s{n}", "prompt_tokens": n})
        fwd(BatchFeatures(prefill_rows=1, prefill_tokens=n, sampled_rows=1))
        first = events[-1]["end"] + SERVING.return_s
        fwd(BatchFeatures(decode_rows=1, decode_context=n + 1, sampled_rows=1))
        sent.append(SentRequest("single", n, send, first, t))
        t += 1.0
    for b in (8, 32, 64):  # bursts: a prefill, then decode steps
        send = t
        fwd(BatchFeatures(prefill_rows=b, prefill_tokens=64 * b, sampled_rows=b))
        for k in range(10):
            fwd(BatchFeatures(decode_rows=b, decode_context=b * (65 + k), sampled_rows=b))
        sent += [SentRequest(f"burst-{b}", 64, send, None, t) for _ in range(b)]
        t += 1.0
    fitted = fit_serving(events, sent, cost)
    got = fitted.serving
    assert got.hand_over_s == pytest.approx(SERVING.hand_over_s, rel=1e-3)
    assert got.hand_over_per_token_s == pytest.approx(SERVING.hand_over_per_token_s, rel=1e-3)
    assert got.return_s == pytest.approx(SERVING.return_s, rel=1e-6)
    assert got.forward_scale == pytest.approx(SERVING.forward_scale, rel=1e-3)
    assert got.tick_s == pytest.approx(SERVING.tick_s, rel=1e-2, abs=1e-5)
    assert got.per_sampled_row_s == pytest.approx(SERVING.per_sampled_row_s, rel=1e-2)
    assert fitted.report["tick_residual_median"] < 1e-6


def test_a_calibration_without_a_served_phase_reads_as_no_serving_cost(calibration):
    d = calibration.to_dict()
    del d["serving"]
    assert type(calibration).from_dict(d).serving == ServingCost()
    assert type(calibration).from_dict(calibration.to_dict()).serving == SERVING
