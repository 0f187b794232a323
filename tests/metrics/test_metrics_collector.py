"""`MetricsCollector` fed by hand: what /metrics shows for a given sequence of updates."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from metrics_testkit import DOCUMENTED, Scrape, family_name

from sluice.runtime import constants as C
from sluice.runtime.ipc.messages import FinishReason, SchedulerStats
from sluice.runtime.metrics import MetricsCollector

MODEL = "m"


@dataclass
class Chunk:  # the fields of tokenizer_manager.GenerateChunk the collector reads
    token_ids: list[int]
    finished: FinishReason | None = None
    prompt_tokens: int = 7
    completion_tokens: int = 0
    cached_tokens: int = 3
    text: str = ""
    logprobs: list[float] = field(default_factory=list)


@dataclass
class State:
    created: float


class Clock:
    """Drives the collector's clock: `on_chunk` reads time.monotonic()."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        monkeypatch.setattr("sluice.runtime.metrics.requests.time.monotonic", lambda: self.now)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture
def collector() -> MetricsCollector:
    return MetricsCollector(MODEL, SchedulerStats(max_total_tokens=1024))


def read(collector: MetricsCollector) -> Scrape:
    return Scrape.parse(collector.render().decode())


def stream(collector: MetricsCollector, clock: Clock, rid: str, steps, finish: str | None):
    """Feed a request's chunks: `steps` = [(seconds since the previous chunk, n tokens)]."""
    state = State(created=clock.now)
    done = 0
    for i, (dt, n) in enumerate(steps):
        clock.now += dt
        done += n
        last = i == len(steps) - 1
        reason = FinishReason(finish) if last and finish else None
        chunk = Chunk(list(range(n)), reason, completion_tokens=done)
        collector.on_chunk(rid, chunk, state)
    return state


def test_every_documented_metric_is_exposed_with_its_type_and_the_model_label(collector):
    fams = read(collector).families
    for metric, kind in DOCUMENTED.items():
        fam = fams[family_name(metric)]
        assert fam.type == kind, metric
        assert fam.samples, metric
        assert all(s.labels.get(C.LABEL_MODEL) == MODEL for s in fam.samples), metric
    names = {s.name for f in fams.values() for s in f.samples}
    assert not [n for n in names if n.endswith("_created")]
    assert all(n.startswith(C.METRIC_PREFIX) for n in names)


def test_request_counter_has_every_status_from_the_start(collector):
    scrape = read(collector)
    for status in C.REQUEST_STATUSES:
        assert scrape.value(C.METRIC_REQUESTS_TOTAL, status=status) == 0


def test_finish_reasons_map_to_statuses(collector, clock):
    stream(collector, clock, "a", [(0.1, 1), (0.1, 1)], "stop")
    stream(collector, clock, "b", [(0.1, 1)], "length")
    stream(collector, clock, "c", [(0.1, 1)], "abort")  # the scheduler ended it: an error
    state = stream(collector, clock, "d", [(0.1, 1)], None)
    collector.on_abort("d", state)  # its client went away
    stream(collector, clock, "e", [(0.1, 1)], "error")  # an engine fault on its batch
    stream(collector, clock, "f", [(0.1, 1)], "timeout")  # past --request-timeout
    collector.on_reject(3)  # three choices refused by the admission limit
    scrape = read(collector)
    counts = {s: scrape.value(C.METRIC_REQUESTS_TOTAL, status=s) for s in C.REQUEST_STATUSES}
    assert counts == {
        "stop": 1, "length": 1, "abort": 1, "error": 2, "timeout": 1, "rejected": 3
    }  # fmt: skip
    assert collector.requests.num_tracked == 0


def test_latency_histograms_time_each_request(collector, clock):
    # first token after 0.5 s, then 2 tokens together 0.25 s later, then 1 after 0.0625 s
    stream(collector, clock, "a", [(0.5, 1), (0.25, 2), (0.0625, 1)], "length")
    s = read(collector)
    assert s.value(C.METRIC_TTFT_SECONDS + "_count") == 1
    assert s.value(C.METRIC_TTFT_SECONDS + "_sum") == 0.5
    assert s.value(C.METRIC_ITL_SECONDS + "_count") == 3  # completion_tokens - 1
    assert s.value(C.METRIC_ITL_SECONDS + "_sum") == 0.3125  # 0.125 + 0.125 + 0.0625
    assert s.value(C.METRIC_ITL_SECONDS + "_bucket", le="0.075") == 1
    assert s.value(C.METRIC_ITL_SECONDS + "_bucket", le="0.15") == 3
    assert s.value(C.METRIC_E2E_SECONDS + "_count") == 1
    assert s.value(C.METRIC_E2E_SECONDS + "_sum") == 0.8125


