"""A worker killed under the router: later requests succeed through the other, the
router's health metric shows it down, and it rejoins when it is restarted on its URL. A
stream open on the killed worker ends instead of hanging."""

from __future__ import annotations

import json

import httpx
import pytest
from router_testkit import scrape, wait_until

from sluice.runtime import constants as C

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def healthy_metric(router: str, worker: str) -> float | None:
    return scrape(router).get((C.METRIC_ROUTER_WORKER_HEALTHY, (("worker", worker),)))


def served_by(router: str, prompt: str) -> str:
    r = httpx.post(router + "/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": 3, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    return r.headers[C.ROUTER_WORKER_HEADER]


def test_a_killed_worker_is_routed_around_shown_down_and_rejoins(fleet):
    a, b = fleet.start_worker(), fleet.start_worker()
    with fleet.router("round-robin", [a, b]) as router:
        assert {served_by(router, f"warm {i}") for i in range(2)} == {a, b}

        # a stream held open by construction (thousands of tokens), then its worker dies
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                "temperature": 0, "stream": True}  # fmt: skip
        with httpx.stream("POST", router + "/v1/completions", json=body, timeout=60) as r:
            victim = r.headers[C.ROUTER_WORKER_HEADER]
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            fleet.kill_worker(victim)
            rest = [line for line in lines if line.startswith("data: ")]
        # the open stream ended (no hang) with an error event in OpenAI's shape
        assert "error" in json.loads(rest[-1][6:])

        survivor = a if victim == b else b
        # every later request succeeds, through the survivor (the victim is out, or the
        # request is retried around it)
        assert [served_by(router, f"after {i}") for i in range(6)] == [survivor] * 6
        wait_until(lambda: healthy_metric(router, victim) == 0, "the victim shown down")
        assert healthy_metric(router, survivor) == 1

        fleet.start_worker(victim)  # restarted on the same URL
        wait_until(lambda: healthy_metric(router, victim) == 1, "the victim to rejoin", 120)
        assert victim in {served_by(router, f"back {i}") for i in range(2)}
