"""Routing keys: what the cache-aware policy matches prefixes of."""

from __future__ import annotations

import json

from sluice.runtime.router.keys import routing_key


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
