"""Two real runtime servers (the tiny random model) behind a real `sluice router`.

Oracles: the cached prompt tokens an ideal, unbounded radix cache on each worker would give
for the workers the requests were sent to (computed here from the tokenizer); the bytes the
worker itself streams; the worker's own /server_info and /metrics for aborts and pages.
"""

from __future__ import annotations

import json
import socket
from collections import defaultdict
from urllib.parse import urlsplit

import httpx
import pytest
from router_testkit import scrape, wait_until, worker_info

from benchmarks.serving.dataset import common_prefix_len, sample_multi_prefix_requests
from sluice.runtime import constants as C

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIXES, USES, PREFIX_TOKENS, OWN_TOKENS = 16, 2, 250, 12


@pytest.fixture(scope="module")
def tokenizer(long_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(long_model)


@pytest.fixture(scope="module")
def workers(fleet):
    return [fleet.start_worker(), fleet.start_worker()]


class History:
    """Every prompt sent to each worker, in order: what its radix cache can hold."""

    def __init__(self, tokenizer, workers: list[str]) -> None:
        self.tokenizer = tokenizer
        warmup = tokenizer.encode("Hello")  # the server's own warm-up generation
        self.sent: dict[str, list[list[int]]] = {w: [warmup] for w in workers}

    def ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def ideal_cached(self, worker: str, prompt: str) -> int:
        ids = self.ids(prompt)
        return max(common_prefix_len(ids, earlier) for earlier in self.sent[worker])

    def record(self, worker: str, prompt: str) -> None:
        self.sent[worker].append(self.ids(prompt))


@pytest.fixture(scope="module")
def history(tokenizer, workers) -> History:
    return History(tokenizer, workers)


def complete(url: str, prompt: str, max_tokens: int = 2) -> tuple[str, int]:
    """Non-streamed completion; (the worker that served it, its cached prompt tokens)."""
    r = httpx.post(url + "/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.headers.get(C.ROUTER_WORKER_HEADER, url), r.json()["usage"][
        "prompt_tokens_details"]["cached_tokens"]  # fmt: skip


def workload(tokenizer, seed: int):
    requests, ideal = sample_multi_prefix_requests(
        tokenizer, num_prompts=PREFIXES * USES, num_prefixes=PREFIXES, prefix_len=PREFIX_TOKENS,
        input_len=OWN_TOKENS, output_len=2, range_ratio=1.0, seed=seed,
    )  # fmt: skip
    hello = tokenizer.encode("Hello")[0]
    firsts = [tokenizer.encode(r.prompt)[0] for r in requests]
    assert hello not in firsts  # precondition: nothing starts like the warm-up prompt
    return requests, ideal


def run(router_url: str, requests, history: History) -> tuple[int, int, list[str]]:
    """Send in order, one at a time; (cached tokens, ideal for where they went, workers)."""
    cached = ideal_here = 0
    went = []
    for r in requests:
        worker, n = complete(router_url, r.prompt)
        ideal_here += history.ideal_cached(worker, r.prompt)
        history.record(worker, r.prompt)
        cached += n
        went.append(worker)
    return cached, ideal_here, went


def test_cache_aware_routing_reuses_at_least_85_percent_of_the_ideal(fleet, workers, history,
                                                                      tokenizer):  # fmt: skip
    requests, ideal = workload(tokenizer, seed=11)
    with fleet.router("cache-aware", workers) as router:
        cached, _, went = run(router, requests, history)
        metrics = scrape(router)
    assert ideal > 0.8 * PREFIXES * (USES - 1) * PREFIX_TOKENS  # the prefixes are long
    assert cached >= 0.85 * ideal, (cached, ideal)
    # every later use of a prefix went where its first use went ...
    by_prefix = defaultdict(set)
    for r, w in zip(requests, went, strict=True):
        by_prefix[r.prefix_id].add(w)
    assert all(len(ws) == 1 for ws in by_prefix.values())
    # ... and new prefixes were spread over both workers
    assert len(set(went)) == 2
    decisions = {dict(k[1]).get("reason"): v for k, v in metrics.items()
                 if k[0] == C.METRIC_ROUTER_DECISIONS_TOTAL}  # fmt: skip
    assert decisions["prefix_match"] == PREFIXES * (USES - 1)
    assert decisions["no_match"] == PREFIXES


def test_round_robin_reuses_only_what_alternating_workers_allow(fleet, workers, history,
                                                                tokenizer):  # fmt: skip
    requests, ideal = workload(tokenizer, seed=12)
    with fleet.router("round-robin", workers) as router:
        cached, ideal_for_assignment, went = run(router, requests, history)
    assert went == [workers[i % 2] for i in range(len(requests))]  # strictly in turn
    # the workers cached exactly what their own earlier prompts allow ...
    assert cached == ideal_for_assignment
    # ... which for this shuffled order is about half of the ideal
    assert 0.25 * ideal <= cached <= 0.75 * ideal, (cached, ideal)


def sse_bytes(url: str, body: dict) -> bytes:
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200
        return b"".join(r.iter_raw())


def test_streaming_through_the_router_is_byte_identical_to_the_worker(fleet, workers, history):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    with fleet.router("round-robin", workers) as router:
        for w in workers:  # cached everywhere first: both streams report the same counts
            complete(w, prompt, max_tokens=1)
            history.record(w, prompt)
        body = {"text": prompt, "rid": "same-id", "stream": True,
                "sampling_params": {"max_new_tokens": 24, "temperature": 0}}  # fmt: skip
        for _ in range(2):  # round robin: once through each worker
            with httpx.stream("POST", router + "/generate", json=body, timeout=120) as r:
                routed = b"".join(r.iter_raw())
                worker = r.headers[C.ROUTER_WORKER_HEADER]
            direct = sse_bytes(worker + "/generate", body)
            assert routed == direct
            assert routed.count(b"data: ") >= 24
        chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                "temperature": 0, "seed": 7, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        for w in workers:
            assert httpx.post(w + "/v1/chat/completions", json={**chat, "stream": False, "stream_options": None},
                              timeout=120).status_code == 200  # fmt: skip
        with httpx.stream("POST", router + "/v1/chat/completions", json=chat, timeout=120) as r:
            routed = b"".join(r.iter_raw())
            worker = r.headers[C.ROUTER_WORKER_HEADER]
        direct = sse_bytes(worker + "/v1/chat/completions", chat)
        # identical but for the response id and the creation time the worker stamps
        assert normalized(routed) == normalized(direct)
        assert routed.endswith(b"data: [DONE]\n\n")


def normalized(stream: bytes) -> list:
    events = []
    for block in stream.decode().split("\n\n"):
        if block.startswith("data: {"):
            event = json.loads(block[len("data: "):])
            event.pop("id"), event.pop("created")
            events.append(event)
        elif block:
            events.append(block)
    return events


def aborts(worker: str) -> float:
    return scrape(worker)[(C.METRIC_REQUESTS_TOTAL, (("model", worker_info(worker)[
        "served_model_name"]), ("status", "abort")))]  # fmt: skip


def idle_with_free_pool(worker: str) -> bool:
    info = worker_info(worker)
    stats = info.get("scheduler_stats", {})
    return (info["inflight_requests"] == 0 and stats.get("running_requests") == 0
            and stats.get("queue_requests") == 0
            and stats.get("free_tokens") == stats.get("max_total_tokens"))  # fmt: skip


def test_a_client_disconnect_mid_stream_aborts_the_workers_request(fleet, workers):
    with fleet.router("round-robin", workers) as router:
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                "temperature": 0, "stream": True}  # fmt: skip
        with httpx.stream("POST", router + "/v1/completions", json=body, timeout=120) as r:
            worker = r.headers[C.ROUTER_WORKER_HEADER]
            before = aborts(worker)
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            # the first event is here while the worker still generates: nothing is buffered
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
            assert worker_info(worker)["inflight_requests"] == 1
        # the client is gone: the router closed its connection, the worker aborted
        wait_until(lambda: aborts(worker) == before + 1, "the worker to count an abort")
        wait_until(lambda: idle_with_free_pool(worker), "the worker's pages back in the pool")
        assert scrape(router)[(C.METRIC_ROUTER_WORKER_IN_FLIGHT, (("worker", worker),))] == 0


