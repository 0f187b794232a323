"""Where the virtual clock puts each token: the normal loop runs schedule, forward and
processing one after another; the overlap loop runs batch N's forward while batch N-1 is
processed and N+1 scheduled. The costs are chosen, so every time is known exactly."""

from __future__ import annotations

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.sim.client import ClientRequest, replay
from sluice.runtime.sim.cost_model import LinearCost
from sluice.runtime.sim.replica import SimReplica, SimRequest

H_SCHED, H_PROC = 0.002, 0.001
F_BASE, F_TOKEN = 0.030, 0.0001  # forward: 30 ms + 0.1 ms per computed position


@pytest.fixture(scope="module")
def calibration(tiny_llama_path):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    return synthetic_calibration(worker, LinearCost(("one", "tokens"), (F_BASE, F_TOKEN)), H_SCHED, H_PROC)


def replica(tiny_llama_path, calibration, overlap: bool, **flags: object) -> SimReplica:
    return SimReplica(server_args(tiny_llama_path, disable_overlap_schedule=not overlap, **flags), calibration)


def forward(tokens: int) -> float:
    return F_BASE + F_TOKEN * tokens


def test_normal_loop_tick_is_schedule_plus_forward_plus_processing(tiny_llama_path, calibration):
    r = replica(tiny_llama_path, calibration, overlap=False)
    r.submit(SimRequest("a", list(range(5, 105)), 4, arrival=1.0))
    r.run_to_completion()
    tr = r.traces["a"]
    tick = H_SCHED + forward(1) + H_PROC
    assert tr.ttft == pytest.approx(H_SCHED + forward(100) + H_PROC)
    assert tr.itl == pytest.approx([tick] * 3)
    assert tr.e2e == pytest.approx(tr.ttft + 3 * tick)


def test_overlap_loop_hides_the_host_work_behind_the_forward(tiny_llama_path, calibration):
    r = replica(tiny_llama_path, calibration, overlap=True)
    r.submit(SimRequest("a", list(range(5, 105)), 4, arrival=1.0))
    r.run_to_completion()
    tr = r.traces["a"]
    # the first token is out after its forward and its processing, as in the normal loop;
    # every later one a forward apart (the next forward was launched before processing)
    assert tr.ttft == pytest.approx(H_SCHED + forward(100) + H_PROC)
    assert tr.itl == pytest.approx([forward(1)] * 3)


def test_two_requests_share_decode_batches(tiny_llama_path, calibration):
    r = replica(tiny_llama_path, calibration, overlap=False)
    r.submit(SimRequest("a", list(range(5, 45)), 3, arrival=0.0))
    r.submit(SimRequest("b", list(range(7, 67)), 3, arrival=0.0))
    r.run_to_completion()
    a, b = r.traces["a"], r.traces["b"]
    prefill = H_SCHED + forward(100) + H_PROC  # both prompts in one batch
    assert a.ttft == pytest.approx(prefill) and b.ttft == pytest.approx(prefill)
    assert a.itl == pytest.approx([H_SCHED + forward(2) + H_PROC] * 2)


def test_a_request_arriving_mid_tick_waits_for_the_tick_to_end(tiny_llama_path, calibration):
    r = replica(tiny_llama_path, calibration, overlap=False)
    r.submit(SimRequest("a", list(range(5, 105)), 2, arrival=0.0))
    r.submit(SimRequest("b", list(range(200, 210)), 1, arrival=0.001))  # during a's prefill
    r.run_to_completion()
    first_tick_end = H_SCHED + forward(100) + H_PROC
    # b is taken in at the next loop iteration and prefilled with a's decode (mixed batch)
    assert r.traces["b"].ttft == pytest.approx(first_tick_end + H_SCHED + forward(1 + 10) + H_PROC - 0.001)


def test_max_concurrency_sends_the_next_request_when_one_finishes(tiny_llama_path, calibration):
    r = replica(tiny_llama_path, calibration, overlap=False)
    reqs = [ClientRequest(f"r{i}", list(range(5 + 30 * i, 25 + 30 * i)), 3, offset=0.0) for i in range(3)]
    sent = replay(r, reqs, start=0.0, max_concurrency=1)
    assert sent["r0"] == 0.0
    assert sent["r1"] == pytest.approx(r.traces["r0"].finished_at)
    assert sent["r2"] == pytest.approx(r.traces["r1"].finished_at)
    assert r.traces["r2"].ttft == pytest.approx(r.traces["r0"].ttft)  # each ran alone


def test_the_simulation_is_deterministic(tiny_llama_path, calibration):
    def run() -> list[tuple[float, ...]]:
        r = replica(tiny_llama_path, calibration, overlap=True, max_total_tokens=96, disable_radix_cache=True)
        for i in range(6):
            r.submit(SimRequest(f"r{i}", [5 + i, 6, 7, 8], 24, arrival=0.001 * i))
        r.run_to_completion()
        assert r.scheduler.counters.retractions_total > 0  # a small pool: retraction on the way
        return [tuple(t.emissions) for t in r.traces.values()]

    assert run() == run()
