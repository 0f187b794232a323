"""Adapter affinity with real runtime servers behind a real `sluice router`: the workers'
own /v1/models (adapters with `parent`) is what the router learns, and a worker without the
adapter would answer 404, so a 200 shows the request reached a holder. Oracle: the holder's
own greedy answer to the same request sent to it directly."""

from __future__ import annotations

import shlex

import httpx
import pytest
from lora_adapters import make_adapter
from router_testkit import scrape, wait_until

from sluice.runtime import constants as C

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

LORA_FLAGS = "--enable-lora --max-lora-rank 16 --max-loras 2"


def complete(url: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": [5, 17, 33, 42], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def router_adapters(router: str) -> dict[str, list[str]]:
    workers = httpx.get(router + C.ROUTER_WORKERS_PATH, timeout=5).json()["workers"]
    return {w["url"]: w["adapters"] for w in workers}


def test_requests_for_an_adapter_go_to_the_workers_that_serve_it(fleet, long_model, tmp_path):
    sql = make_adapter(long_model, tmp_path / "sql", rank=8, seed=1)
    chat = make_adapter(long_model, tmp_path / "chat", rank=8, seed=2)
    holder = fleet.start_worker(extra=f"{LORA_FLAGS} --lora-modules {shlex.quote(f'sql={sql}')}")
    other = fleet.start_worker(extra=LORA_FLAGS)
    base = httpx.get(holder + "/v1/models", timeout=10).json()["data"][0]["id"]
    with fleet.router("least-load", [holder, other]) as router:
        wait_until(lambda: "sql" in router_adapters(router)[holder], "the router reads sql")
        direct = complete(holder, "sql").json()["choices"][0]["token_ids"]
        for _ in range(4):
            resp = complete(router, "sql")
            assert resp.status_code == 200, resp.text
            assert resp.headers[C.ROUTER_WORKER_HEADER] == holder
            assert resp.json()["choices"][0]["token_ids"] == direct

        load = {"lora_name": "chat", "lora_path": str(chat)}
        assert httpx.post(other + "/v1/load_lora_adapter", json=load, timeout=60).status_code == 200
        wait_until(lambda: "chat" in router_adapters(router)[other], "the router reads chat")
        for _ in range(2):
            resp = complete(router, "chat")
            assert resp.status_code == 200 and resp.headers[C.ROUTER_WORKER_HEADER] == other

        missing = complete(router, "nope")  # no worker has it: least-load, the worker's 404
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        assert complete(router, base).status_code == 200  # the base model: the policy alone

        metrics = scrape(router)
        name = C.METRIC_ROUTER_DECISIONS_TOTAL

        def count(reason: str) -> float:
            return metrics[(name, (("policy", "least-load"), ("reason", reason)))]

        assert (count("adapter_affinity"), count("adapter_fallback"), count("least_load")) == (
            6.0, 1.0, 1.0)  # fmt: skip
