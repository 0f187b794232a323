"""Server-sent events, usage chunks, and aborting when the client goes away."""

import asyncio

from http_fakes import MODEL, call_asgi, sse_events

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.server_args import ServerArgs

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def stream(client, path, body):
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r)


def test_chat_stream_starts_with_the_role_and_ends_with_done(client):
    events = stream(client, "/v1/chat/completions", CHAT)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all(c["usage"] is None for c in chunks)


def test_include_usage_adds_a_final_usage_chunk(client, tm):
    events = stream(
        client, "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}
    )
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == []
    prompt_len = len(tm.requests[0][0])
    assert usage_chunk["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 3,
        "total_tokens": prompt_len + 3,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def test_completion_stream_carries_text_deltas(client):
    events = stream(client, "/v1/completions", {"prompt": "x", "stream": True, "max_tokens": 2})
    assert events[-1] == "[DONE]"
    assert [c["choices"][0]["text"] for c in events[:-1]] == ["Hello", " world"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in events[:-1])


def test_completion_stream_with_usage_and_echo(client):
    body = {
        "prompt": "Say:",
        "stream": True,
        "echo": True,
        "stream_options": {"include_usage": True},
    }
    events = stream(client, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in events[:-2]) == "Say:Hello world!"
    assert events[-2]["usage"]["completion_tokens"] == 3


def test_n_streams_interleave_with_their_indexes(client):
    events = stream(client, "/v1/chat/completions", {**CHAT, "n": 2})
    for index in (0, 1):
        mine = [c for c in events[:-1] if c["choices"][0]["index"] == index]
        assert mine[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in mine) == "Hello world!"
        assert mine[-1]["choices"][0]["finish_reason"] == "stop"


def test_an_abort_mid_stream_sends_an_error_event(client, tm):
    tm.finish = FinishReason("abort", message="evicted")
    events = stream(client, "/v1/chat/completions", CHAT)
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {
            "message": "evicted",
            "type": "server_error",
            "param": None,
            "code": "request_aborted",
        }
    }


def test_native_generate_streams_cumulative_text(client):
    events = stream(client, "/generate", {"text": "hi", "stream": True})
    assert [e["text"] for e in events[:-1]] == ["Hello", "Hello world", "Hello world!"]
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert events[-1] == "[DONE]"


def test_a_client_leaving_mid_stream_aborts_the_request(tm):
    tm.hang = True  # the request would never finish on its own
    app = build_app(tm, ServerArgs())
    sent = asyncio.run(call_asgi(app, "/v1/chat/completions", CHAT, disconnect_after_chunks=2))
    assert sent[0]["status"] == 200
    assert len(tm.requests) == 1 and tm.aborted == [tm.requests[0][2]]


def test_a_client_leaving_before_the_first_token_aborts_the_request(tm):
    tm.reply, tm.hang = [], True  # queued: no token ever comes
    app = build_app(tm, ServerArgs())
    asyncio.run(call_asgi(app, "/v1/chat/completions", CHAT, disconnect_after_chunks=1))
    assert tm.aborted == [tm.requests[0][2]]


def test_a_client_leaving_a_non_streaming_request_aborts_it(tm):
    tm.hang = True
    app = build_app(tm, ServerArgs())
    body = {**CHAT, "stream": False, "n": 2}
    asyncio.run(call_asgi(app, "/v1/chat/completions", body, disconnect_after_chunks=0))
    assert sorted(tm.aborted) == sorted(r[2] for r in tm.requests) and len(tm.aborted) == 2


def test_a_finished_request_is_not_aborted(client, tm):
    stream(client, "/v1/chat/completions", CHAT)
    client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert tm.aborted == [] and len(tm.requests) == 2
