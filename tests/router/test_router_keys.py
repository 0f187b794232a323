"""Routing keys: what the cache-aware policy matches prefixes of."""

from __future__ import annotations

import json

from sluice.runtime.router.keys import request_route, routing_key


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def test_a_chat_turn_extends_the_key_of_the_turn_before():
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": [{"type": "text", "text": "More"}]}]  # fmt: skip
    k1 = routing_key("/v1/chat/completions", body({"messages": turn1}))
    k2 = routing_key("/v1/chat/completions", body({"messages": turn2}))
    assert k2.startswith(k1) and len(k2) > len(k1)
    assert "More" in k2


def test_completion_prompts_text_token_ids_and_batches():
    assert routing_key("/v1/completions", body({"prompt": "abc"})) == "abc"
    assert routing_key("/v1/completions", body({"prompt": [1, 2, 3]})) == (1, 2, 3)
    assert routing_key("/v1/completions", body({"prompt": ["first", "second"]})) == "first"
    assert routing_key("/v1/completions", body({"prompt": [[4, 5], [6]]})) == (4, 5)


def test_generate_uses_text_else_input_ids():
    assert routing_key("/generate", body({"text": "t"})) == "t"
    assert routing_key("/generate", body({"input_ids": [7, 8]})) == (7, 8)


def test_an_unreadable_body_routes_with_an_empty_key():
    assert routing_key("/v1/completions", b"{not json") == ""
    assert routing_key("/v1/completions", body([1, 2])) == ""
    assert routing_key("/v1/chat/completions", body({"messages": "no"})) == ""


def test_a_responses_turn_extends_the_key_of_the_turn_before():
    turn1 = [{"role": "user", "content": "Hi"}]
    turn2 = [
        *turn1,
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello!"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"role": "user", "content": [{"type": "input_text", "text": "More"},
                                     {"type": "input_image", "image_url": "http://img"}]},
    ]  # fmt: skip
    k1 = routing_key("/v1/responses", body({"instructions": "Be brief.", "input": turn1}))
    k2 = routing_key("/v1/responses", body({"instructions": "Be brief.", "input": turn2}))
    assert k1 == "<system>Be brief.<user>Hi"
    assert k2 == k1 + "<assistant>Hello!<user>More"  # the tool call and the image carry no key


def test_a_responses_string_input_keys_like_the_same_chat():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert routing_key("/v1/responses", body({"instructions": "Be brief.", "input": "Hi"})) == (
        routing_key("/v1/chat/completions", body({"messages": chat}))
    )
    assert routing_key("/v1/responses", body({"input": "Hi"})) == "<user>Hi"
    assert routing_key("/v1/responses", body({"input": 3})) == ""


def test_previous_response_id_is_read_from_responses_bodies_only():
    def previous(path: str, obj) -> str | None:
        return request_route(path, body(obj)).previous_response_id

    assert previous("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}) == "resp_1"
    assert previous("/v1/responses", {"input": "x", "previous_response_id": ""}) is None
    assert previous("/v1/responses", {"input": "x", "previous_response_id": 7}) is None
    assert previous("/v1/chat/completions", {"previous_response_id": "resp_1"}) is None
