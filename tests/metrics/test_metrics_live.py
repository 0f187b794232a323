"""GET /metrics on a live runtime (`python -m sluice.runtime serve`, tiny random Llama, a
1024-token KV pool, 4 request slots): every documented metric, and values that move the
way the scheduler does while it serves.

Requests go through the native /generate with token ids, greedy, ignore_eos, so their
lengths are exact. A state a test must see is observed with the scheduler frozen in it
(`load_held_at`: the hold gate), never by hoping a scrape lands while it lasts; /metrics is
also scraped every 20 ms while the requests run, for the checks that hold at every scrape.
"""

from __future__ import annotations

import httpx
import pytest
from metrics_testkit import (
    DOCUMENTED,
    KV_POOL_TOKENS,
    MODEL,
    REQUEST_SLOTS,
    eventually,
    family_name,
    generate,
    load_held_at,
    run_load,
    scrape,
)

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

Q, RUN, KV = C.METRIC_QUEUE_REQUESTS, C.METRIC_RUNNING_REQUESTS, C.METRIC_KV_TOKEN_USAGE


def request(i: int, max_new_tokens: int) -> dict:
    """A 5-token prompt of its own (no shared prefix) and exactly `max_new_tokens` tokens."""
    prompt = [10 + 7 * i % 400, 11, 12, 13, 14 + i % 50]
    return {"input_ids": prompt, "max_new_tokens": max_new_tokens, "ignore_eos": True}


@pytest.fixture(autouse=True)
def idle_before_and_after(runtime):
    """Each test starts and ends with an idle scheduler and an empty KV pool."""

    def idle() -> bool:
        s = scrape(runtime.url)
        return s.value(Q) == 0 and s.value(RUN) == 0 and s.value(KV) == 0

    eventually(idle, timeout=15)
    yield
    eventually(idle, timeout=15)


def test_every_documented_metric_has_its_type_and_the_model_label(runtime):
    fams = scrape(runtime.url).families
    for metric, kind in DOCUMENTED.items():
        fam = fams[family_name(metric)]
        assert fam.type == kind, metric
        assert fam.samples and all(s.labels[C.LABEL_MODEL] == MODEL for s in fam.samples)
    assert scrape(runtime.url).value(C.METRIC_MAX_TOTAL_TOKENS) == KV_POOL_TOKENS


def test_server_info_and_the_startup_log_give_the_pool_size(runtime):
    info = httpx.get(runtime.url + C.SERVER_INFO_PATH, timeout=10).json()
    assert info["max_total_tokens"] == KV_POOL_TOKENS
    assert info["max_running_requests"] == REQUEST_SLOTS
    assert "serving tiny-llama" in runtime.log.read_text()
    assert f"KV pool {KV_POOL_TOKENS} tokens" in runtime.log.read_text()


def test_running_equals_the_batch_and_kv_usage_rises_and_falls_back(runtime, scrape_history):
    # 3 x (5 + 320) tokens fit the pool: all three run together, none waits
    held, run = load_held_at(runtime, [request(i, 320) for i in range(3)], 200, 3, scrape_history)
    # frozen once all three have 200 output tokens: at least 3 x 205 of 1024 slots in use
    assert (held.value(RUN), held.value(Q)) == (3, 0)
    assert held.value(KV) >= 0.5
    assert [r["meta_info"]["completion_tokens"] for r in run.responses] == [320] * 3
    eventually(lambda: scrape(runtime.url).value(KV) == 0)


def test_queue_is_non_zero_while_requests_wait_for_a_slot(runtime, scrape_history):
    # 6 requests, 4 slots; 4 x (5 + 240) tokens fit the pool, so nothing is retracted
    held, run = load_held_at(runtime, [request(i, 240) for i in range(6)], 100, 4, scrape_history)
    assert (held.value(RUN), held.value(Q)) == (REQUEST_SLOTS, 2)
    timeline = run.timeline(Q, RUN, KV)
    assert max(run.series(RUN)) <= REQUEST_SLOTS, timeline
    assert run.scrapes[-1].value(C.METRIC_RETRACTIONS_TOTAL) == run.scrapes[0].value(
        C.METRIC_RETRACTIONS_TOTAL
    )
    assert [r["meta_info"]["completion_tokens"] for r in run.responses] == [240] * 6