def test_a_client_disconnect_before_a_non_streamed_answer_aborts_it_too(fleet, workers):
    with fleet.router("least-load", workers) as router:
        body = json.dumps({"prompt": "Numbers:", "max_tokens": 4000, "ignore_eos": True,
                           "temperature": 0}).encode()  # fmt: skip
        before = {w: aborts(w) for w in workers}
        parts = urlsplit(router)
        sock = socket.create_connection((parts.hostname, parts.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        busy = wait_until(
            lambda: [w for w in workers if worker_info(w)["inflight_requests"] == 1],
            "the request to reach a worker",
        )
        sock.close()
        worker = busy[0]
        wait_until(lambda: aborts(worker) == before[worker] + 1, "the worker to count an abort")
        wait_until(lambda: idle_with_free_pool(worker), "the worker's pages back in the pool")


def test_workers_expose_the_metric_names_the_inference_gateway_reads(workers):
    # gateway-api-inference-extension, docs/proposals/003-model-server-protocol: the vLLM
    # column of the metrics table (and the EPP's default flags)
    metrics = scrape(workers[0])
    names = {k[0] for k in metrics}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:cache_config_info"):  # fmt: skip
        assert name in names
    by_name = {k[0]: (dict(k[1]), v) for k, v in metrics.items()}
    labels, _ = by_name["vllm:cache_config_info"]
    info = worker_info(workers[0])
    assert labels["block_size"] == str(info["page_size"])
    assert labels["num_gpu_blocks"] == str(info["max_total_tokens"] // info["page_size"])
    assert by_name["vllm:num_requests_running"][1] == by_name[C.METRIC_RUNNING_REQUESTS][1]
    assert by_name["vllm:kv_cache_usage_perc"][1] == by_name[C.METRIC_KV_TOKEN_USAGE][1]
