"""Bad input gets a 4xx in OpenAI's error JSON and never reaches the scheduler."""

import pytest
from http_fakes import CONTEXT_LEN, MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
def test_malformed_json_is_a_400(client, tm, path):
    r = client.post(
        path, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}
    )
    assert_error(r, 400, code="invalid_json")
    assert tm.requests == []


def test_a_body_that_is_not_an_object_is_a_400(client):
    assert_error(client.post("/v1/chat/completions", json=[1, 2]), 400)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stop": 3}, "stop"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages.[0].role"),
        # what OpenAI refuses of a message, named by its index and field
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.[0].role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "4"}]},
         "messages.[1].tool_call_id"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
         "messages.[1].content"),
        # stop strings are bounded (json_types.MAX_STOP_STRINGS / MAX_STOP_STRING_CHARS)
        ({"stop": [f"s{i}" for i in range(3000)]}, "stop"),
        ({"stop": ["x" * 257]}, "stop"),
        ({"seed": "abc"}, "seed"),
    ],
)
def test_wrong_values_and_types_are_a_400_naming_the_field(client, tm, fields, param):
    assert_error(client.post("/v1/chat/completions", json={**CHAT, **fields}), 400, param=param)
    assert tm.requests == []


def test_messages_openai_accepts_are_served(client, tm):
    """An assistant turn with tool calls and no content, then the tool's answer."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    messages = [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4"}]  # fmt: skip
    assert client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).status_code == 200
    body = {**CHAT, "stop": [f"s{i}" for i in range(16)]}  # the most stop strings allowed
    assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_a_missing_prompt_is_a_400(client):
    assert_error(client.post("/v1/completions", json={"model": MODEL}), 400, param="prompt")


def test_an_unknown_model_is_a_404(client, tm):
    r = client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-17"})
    err = assert_error(r, 404, param="model", code="model_not_found")
    assert "gpt-17" in err["message"]
    assert tm.requests == []


def test_max_tokens_beyond_the_context_is_a_400(client, tm):
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": CONTEXT_LEN})
    err = assert_error(r, 400, code="context_length_exceeded")
    assert f"maximum context length is {CONTEXT_LEN} tokens" in err["message"]
    assert tm.requests == []


def test_a_prompt_longer_than_the_context_is_a_400(client, tm):
    r = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "word " * 200, "max_tokens": 1}
    )
    assert_error(r, 400, code="context_length_exceeded")
    r = client.post(
        "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "x " * 200}]}
    )
    assert_error(r, 400, code="context_length_exceeded")
    assert tm.requests == []


def test_token_ids_outside_the_vocabulary_are_a_400(client, tm, tokenizer):
    r = client.post("/v1/completions", json={"prompt": [1, len(tokenizer)]})
    assert_error(r, 400, param="prompt")
    assert tm.requests == []


def test_an_empty_token_prompt_is_a_400(client):
    assert_error(client.post("/v1/completions", json={"prompt": []}), 400, param="prompt")


@pytest.mark.parametrize(
    "fields",
    [
        {"logit_bias": {"1": 5}},
        {"stream_options": {"include_usage": True}},  # without stream
        {"response_format": {"type": "json_object"}},
        {"top_logprobs": 3},  # without logprobs
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    ],
)
def test_unsupported_features_are_a_400(client, tm, fields):
    assert_error(client.post("/v1/chat/completions", json={**CHAT, **fields}), 400)
    assert tm.requests == []


def test_generate_needs_exactly_one_of_text_and_input_ids(client):
    assert_error(client.post("/generate", json={}), 400)
    assert_error(client.post("/generate", json={"text": "a", "input_ids": [1]}), 400)


def test_a_request_the_scheduler_rejects_up_front_is_a_400(client, tm):
    tm.reject = "the KV pool cannot hold this request"
    err = assert_error(client.post("/v1/chat/completions", json=CHAT), 400)
    assert err["message"] == "the KV pool cannot hold this request"
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert_error(r, 400)


def test_an_aborted_request_is_a_500_with_the_reason(client, tm):
    from sluice.runtime.ipc.messages import FinishReason

    tm.finish = FinishReason("abort", message="scheduler lost the request")
    err = assert_error(client.post("/v1/chat/completions", json=CHAT), 500, code="request_aborted")
    assert err["message"] == "scheduler lost the request"


def test_a_draining_server_refuses_new_work_with_503(client, tm):
    tm.draining = True
    assert_error(client.post("/v1/chat/completions", json=CHAT), 503)


def test_unknown_routes_answer_in_openais_shape(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/chat/completions"), 405)
