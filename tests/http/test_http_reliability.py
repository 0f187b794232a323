"""Hostile input, overload and engine failures as a client sees them, against the app with
a scripted TokenizerManager: every refusal is a 4xx/5xx in OpenAI's error shape, never a
500 from a crash, and nothing that is refused reaches the scheduler."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM, sse_events
from json_schemas import body_schema
from test_http_errors import assert_error

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.entrypoints.json_body import MAX_JSON_DEPTH
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.server_args import ServerArgs

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
ROUTES = {  # long enough for the whole scripted reply (and its finish)
    "/v1/completions": {"prompt": "hi", "max_tokens": 16},
    "/v1/chat/completions": CHAT,
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 16}},
}


def raw_post(client, path, raw: bytes):
    return client.post(path, content=raw, headers={"Content-Type": "application/json"})


# --- token ids against the model's vocabulary ------------------------------------------------
@pytest.fixture
def small_vocab_tm(tokenizer):
    """A model whose embedding is smaller than its tokenizer (ids past it crashed it)."""
    return FakeTM(tokenizer, vocab_size=300)


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": [5, 400]}, "prompt"),
        ("/v1/completions", {"prompt": [[5], [6, 299, 300]]}, "prompt"),
        ("/v1/chat/completions", {**CHAT, "input_ids": [5, 400]}, "input_ids"),
        ("/generate", {"input_ids": [5, 400]}, "input_ids"),
        ("/v1/completions", {"prompt": "hi", "stop_token_ids": [300], "min_tokens": 1},
         "stop_token_ids"),
        ("/v1/chat/completions", {**CHAT, "stop_token_ids": [10**6]}, "stop_token_ids"),
        ("/generate", {"text": "hi", "sampling_params": {"stop_token_ids": [300]}},
         "sampling_params.stop_token_ids"),
    ],
)  # fmt: skip
def test_token_ids_are_checked_against_the_models_vocab_size(tokenizer, small_vocab_tm, path,
                                                            body, param):  # fmt: skip
    assert len(tokenizer) > 400  # the tokenizer knows these ids; the model does not
    with TestClient(build_app(small_vocab_tm, ServerArgs(model="/m"))) as c:
        err = assert_error(c.post(path, json=body), 400, param=param)
    assert "[0, 300)" in err["message"]
    assert small_vocab_tm.requests == []


def test_ids_below_a_padded_vocab_size_are_accepted(tokenizer):
    tm = FakeTM(tokenizer, vocab_size=len(tokenizer) + 64)  # padded embedding
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as c:
        r = c.post("/v1/completions", json={"prompt": [5, len(tokenizer) + 10], "max_tokens": 2})
    assert r.status_code == 200, r.text


# --- bodies no layer behind the parser can take -----------------------------------------------
@pytest.mark.parametrize("path", list(ROUTES))
@pytest.mark.parametrize(
    "raw, what",
    [
        (b'{"prompt": "a", "temperature": NaN}', "NaN"),
        (b'{"prompt": "a", "top_p": Infinity}', "Infinity"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b'{"a": ' * 200 + b"1" + b"}" * 200, "nested"),
        (b'{"prompt": "\\ud800 lone"}', "surrogate"),
        (b'{"messages": [{"role": "user", "content": "x\\udfff"}], "text": "\\udfff"}',
         "surrogate"),
        (b'{"prompt": "a", "\\ud83d": 1}', "surrogate"),
        (b"\xff\xfe\x00garbage", "Malformed"),
    ],
)  # fmt: skip
def test_json_that_is_not_json_or_not_unicode_is_a_400(client, tm, path, raw, what):
    err = assert_error(raw_post(client, path, raw), 400, code="invalid_json")
    assert what in err["message"] or (what == "nested" and "nested" in err["message"])
    assert tm.requests == []


def test_nesting_within_the_limit_is_read(client, tm):
    kwargs: object = {"x": 1}
    for _ in range(MAX_JSON_DEPTH - 3):
        kwargs = {"x": kwargs}
    r = client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": kwargs})
    assert r.status_code == 200, r.text


def test_a_valid_surrogate_pair_is_just_a_character(client, tm):
    r = raw_post(client, "/v1/completions", b'{"prompt": "hi \\ud83d\\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": -1e30}, "temperature"),
        ({"top_p": 1e30}, "top_p"),
        ({"frequency_penalty": 1e30}, "frequency_penalty"),
        ({"presence_penalty": -1e30}, "presence_penalty"),
        ({"min_p": 1e30}, "min_p"),
        ({"repetition_penalty": -1e30}, "repetition_penalty"),
        ({"seed": 2**64}, "seed"),
        ({"priority": 10**30}, "priority"),  # past 64 bits: cannot even be sent on
        ({"top_k": 10**30}, "top_k"),
        ({"max_tokens": 10**30}, "max_tokens"),
        ({"min_tokens": 2**63}, "min_tokens"),
        ({"n": 10**5}, "n"),
        ({"logprobs": True, "top_logprobs": 10**6}, "top_logprobs"),
    ],
)
def test_out_of_range_numbers_are_a_400_naming_the_field(client, tm, fields, param):
    assert_error(client.post("/v1/chat/completions", json={**CHAT, **fields}), 400, param=param)
    assert tm.requests == []


def test_a_number_that_parses_as_infinity_is_a_400(client, tm):
    r = raw_post(client, "/v1/chat/completions",
                 b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}')
    assert_error(r, 400, param="temperature")


def test_huge_logprobs_on_completions_is_a_400(client, tm):
    r = client.post("/v1/completions", json={"prompt": "a", "logprobs": 10**6})
    assert_error(r, 400, param="logprobs")


@pytest.mark.parametrize("fields", [{"temperature": 1e30}, {"repetition_penalty": 1e30}])
def test_huge_but_valid_sampling_values_are_served(client, tm, fields):
    assert client.post("/v1/chat/completions", json={**CHAT, **fields}).status_code == 200


# --- engine failures and limits, as the client sees them ---------------------------------------
@pytest.mark.parametrize("path", list(ROUTES))
def test_an_engine_fault_is_a_500_naming_the_cause(client, tm, path):
    tm.finish = FinishReason("error", message="the engine failed on this request's batch: X")
    err = assert_error(client.post(path, json=ROUTES[path]), 500, code="engine_error")
    assert err["message"] == "the engine failed on this request's batch: X"


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_timeout_is_a_408(client, tm, path):
    tm.finish = FinishReason("timeout", message="past --request-timeout")
    r = client.post(path, json=ROUTES[path])
    assert r.status_code == 408, r.text
    assert r.json()["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_stream_ends_with_an_error_event_and_done(client, tm, path):
    tm.finish = FinishReason("error", message="the engine is down")
    with client.stream("POST", path, json={**ROUTES[path], "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["message"] == "the engine is down"
    assert events[-2]["error"]["code"] == "engine_error"


@pytest.mark.parametrize("stream", [False, True])
def test_over_the_admission_limit_is_a_503_with_retry_after_for_all_choices(tokenizer, stream):
    tm = FakeTM(tokenizer, capacity=3)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as c:
        tm.live["busy"] = asyncio.Event()  # one request in flight: three more do not fit
        r = c.post("/v1/chat/completions", json={**CHAT, "n": 3, "stream": stream})
        assert_error(r, 503, code="server_overloaded")
        assert r.headers["Retry-After"] == "1"
        assert tm.requests == [] and tm.rejected == 3  # none of the three choices started
        assert c.post("/v1/chat/completions", json={**CHAT, "n": 2}).status_code == 200


def test_more_choices_than_the_server_ever_admits_is_a_400_not_a_503(tokenizer):
    """Five choices where at most four are ever admitted: a 503 would have the client
    retry for ever. (n past 128 is refused by the schema already.)"""
    tm = FakeTM(tokenizer, capacity=4)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "n": 5})
        assert_error(r, 400, param="n")
        assert "admits at most 4" in r.json()["error"]["message"]
        assert tm.requests == [] and tm.rejected == 0


def test_a_body_over_the_limit_is_a_413_before_it_is_read(tokenizer):
    tm = FakeTM(tokenizer)
    with TestClient(build_app(tm, ServerArgs(model="/m", max_request_body_bytes=1000))) as c:
        body = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        err = assert_error(c.post("/v1/chat/completions", json=body), 413,
                           code="request_too_large")  # fmt: skip
        assert "at most 1000 bytes" in err["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"x" * 200
            yield b'"}'

        r = c.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
        assert_error(r, 413, code="request_too_large")
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert len(tm.requests) == 1


def test_the_api_key_guards_the_openapi_document_too(tokenizer):
    with TestClient(build_app(FakeTM(tokenizer), ServerArgs(api_key="sekret"))) as c:
        assert c.get("/openapi.json").status_code == 401
        assert c.get("/health/live").status_code == 200
        ok = c.get("/openapi.json", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200


# --- the OpenAPI document ---------------------------------------------------------------------
GOOD = {
    "/v1/completions": [
        {"prompt": "hi"},
        {"prompt": [1, 2, 3], "max_tokens": 4, "stop": "x", "temperature": 0.5, "n": 2},
        {"prompt": ["a", [4, 5]], "stop": ["x", "y"], "logprobs": 2},
    ],
    "/v1/chat/completions": [
        CHAT,
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "top_k": 5},
        {**CHAT, "response_format": {"type": "json_object"}, "logprobs": True, "top_logprobs": 2},
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
         "tool_choice": "none"},
    ],
    "/generate": [
        {"text": "hi"},
        {"input_ids": [[1, 2], [3]], "sampling_params": [{"max_new_tokens": 3}, {"n": 2}]},
    ],
}  # fmt: skip
BAD = {
    "/v1/completions": [{}, {"prompt": "a", "nonsense": 1}, {"prompt": "a", "n": 0}],
    "/v1/chat/completions": [{"messages": []}, {**CHAT, "temperature": "hot"}],
    "/generate": [
        {"text": "a", "unknown_field": True},
        {},  # neither text nor input_ids
        {"text": "a", "input_ids": [1]},  # both
        {"text": ""},
        {"input_ids": []},
        {"input_ids": [1, 10**6]},  # past the vocab
    ],
}


def openapi(client) -> dict:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


@pytest.mark.parametrize("path", list(GOOD))
def test_the_openapi_document_declares_each_body_and_agrees_with_the_server(tokenizer, path):
    """The oracle is a JSON Schema validator over the document: what it accepts the server
    serves, what it refuses the server refuses."""
    tm = FakeTM(tokenizer, features=ALL_FEATURES, context_len=512)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as client:
        check_body_schema(client, path)


def check_body_schema(client, path):
    doc = openapi(client)
    jsonschema.Draft202012Validator.check_schema(body_schema(doc, path))
    validator = jsonschema.Draft202012Validator(body_schema(doc, path))
    for body in GOOD[path]:
        validator.validate(body)
        assert client.post(path, json=body).status_code == 200, body
    for body in BAD[path]:
        assert not validator.is_valid(body), body
        assert client.post(path, json=body).status_code == 400, body


def test_every_schema_reference_resolves(client):
    doc = openapi(client)
    text = json.dumps(doc)
    for name in {ref.split("/")[-1] for ref in _refs(doc)}:
        assert name in doc["components"]["schemas"], name
    assert '"ge"' not in text and '"le"' not in text  # pydantic's names, not JSON Schema's


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)
