"""Prefill/decode disaggregation end to end: a prefill server, a decode server and `sluice
router --pd-disaggregation` as real processes, against one plain server as the oracle
(the bundled SmolLM2 in fp32, forced).

Through the router, greedy answers equal the plain server's, token for token and logprob
for logprob, on prompts of 40 to 4000 tokens, streamed and not, with completions, chat,
tools and a JSON schema; the decode server computes no prompt position (its counters) and
received every position the prefill server sent. Then the faults, on one fleet: a decode
server whose pool holds one request at a time, a transfer that stalls (the prefill server
stopped with SIGSTOP while its decode server waits for KV), a prefill server killed while
its decode server waits, and a prompt both servers refuse: every client gets an answer or
an error in OpenAI's shape, and both pools return to all free.

The plain server and the P/D pair are asked at once (each server runs one torch thread):
the comparisons take half the time on two cores and see the same answers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from json_schemas import PERSON, WEATHER
from server_process import RunningServer, free_port, serve, wait_for

from sluice.runtime import constants as C
from sluice.runtime.workload.server import launched_server

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.bundled,
              pytest.mark.timeout(1500)]  # fmt: skip

FP32 = ("--dtype", "float32", "--torch-threads", "1", "--max-total-tokens", "16384")
T = TypeVar("T")
ROUTER_FLAGS = ["--health-interval", "0.2", "--health-timeout", "2",
                "--retry-backoff-initial", "0.2", "--retry-backoff-max", "1"]  # fmt: skip


@dataclass
class PD:
    router: str
    prefill: RunningServer
    decode: RunningServer


@contextmanager
def pd_fleet(model: Path, logs: Path, decode_extra: tuple[str, ...] = ()) -> Iterator[PD]:
    bootstrap = free_port()
    with ExitStack() as stack:
        p = stack.enter_context(serve(
            model, logs / "prefill.log", *FP32, "--disaggregation-mode", "prefill",
            "--disaggregation-bootstrap-port", str(bootstrap),
        ))  # fmt: skip
        d = stack.enter_context(serve(model, logs / "decode.log", *FP32, "--disaggregation-mode",
                                      "decode", *decode_extra))  # fmt: skip
        url = f"http://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "sluice.runtime", "router", "--host", "127.0.0.1",
                   "--port", url.rsplit(":", 1)[1], "--pd-disaggregation",
                   "--prefill", p.url, str(bootstrap), "--decode", d.url, *ROUTER_FLAGS]  # fmt: skip
        stack.enter_context(launched_server(command, url, 60, grace_s=10,
                                            log_path=logs / "router.log"))  # fmt: skip
        wait_healthy(url)
        yield PD(url, p, d)


def wait_healthy(router: str) -> None:
    wait_for(lambda: httpx.get(router + C.HEALTH_PATH, timeout=5).status_code == 200,
             timeout=60, what="the router to see both servers healthy")  # fmt: skip


def counter(url: str, name: str) -> float:
    for line in httpx.get(url + C.METRICS_PATH, timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {url}/metrics")


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=600)


def streamed(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Each call's result, the calls made at once."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def ask_both(plain: RunningServer, pd: PD, path: str, body: dict[str, Any]
             ) -> tuple[dict[str, Any], httpx.Response]:  # fmt: skip
    """The plain server's answer and the router's response, asked at once."""
    want, got = at_once(partial(post, plain.url, path, body), partial(post, pd.router, path, body))
    assert want.status_code == 200, want.text
    return want.json(), got


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A response minus what differs between any two responses (ids, times)."""
    return {k: v for k, v in body.items() if k not in ("id", "created", "system_fingerprint")}


@pytest.fixture(scope="module")
def fleet(
    bundled_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PD, RunningServer]]:
    logs = tmp_path_factory.mktemp("pd")
    with serve(bundled_model_path, logs / "plain.log", *FP32) as plain, \
            pd_fleet(bundled_model_path, logs) as pd:  # fmt: skip
        yield pd, plain


PROMPT_LENGTHS = (40, 400, 1500, 4000)


