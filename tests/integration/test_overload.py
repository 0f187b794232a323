"""Overload is shed, not queued without bound (`--max-queued-requests`), and a request
past `--request-timeout` is answered and its pages freed, against a real server.

The admission test follows SGLang's own (`--max-running-requests 1 --max-queued-requests
1`, 10 concurrent requests: [200, 200, 503 x 8]), made deterministic by construction: the
scheduler is paused (hold gate) while the ten arrive, so none can finish and make room
before the last is decided.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from reliability_kit import make_padded_llama, scheduler_stats
from server_process import hold_env, serve

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8]


def generate_body(max_new_tokens: int = 8, **extra) -> dict:
    return {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                            "temperature": 0.0},
        **extra,
    }  # fmt: skip


def rejected_total(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + C.METRICS_PATH, timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == C.METRIC_REQUESTS_TOTAL and s.labels.get("status") == "rejected":
                return s.value
    raise AssertionError("no rejected series")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_padded_llama(tmp_path_factory.mktemp("padded-llama"))


def test_ten_concurrent_requests_get_two_200s_and_eight_immediate_503s(model, tmp_path):
    hold, env = hold_env(tmp_path / "hold")
    flags = ("--max-running-requests", "1", C.FLAG_MAX_QUEUED_REQUESTS, "1")
    with serve(model, tmp_path / "server.log", *flags, env=env) as srv:
        hold.pause()  # nothing runs, so nothing finishes, until all ten are decided

        async def send_all() -> list[tuple[int, float, httpx.Response]]:
            async with httpx.AsyncClient(timeout=120) as client:

                async def one() -> tuple[int, float, httpx.Response]:
                    t0 = time.monotonic()
                    r = await client.post(srv.url + "/generate", json=generate_body())
                    return r.status_code, time.monotonic() - t0, r

                tasks = [asyncio.ensure_future(one()) for _ in range(10)]
                # the eight refusals come back while the scheduler is still paused: the two
                # admitted cannot finish, so exactly two stay open
                refused = await _until_done(tasks, 8)
                assert len(refused) == 8, [t.done() for t in tasks]
                assert all(t.result()[0] == 503 for t in refused)
                info = await _info(client, srv.url)
                assert info["inflight_requests"] == 2, info
                hold.resume()
                return [await t for t in tasks]

        results = asyncio.run(send_all())
        codes = sorted(code for code, _, _ in results)
        assert codes == [200, 200] + [503] * 8
        for code, seconds, r in results:
            if code == 503:
                assert seconds < 1.0, seconds
                assert r.headers["Retry-After"] == "1"
                err = r.json()["error"]
                assert err["code"] == "server_overloaded" and err["type"] == "server_error"
                assert "--max-queued-requests" in err["message"]
            else:
                assert len(r.json()["output_ids"]) == 8
        assert rejected_total(srv.url) == 8
        srv.wait_idle()


async def _until_done(tasks: list[asyncio.Future], n: int, timeout: float = 60.0) -> list:
    """Wait (with a deadline) until `n` of `tasks` are done; returns the done ones."""
    deadline = time.monotonic() + timeout
    while sum(t.done() for t in tasks) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {sum(t.done() for t in tasks)} of {n} answered")
        await asyncio.wait([t for t in tasks if not t.done()], timeout=0.05,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    return [t for t in tasks if t.done()]


def test_at_most_one_runs_and_one_waits_while_the_rest_are_refused(model, tmp_path):
    """The same limits seen from the scheduler: one request running (frozen there by the
    hold gate), nine more at once: one is admitted, eight refused while the scheduler is
    frozen, and the scheduler's own counts never pass 1 running and 1 queued."""
    hold, env = hold_env(tmp_path / "hold")
    flags = ("--max-running-requests", "1", C.FLAG_MAX_QUEUED_REQUESTS, "1")
    with serve(model, tmp_path / "server.log", *flags, env=env) as srv:
        seen: list[tuple[int, int]] = []
        hold.arm(1)  # freeze once the first request has its first token
        first: dict[str, httpx.Response] = {}
        sender = threading.Thread(target=lambda: first.update(
            r=httpx.post(srv.url + "/generate", json=generate_body(16), timeout=120)))  # fmt: skip
        sender.start()
        held = hold.wait_held()
        assert (held["running_requests"], held["queue_requests"]) == (1, 0), held

        async def nine() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as client:
                tasks = [
                    asyncio.ensure_future(client.post(srv.url + "/generate", json=generate_body()))
                    for _ in range(9)
                ]
                refused = await _until_done(tasks, 8)  # while the scheduler is frozen
                assert [t.result().status_code for t in refused] == [503] * 8
                assert (await _info(client, srv.url))["inflight_requests"] == 2
                hold.release()
                while not all(t.done() for t in tasks):
                    stats = scheduler_stats(await _info(client, srv.url))
                    seen.append((stats["running_requests"], stats["queue_requests"]))
                    await asyncio.wait(tasks, timeout=0.02)
                return [(await t).status_code for t in tasks]

        codes = asyncio.run(nine())
        sender.join(120)
        assert first["r"].status_code == 200
        assert sorted(codes) == [200] + [503] * 8
        # an upper bound over what was sampled (the admission limit makes more impossible)
        assert max(r for r, _ in seen) <= 1 and max(q for _, q in seen) <= 1, seen
        srv.wait_idle()


async def _info(client: httpx.AsyncClient, url: str) -> dict:
    return (await client.get(url + C.SERVER_INFO_PATH)).json()


def test_a_request_past_the_timeout_gets_a_408_and_its_pages_are_freed(model, tmp_path):
    hold, env = hold_env(tmp_path / "hold")
    # the timeout must outlast one tiny prefill (the hold freezes at the first token)
    with serve(model, tmp_path / "server.log", C.FLAG_REQUEST_TIMEOUT, "2", env=env) as srv:
        hold.arm(1)  # the request is frozen mid-generation, holding KV pages
        result: dict[str, httpx.Response] = {}
        sender = threading.Thread(target=lambda: result.update(
            r=httpx.post(srv.url + "/generate", json=generate_body(64), timeout=120)))  # fmt: skip
        sender.start()
        held = hold.wait_held()
        assert held["running_requests"] == 1 and held["free_tokens"] < held["max_total_tokens"]
        sender.join(60)  # the client is answered while the scheduler is still frozen
        r = result["r"]
        assert r.status_code == 408, r.text
        assert r.json()["error"]["code"] == "request_timeout"
        hold.release()  # the abort reaches the scheduler: its pages go back
        info = srv.wait_idle()
        assert scheduler_stats(info)["free_tokens"] == scheduler_stats(info)["max_total_tokens"]
        ok = httpx.post(srv.url + "/generate", json=generate_body(4), timeout=60)
        assert ok.status_code == 200


def test_a_body_over_the_limit_is_a_413(model, tmp_path):
    with serve(model, tmp_path / "server.log", "--max-request-body-bytes", "4096") as srv:
        big = {"text": "x" * 5000}
        r = httpx.post(srv.url + "/generate", json=big, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        ok = httpx.post(srv.url + "/generate", json=generate_body(2), timeout=60)
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2
