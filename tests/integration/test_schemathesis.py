"""Hostile input generated from the server's own OpenAPI document: schemathesis draws
request bodies for the generation routes (completions, chat, /generate, responses),
/tokenize and /detokenize from the schemas `/openapi.json` declares (valid ones and ones
that break them), sends them to a real server, and the server answers none of them with a 5xx, stays up, and ends with its
KV pool all free.

The oracle is the HTTP contract itself: any 5xx is a server fault (a 503 would only be
right for overload, and this test never overloads: it sends one request at a time).
Bounded: a fixed number of cases per route, derandomized (the same cases every run).
"""

from __future__ import annotations

from collections import Counter

import httpx
import jsonschema
import pytest
from json_schemas import body_schema
from reliability_kit import make_padded_llama
from server_process import serve

from sluice.runtime import constants as C

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate", "/v1/responses", "/tokenize",
          "/detokenize")
CASES_PER_ROUTE = 30  # per route and mode


def fuzz_route(schema, path: str, mode: str, seen: Counter, served: list) -> None:
    """`CASES_PER_ROUTE` cases for `path`: bodies that match its schema ('positive') or
    break it ('negative': wrong types, missing required fields, values out of bounds)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode

    operation = schema[path]["POST"]

    @settings(
        max_examples=CASES_PER_ROUTE,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report the first failure
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(GenerationMode(mode)))
    def one(case) -> None:
        r = case.call(timeout=120)
        seen[(path, mode, r.status_code)] += 1
        assert r.status_code < 500, (path, mode, case.body, r.status_code, r.text[:500])
        if mode == "negative" and r.status_code < 400:
            served.append((path, case.body))

    one()


def test_generated_requests_never_get_a_5xx_and_the_pool_ends_free(tmp_path):
    import schemathesis

    model = make_padded_llama(tmp_path / "padded-llama")
    with serve(model, tmp_path / "server.log") as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        seen: Counter = Counter()
        served_negatives: list = []
        for path in ROUTES:
            for mode in ("positive", "negative"):
                fuzz_route(schema, path, mode, seen, served_negatives)
        print("status codes by route and mode:", dict(sorted(seen.items())))
        for path in ROUTES:
            assert sum(n for (p, _, _), n in seen.items() if p == path) >= CASES_PER_ROUTE
        # the generated cases reach the engine (200s) and broken ones are refused (4xx)
        assert any(code == 200 for _, _, code in seen)
        # a 'negative' case the server serves must be one the generator failed to break
        # (it happens: not every mutation leaves the schema): the document's own validator
        # accepts it
        doc = httpx.get(srv.url + "/openapi.json", timeout=10).json()
        for path, body in served_negatives:
            assert jsonschema.Draft202012Validator(body_schema(doc, path)).is_valid(body), body
        assert sum(n for (_, mode, code), n in seen.items() if mode == "negative" and code >= 400)
        assert srv.proc.poll() is None, srv.log_tail()
        assert httpx.get(srv.url + C.HEALTH_PATH, timeout=10).status_code == 200
        srv.wait_idle(timeout=120)