def test_greedy_completions_equal_a_plain_servers_from_40_to_4000_tokens(fleet):
    pd, plain = fleet
    computed_before = counter(pd.decode.url, "sluice_computed_prompt_tokens_total")
    sent_before = counter(pd.prefill.url, "sluice_disagg_sent_tokens_total")
    for n in PROMPT_LENGTHS:
        ids = [(7 * i + 11) % 40000 + 100 for i in range(n)]
        body = {"prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 2}
        want, got = ask_both(plain, pd, "/v1/completions", body)
        assert got.status_code == 200, got.text
        assert without_ids(got.json())["choices"] == want["choices"], n
        usage = ("prompt_tokens", "completion_tokens")  # cached tokens depend on each cache
        assert [got.json()["usage"][k] for k in usage] == [want["usage"][k] for k in usage]
        if n <= 1500:  # streamed too (the longest once is enough: it costs most)
            events = streamed(pd.router, "/v1/completions", body)
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
            assert text == want["choices"][0]["text"]
    total = sum(PROMPT_LENGTHS) + sum(n for n in PROMPT_LENGTHS if n <= 1500)
    # the decode server computed no prompt position; it received what the prefill server sent
    assert counter(pd.decode.url, "sluice_computed_prompt_tokens_total") == computed_before
    wait_for(lambda: counter(pd.prefill.url, "sluice_disagg_sent_tokens_total") - sent_before == total,
             timeout=30, what="the prefill server's sent counter")  # fmt: skip
    assert counter(pd.decode.url, "sluice_disagg_received_tokens_total") >= total


def test_chat_tools_and_json_schema_equal_a_plain_servers_streamed_and_not(fleet):
    pd, plain = fleet
    ask = [{"role": "user", "content": "What is the weather in Paris? " * 3}]
    bodies = [
        {"messages": [{"role": "user", "content": "Name three rivers of Europe."}],
         "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 3},
        {"messages": ask, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60,
         "temperature": 0},
        {"messages": [{"role": "user", "content": "Describe a person who lives in Paris."}],
         "max_tokens": 80, "temperature": 0,
         "response_format": {"type": "json_schema",
                             "json_schema": {"name": "p", "schema": PERSON, "strict": True}}},
    ]  # fmt: skip
    for body in bodies:
        want, got = ask_both(plain, pd, "/v1/chat/completions", body)
        assert got.status_code == 200, got.text
        got_choice, want_choice = got.json()["choices"][0], want["choices"][0]
        if want_choice["message"].get("tool_calls"):  # call ids are fresh per response
            for call in want_choice["message"]["tool_calls"] + got_choice["message"]["tool_calls"]:
                call.pop("id")
        assert got_choice == want_choice
        events = streamed(pd.router, "/v1/chat/completions", body)
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        text = "".join(d.get("content") or "" for d in deltas)
        args = "".join(
            c["function"].get("arguments") or "" for d in deltas for c in d.get("tool_calls") or []
        )
        if want_choice["message"].get("tool_calls"):
            assert args == "".join(
                c["function"]["arguments"] for c in want_choice["message"]["tool_calls"]
            )
        else:
            assert text == want_choice["message"]["content"]
    pd.prefill.wait_idle()
    pd.decode.wait_idle()


def test_n_choices_and_a_refused_prompt(fleet):
    pd, plain = fleet
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "n": 2}
    got = post(pd.router, "/v1/completions", body)
    assert got.status_code == 200, got.text
    assert [c["text"] for c in got.json()["choices"]] == [
        c["text"] for c in post(plain.url, "/v1/completions", body).json()["choices"]
    ]
    # both servers refuse a prompt past the context: the client gets the 400 in OpenAI's shape
    r = post(pd.router, "/v1/completions", {"prompt": [5] * 9000, "max_tokens": 4})
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    r = post(pd.decode.url, "/v1/completions", {"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "disaggregated_server"
    pd.prefill.wait_idle()
    pd.decode.wait_idle()


def test_a_small_decode_pool_a_stalled_transfer_and_a_killed_prefill_server(
    fleet, bundled_model_path, tmp_path
):
    """One fleet: the decode pool holds one request at a time (640 tokens) and waits 15 s
    for KV (more than the prefill server takes to compute four prompts at once, so only the
    stall below runs past it)."""
    _, plain = fleet
    decode_flags = ("--max-total-tokens", "640", "--disaggregation-transfer-timeout", "15")
    with pd_fleet(bundled_model_path, tmp_path, decode_extra=decode_flags) as pd:
        # four ~420-token prompts at once: the others wait for pages, then run
        bodies = [{"prompt": f"Story number {i}: " + "once upon a time " * 80, "max_tokens": 16,
                   "temperature": 0} for i in range(4)]  # fmt: skip
        got = at_once(*[lambda b=b: post(pd.router, "/v1/completions", b) for b in bodies])
        for body, r in zip(bodies, got, strict=True):
            assert r.status_code == 200, r.text
            want = post(plain.url, "/v1/completions", body).json()
            assert r.json()["choices"][0]["text"] == want["choices"][0]["text"]
        pd.prefill.wait_idle()
        pd.decode.wait_idle()

        # a stalled transfer: the prefill server stopped while its decode server waits
        os.killpg(pd.prefill.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            r = post(pd.router, "/v1/completions", {"prompt": "Hello there " * 30, "max_tokens": 8})
            waited = time.monotonic() - began
        finally:
            os.killpg(pd.prefill.proc.pid, signal.SIGCONT)
        assert r.status_code == 500, r.text
        message = r.json()["error"]["message"]
        assert "KV transfer failed" in message and "sent no KV within 15s" in message
        assert waited < 40
        # the decode side cancelled: the prefill side, running again, frees the prompt
        pd.decode.wait_idle()
        pd.prefill.wait_idle(timeout=60)
        assert counter(pd.decode.url, "sluice_disagg_failed_transfers_total") == 1
        wait_healthy(pd.router)

        # killed while its decode server waits: the router sees the prefill connection end
        # (or the decode server gives up at its timeout); either way an error, fast
        def reserved() -> bool:
            stats = pd.decode.info()["scheduler_stats"]
            return stats.get("free_tokens", 0) < stats.get("max_total_tokens", 0)

        with ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            future = pool.submit(post, pd.router, "/v1/completions",
                                 {"prompt": "Hello again " * 30, "max_tokens": 8})  # fmt: skip
            wait_for(reserved, timeout=60, what="the decode server to reserve pages")
            os.killpg(pd.prefill.proc.pid, signal.SIGKILL)
            r = future.result(timeout=120)
        assert r.status_code >= 500 and "error" in r.json(), r.text
        assert time.monotonic() - began < 30
        pd.decode.wait_idle(timeout=60)
