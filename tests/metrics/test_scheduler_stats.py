"""What the scheduler process publishes, and when: `StatsPublisher`, `ThroughputWindow`,
and the queue times the scheduler records at admission."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from sluice.runtime.ipc.messages import SamplingParams, SchedulerStats, TokenizedGenerateReq
from sluice.runtime.scheduler.loop import (
    KV_USAGE_STEP,
    STATS_INTERVAL_S,
    StatsPublisher,
    ThroughputWindow,
)
from sluice.runtime.scheduler.process import build_scheduler


# --- ThroughputWindow ---------------------------------------------------------------------------
def test_throughput_is_tokens_over_the_window():
    w = ThroughputWindow(window_s=5.0)
    assert w.update(0.0, 0) == 0.0  # one sample: no rate yet
    assert w.update(1.0, 100) == 100.0
    assert w.update(2.0, 300) == 150.0
    # at t=7 the oldest kept sample is t=2 (the newest at or before the window's start)
    assert w.update(7.0, 800) == pytest.approx(500 / 5)


def test_throughput_falls_to_zero_a_window_after_the_last_token():
    w = ThroughputWindow(window_s=5.0)
    for t in range(6):
        w.update(float(t), 50 * t)
    assert w.update(6.0, 250) > 0  # the last tokens are still inside the window
    for t in range(7, 11):
        w.update(float(t), 250)
    assert w.update(11.0, 250) == 0.0


# --- StatsPublisher -----------------------------------------------------------------------------
@dataclass
class FakeScheduler:
    current: SchedulerStats = field(default_factory=SchedulerStats)
    queue_times: list[float] = field(default_factory=list)
    counters: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(generated_tokens=0))

    def load_stats(self) -> SchedulerStats:
        return dataclasses.replace(self.current, queue_times=[], queue_prompt_tokens=0)

    def queue_prompt_tokens(self) -> int:
        return self.current.queue_prompt_tokens

    def take_queue_times(self) -> list[float]:
        times, self.queue_times = self.queue_times, []
        return times

    def take_transfer_seconds(self) -> list[float]:
        return []


def test_the_first_poll_publishes_then_only_changes_or_the_interval():
    sched, pub = FakeScheduler(), StatsPublisher()
    assert pub.poll(sched, 10.0) is not None
    assert pub.poll(sched, 10.1) is None  # nothing changed
    assert pub.poll(sched, 10.0 + STATS_INTERVAL_S) is not None  # the heartbeat


@pytest.mark.parametrize(
    "change",
    [
        {"queue_requests": 1},
        {"running_requests": 3},
        {"retractions_total": 1},
        {"kv_token_usage": KV_USAGE_STEP * 1.2},
    ],
)
def test_a_change_that_matters_is_published_at_once(change):
    sched, pub = FakeScheduler(), StatsPublisher()
    pub.poll(sched, 10.0)
    sched.current = dataclasses.replace(sched.current, **change)
    stats = pub.poll(sched, 10.01)
    assert stats is not None
    assert all(getattr(stats, k) == v for k, v in change.items())
    assert pub.poll(sched, 10.02) is None


def test_a_small_kv_usage_drift_waits_for_the_heartbeat():
    sched, pub = FakeScheduler(), StatsPublisher()
    pub.poll(sched, 10.0)
    sched.current = dataclasses.replace(sched.current, kv_token_usage=KV_USAGE_STEP * 0.3)
    assert pub.poll(sched, 10.01) is None
    assert pub.poll(sched, 11.0).kv_token_usage == KV_USAGE_STEP * 0.3


def test_queue_times_are_published_at_once_and_only_once():
    sched, pub = FakeScheduler(), StatsPublisher()
    pub.poll(sched, 10.0)
    sched.queue_times = [0.25, 0.5]
    assert pub.poll(sched, 10.01).queue_times == [0.25, 0.5]
    assert pub.poll(sched, 11.5).queue_times == []


def test_published_throughput_comes_from_the_generated_token_count():
    sched, pub = FakeScheduler(), StatsPublisher()
    pub.poll(sched, 10.0)
    sched.counters.generated_tokens = 40
    assert pub.poll(sched, 11.0).generation_throughput == pytest.approx(40.0)


# --- queue times measured by the real scheduler --------------------------------------------------
@pytest.fixture
def scheduler(tiny_llama_path):
    from sluice.runtime.engine.model_worker import ModelWorker
    from sluice.runtime.server_args import ServerArgs

    args = ServerArgs(
        model=str(tiny_llama_path), device="cpu", max_total_tokens=64, max_running_requests=4,
        init_new_token_ratio=0.05, disable_radix_cache=True,
    )  # fmt: skip
    return build_scheduler(args, ModelWorker(args, tiny_llama_path))


def submit(scheduler, rid: str, waited: float, max_new_tokens: int) -> None:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    arrival = time.time() - waited
    scheduler.handle(TokenizedGenerateReq(rid, [5, 6, 7, 8], params, arrival_time=arrival))


def test_the_scheduler_records_each_requests_wait_at_its_first_admission(scheduler):
    # 3 x (4 + 20) tokens do not fit the 64-token pool: the third is admitted a tick later
    # (running requests reserve little), and later some are retracted and re-admitted
    submit(scheduler, "a", waited=2.0, max_new_tokens=20)
    submit(scheduler, "b", waited=1.0, max_new_tokens=20)
    submit(scheduler, "c", waited=0.0, max_new_tokens=20)
    times: list[float] = []
    for _ in range(3):
        scheduler.step()
        times += scheduler.take_queue_times()
    assert sorted(times) == [
        pytest.approx(0.0, abs=0.5), pytest.approx(1.0, abs=0.5), pytest.approx(2.0, abs=0.5)
    ]  # fmt: skip
    while scheduler.has_work:
        scheduler.step()
        scheduler.take_output()
        times += scheduler.take_queue_times()
    assert scheduler.counters.retractions_total > 0
    assert len(times) == 3  # a re-admission after a retraction is not a second wait


def test_the_published_queue_prompt_tokens_are_the_waiting_prompts_positions(scheduler):
    """The prefill pool's HPA signal, read every tick but counted only when published."""
    for rid in "abc":
        submit(scheduler, rid, waited=0.0, max_new_tokens=20)  # 4-token prompts
    pub = StatsPublisher()
    first = pub.poll(scheduler, 10.0)
    assert (first.queue_requests, first.queue_prompt_tokens) == (3, 12)
    scheduler.step()  # admits what fits the 64-token pool: not all three
    later = pub.poll(scheduler, 10.0 + STATS_INTERVAL_S)
    assert 0 < later.queue_requests < 3
    assert later.queue_prompt_tokens == 4 * later.queue_requests
    assert scheduler.stats().queue_prompt_tokens == later.queue_prompt_tokens