def test_retractions_increase_when_the_pool_runs_out(runtime, scrape_history):
    # 4 x (5 + 400) = 1620 tokens of outputs against a 1024-token pool
    before = scrape(runtime.url)
    held, run = load_held_at(runtime, [request(i, 400) for i in range(4)], 220, 4, scrape_history)
    # frozen once all four have 220 output tokens, before the pool runs out (at 251 each)
    # each holds its prompt and every output token but the newest (its KV comes with the next
    # forward; in the overlap loop that forward is already launched)
    assert held.value(KV) >= 4 * (5 + 219) / KV_POOL_TOKENS and held.value(RUN) == 4
    assert held.value(C.METRIC_GENERATION_THROUGHPUT) > 0
    after = scrape(runtime.url)
    assert after.value(C.METRIC_RETRACTIONS_TOTAL) > before.value(C.METRIC_RETRACTIONS_TOTAL)
    assert after.value(C.METRIC_RETRACTED_TOKENS_TOTAL) > before.value(
        C.METRIC_RETRACTED_TOKENS_TOTAL
    )
    assert [r["meta_info"]["completion_tokens"] for r in run.responses] == [400] * 4


def test_histograms_and_counters_count_every_finished_request(runtime, scrape_history):
    before = scrape(runtime.url)
    run = run_load(runtime.url, [request(i, 8 + i) for i in range(5)], record=scrape_history)
    metas = [r["meta_info"] for r in run.responses]
    n = len(metas)

    def delta(sample: str, **labels: str) -> float:
        return scrape(runtime.url).value(sample, **labels) - before.value(sample, **labels)

    assert delta(C.METRIC_REQUESTS_TOTAL, status="length") == n
    assert delta(C.METRIC_E2E_SECONDS + "_count") == n
    assert delta(C.METRIC_TTFT_SECONDS + "_count") == n
    assert delta(C.METRIC_ITL_SECONDS + "_count") == sum(m["completion_tokens"] - 1 for m in metas)
    assert delta(C.METRIC_GENERATION_TOKENS_TOTAL) == sum(m["completion_tokens"] for m in metas)
    assert delta(C.METRIC_PROMPT_TOKENS_TOTAL) == sum(m["prompt_tokens"] for m in metas)
    assert delta(C.METRIC_CACHED_TOKENS_TOTAL) == sum(m["cached_tokens"] for m in metas)
    # the queue times travel with the scheduler's next stats message
    eventually(lambda: delta(C.METRIC_QUEUE_TIME_SECONDS + "_count") == n)


def test_finish_statuses_stop_length_and_abort_are_counted(runtime):
    prompt = [30, 31, 32, 33]
    first = generate(runtime.url, prompt, max_new_tokens=1, ignore_eos=True)["output_ids"][0]
    before = scrape(runtime.url)
    stopped = generate(runtime.url, prompt, max_new_tokens=20, stop_token_ids=[first])
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop"
    # a streaming client that leaves after the first event
    body = {
        "input_ids": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0.0},
    }
    with httpx.stream("POST", runtime.url + "/generate", json=body, timeout=60) as r:
        next(r.iter_lines())

    def counted() -> dict[str, float]:
        s = scrape(runtime.url)
        return {
            st: s.value(C.METRIC_REQUESTS_TOTAL, status=st)
            - before.value(C.METRIC_REQUESTS_TOTAL, status=st)
            for st in C.REQUEST_STATUSES
        }

    expected = {"stop": 1, "length": 0, "abort": 1, "error": 0, "timeout": 0, "rejected": 0}
    eventually(lambda: counted() == expected)


def test_counters_never_decrease_between_scrapes(runtime, scrape_history):
    run_load(runtime.url, [request(i, 30) for i in range(5)], record=scrape_history)
    assert len(scrape_history) > 20
    previous: dict = {}
    for s in scrape_history:
        for key, value in s.counter_samples().items():
            assert value >= previous.get(key, 0.0), key
            previous[key] = value