def test_tokens_arriving_with_the_first_have_no_gap(collector, clock):
    stream(collector, clock, "a", [(0.4, 3)], "length")
    s = read(collector)
    assert s.value(C.METRIC_ITL_SECONDS + "_count") == 2
    assert s.value(C.METRIC_ITL_SECONDS + "_sum") == 0


def test_token_counters_count_prompt_once_and_every_generated_token(collector, clock):
    stream(collector, clock, "a", [(0.1, 1), (0.1, 1), (0.1, 1)], "length")
    stream(collector, clock, "b", [(0.1, 2)], "stop")
    s = read(collector)
    assert s.value(C.METRIC_PROMPT_TOKENS_TOTAL) == 14
    assert s.value(C.METRIC_CACHED_TOKENS_TOTAL) == 6
    assert s.value(C.METRIC_GENERATION_TOKENS_TOTAL) == 5


def test_a_request_aborted_before_its_first_token_counts_no_tokens(collector, clock):
    state = State(created=clock.now)
    clock.now += 2.0
    collector.on_abort("gone", state)
    s = read(collector)
    assert s.value(C.METRIC_REQUESTS_TOTAL, status="abort") == 1
    assert s.value(C.METRIC_E2E_SECONDS + "_sum") == pytest.approx(2.0)
    assert s.value(C.METRIC_TTFT_SECONDS + "_count") == 0
    assert s.value(C.METRIC_PROMPT_TOKENS_TOTAL) == 0


def test_scheduler_gauges_mirror_the_latest_stats(collector):
    collector.on_stats(
        SchedulerStats(
            queue_requests=3, running_requests=4, kv_token_usage=0.5, new_token_ratio=0.7,
            retractions_total=2, retracted_tokens_total=90, prefix_cache_hit_ratio=0.25,
            generation_throughput=123.0, max_total_tokens=1024,
        )
    )  # fmt: skip
    s = read(collector)
    assert s.value(C.METRIC_QUEUE_REQUESTS) == 3
    assert s.value(C.METRIC_RUNNING_REQUESTS) == 4
    assert s.value(C.METRIC_KV_TOKEN_USAGE) == 0.5
    assert s.value(C.METRIC_NEW_TOKEN_RATIO) == 0.7
    assert s.value(C.METRIC_RETRACTIONS_TOTAL) == 2
    assert s.value(C.METRIC_RETRACTED_TOKENS_TOTAL) == 90
    assert s.value(C.METRIC_PREFIX_CACHE_HIT_RATIO) == 0.25
    assert s.value(C.METRIC_GENERATION_THROUGHPUT) == 123
    assert s.value(C.METRIC_MAX_TOTAL_TOKENS) == 1024


def test_mirrored_counters_never_decrease(collector):
    collector.on_stats(SchedulerStats(retractions_total=5, retracted_tokens_total=50))
    collector.on_stats(
        SchedulerStats(retractions_total=3, retracted_tokens_total=10, queue_requests=1)
    )
    s = read(collector)
    assert s.value(C.METRIC_RETRACTIONS_TOTAL) == 5
    assert s.value(C.METRIC_RETRACTED_TOKENS_TOTAL) == 50
    assert s.value(C.METRIC_QUEUE_REQUESTS) == 1  # gauges follow the latest message


def test_queue_times_from_the_scheduler_fill_the_histogram(collector):
    collector.on_stats(SchedulerStats(queue_times=[0.002, 0.3]))
    collector.on_stats(SchedulerStats(queue_times=[]))
    collector.on_stats(SchedulerStats(queue_times=[1.5]))
    s = read(collector)
    assert s.value(C.METRIC_QUEUE_TIME_SECONDS + "_count") == 3
    assert s.value(C.METRIC_QUEUE_TIME_SECONDS + "_sum") == pytest.approx(1.802)
    assert s.value(C.METRIC_QUEUE_TIME_SECONDS + "_bucket", le="0.5") == 2


def test_a_malformed_update_is_logged_not_raised(collector, caplog):
    collector.on_chunk("x", object(), State(0.0))  # no fields at all
    collector.on_stats(SchedulerStats(queue_times=None))  # type: ignore[arg-type]
    assert sum("metrics: cannot record" in m for m in caplog.messages) == 2
    read(collector)


def test_attach_mirrors_the_managers_latest_stats_and_listens(collector):
    class TM:
        stats = SchedulerStats(running_requests=2, max_total_tokens=1024)
        listeners: list = []

    tm = TM()
    collector.attach(tm)
    assert tm.listeners == [collector]
    assert read(collector).value(C.METRIC_RUNNING_REQUESTS) == 2


def test_the_handler_serves_prometheus_text(collector):
    response = asyncio.run(collector.handler())
    assert response.media_type.startswith("text/plain; version=")
    assert Scrape.parse(response.body.decode()).families[C.METRIC_QUEUE_REQUESTS]
