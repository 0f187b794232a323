"""The simulator's P/D pair: the real prefill and decode schedulers on two virtual clocks,
joined by a transfer of known cost. Times are exact where the costs are chosen; the decode
replica computes no prompt position; every page is back on both sides at the end."""

from __future__ import annotations

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.sim.client import ClientRequest, replay
from sluice.runtime.sim.cost_model import LinearCost
from sluice.runtime.sim.pd import SimPDPair, TransferCost
from sluice.runtime.sim.replica import SimReplica, SimRequest

H_SCHED, H_PROC = 0.002, 0.001
F_BASE, F_TOKEN = 0.030, 0.0001  # forward: 30 ms + 0.1 ms per computed position


@pytest.fixture(scope="module")
def calibration(tiny_llama_path):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    return synthetic_calibration(
        worker, LinearCost(("one", "tokens"), (F_BASE, F_TOKEN)), H_SCHED, H_PROC
    )


def forward(tokens: int) -> float:
    return F_BASE + F_TOKEN * tokens


def pair(tiny_llama_path, calibration, gbps: float = 1.0, **flags: object) -> SimPDPair:
    cost = TransferCost(calibration.model.bytes_per_token, gbps, 0.002)
    return SimPDPair(
        server_args(tiny_llama_path, disable_overlap_schedule=True, **flags), calibration, cost
    )


def assert_whole(p: SimPDPair) -> None:
    for r in p.replicas:
        r.check_integrity()
        assert not r.scheduler.live_requests()
        assert r.scheduler.cache.available_size == r.scheduler.cache.total_tokens


def test_the_first_token_comes_after_the_prefill_and_the_transfer(tiny_llama_path, calibration):
    p = pair(tiny_llama_path, calibration)
    p.submit(SimRequest("a", list(range(5, 105)), 4, arrival=1.0))
    p.run_to_completion()
    tr = p.traces["a"]
    transfer = p.transfer.cost.seconds(100)
    assert transfer > 0.002  # the bytes count
    assert tr.ttft == pytest.approx(H_SCHED + forward(100) + transfer)
    assert tr.itl == pytest.approx([H_SCHED + forward(1) + H_PROC] * 3)  # decodes only
    assert tr.output_tokens == 4 and tr.finish_reason == "length"
    assert p.decode.stats().computed_prompt_tokens_total == 0
    assert p.prefill.stats().disagg_sent_tokens_total == 100
    assert p.decode.stats().disagg_received_tokens_total == 100
    assert_whole(p)


def test_long_prompts_stop_stalling_the_decodes_of_others(tiny_llama_path, calibration):
    """The point of P/D: a long prompt arriving mid-decode delays a plain server's next
    token by its whole prefill; the pair's decode replica never computes it."""
    short = ClientRequest("short", list(range(5, 25)), 40, 0.0)
    long = ClientRequest("long", list(range(30, 510)), 4, 0.2)  # the tiny model's context: 512
    plain = SimReplica(server_args(tiny_llama_path, disable_overlap_schedule=True), calibration)
    replay(plain, [short, long], 0.0)
    pd = pair(tiny_llama_path, calibration, gbps=100.0)
    replay(pd, [short, long], 0.0)
    assert max(pd.traces["short"].itl) < H_SCHED + forward(2) + H_PROC + 1e-9
    assert max(plain.traces["short"].itl) > H_SCHED + forward(480) + H_PROC - 1e-9
    assert pd.traces["long"].ttft > plain.traces["long"].ttft  # it pays for the transfer
    assert_whole(pd)


def test_a_busy_burst_completes_deterministically(tiny_llama_path, calibration):
    def run() -> list[tuple[float | None, float | None]]:
        pd = pair(tiny_llama_path, calibration, max_total_tokens=2048)
        reqs = [
            ClientRequest(f"r{i}", list(range(5 + i, 305 + i)), 24, 0.01 * i) for i in range(12)
        ]
        replay(pd, reqs, 0.0)
        assert all(pd.traces[r.rid].output_tokens == 24 for r in reqs)
        assert_whole(pd)
        return [(pd.traces[r.rid].ttft, pd.traces[r.rid].e2e) for r in reqs]

    assert run() == run()
