"""Batched prompts (/v1/completions, /generate), /generate n, POST /abort_request, and the
request-level options honoured in the API (stop string kept, echo, truncation, ids)."""

import threading

import openai
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM, sse_events

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.server_args import ServerArgs


def test_a_list_of_prompts_gives_one_choice_per_prompt_times_n_indexed_as_openai(client, tm):
    r = client.post("/v1/completions", json={"prompt": ["a", [5, 6], "b c"], "n": 2, "seed": 1})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3, 4, 5]
    prompts = [req[0] for req in tm.requests]
    assert sorted(map(tuple, prompts)) == sorted(
        map(tuple, [prompts[0]] * 2 + [[5, 6]] * 2 + [prompts[-1]] * 2)
    )
    assert len({req[2] for req in tm.requests}) == 6  # distinct rids
    lens = sorted({len(p) for p in prompts})
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts) // 2 and lens
    assert body["usage"]["completion_tokens"] == 6 * 3


def test_batched_prompts_stream_with_their_indices(client):
    r = client.post("/v1/completions", json={"prompt": ["a", "b"], "stream": True,
                                              "stream_options": {"include_usage": True}})  # fmt: skip
    events = sse_events(r)
    texts = {0: "", 1: ""}
    for e in events[:-2]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == {0: "Hello world!", 1: "Hello world!"}
    assert events[-2]["usage"]["completion_tokens"] == 6 and events[-1] == "[DONE]"


def test_the_openai_client_parses_a_batched_completion(client):
    oa = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    r = oa.completions.create(model=MODEL, prompt=["x", "y"], echo=True)
    assert [c.text for c in r.choices] == ["xHello world!", "yHello world!"]


def test_generate_takes_a_batch_and_n(client, tm):
    body = client.post("/generate", json={"text": ["a", "b"], "sampling_params": {"n": 2}}).json()
    assert isinstance(body, list) and len(body) == 4
    assert all(b["text"] == "Hello world!" for b in body)
    assert len({b["meta_info"]["id"] for b in body}) == 4
    single_n = client.post("/generate", json={"input_ids": [4, 5], "sampling_params": {"n": 3}})
    assert len(single_n.json()) == 3
    ids = client.post("/generate", json={"input_ids": [[4, 5], [6]], "rid": ["r1", "r2"]}).json()
    assert [b["meta_info"]["id"] for b in ids] == ["r1", "r2"]
    assert [r[0] for r in tm.requests[-2:]] == [[4, 5], [6]]


def test_generate_per_prompt_sampling_params(client, tm):
    body = {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]}
    out = client.post("/generate", json=body).json()
    assert [o["text"] for o in out] == ["Hello", "Hello world"]


def test_a_streamed_generate_batch_carries_the_index(client):
    events = sse_events(client.post("/generate", json={"text": ["a", "b"], "stream": True}))
    assert {e["index"] for e in events[:-1]} == {0, 1} and events[-1] == "[DONE]"


def test_abort_request_ends_a_running_request_in_band(tokenizer):
    tm = FakeTM(tokenizer, hang=True)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as c:
        result = {}

        def generate():
            result["r"] = c.post("/generate", json={"text": "hi", "rid": "job-1"})

        t = threading.Thread(target=generate)
        t.start()
        for _ in range(10_000):  # wait (bounded) until the request is in flight
            if "job-1" in tm.live:
                break
            threading.Event().wait(0.001)
        assert c.post("/abort_request", json={"rid": "job-1"}).json() == {"aborted": ["job-1"]}
        t.join(10)
        body = result["r"].json()
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        assert body["text"] == "Hello world!"
        assert c.post("/abort_request", json={"rid": "gone"}).json() == {"aborted": []}
        assert c.post("/abort_request", json={}).status_code == 400


def test_an_aborted_chat_is_finish_reason_abort_not_an_error(tokenizer):
    tm = FakeTM(tokenizer, hang=True)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as c:
        result = {}
        body = {"messages": [{"role": "user", "content": "x"}], "rid": "c1", "n": 2}
        t = threading.Thread(target=lambda: result.update(r=c.post("/v1/chat/completions", json=body)))
        t.start()
        for _ in range(10_000):
            if {"c1-0", "c1-1"} <= set(tm.live):
                break
            threading.Event().wait(0.001)
        assert sorted(c.post("/abort_request", json={"abort_all": True}).json()["aborted"]) == [
            "c1-0", "c1-1"
        ]
        t.join(10)
        assert [ch["finish_reason"] for ch in result["r"].json()["choices"]] == ["abort"] * 2


def test_include_stop_str_in_output_keeps_the_stop_string(client, tm):
    tm.finish = FinishReason("stop", matched_str="###")
    body = {"prompt": "x", "stop": ["###"], "include_stop_str_in_output": True}
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == "Hello world!###"
    events = sse_events(client.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(c["text"] for e in events[:-1] for c in e["choices"]) == "Hello world!###"
    sg = {"text": "x", "sampling_params": {"stop": "###", "no_stop_trim": True}}
    assert client.post("/generate", json=sg).json()["text"] == "Hello world!###"


def test_chat_template_options_reach_the_template(client, tm, tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, "}]
    r = client.post("/v1/chat/completions", json={
        "messages": messages, "continue_final_message": True, "echo": True})  # fmt: skip
    expected = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert tm.requests[-1][0] == tokenizer.encode(expected, add_special_tokens=False)
    assert r.json()["choices"][0]["message"]["content"] == "Sure, Hello world!"
    client.post("/v1/chat/completions", json={"messages": messages[:1], "add_generation_prompt": False})
    plain = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=False, tokenize=False)
    assert tm.requests[-1][0] == tokenizer.encode(plain, add_special_tokens=False)
    bad = {"messages": messages[:1], "continue_final_message": True}
    assert client.post("/v1/chat/completions", json=bad).status_code == 400


def test_truncate_prompt_tokens_and_return_token_ids(client, tm):
    body = client.post("/v1/completions", json={
        "prompt": [1, 2, 3, 4, 5], "truncate_prompt_tokens": 2, "return_token_ids": True}).json()  # fmt: skip
    assert tm.requests[-1][0] == [4, 5]
    assert body["choices"][0]["prompt_token_ids"] == [4, 5]
    assert body["choices"][0]["token_ids"] == [10, 11, 12]
    client.post("/v1/completions", json={
        "prompt": [1, 2, 3], "truncate_prompt_tokens": 1, "truncation_side": "right"})  # fmt: skip
    assert tm.requests[-1][0] == [1]


def test_chat_input_ids_skip_the_template(client, tm):
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                              "input_ids": [7, 8, 9]})  # fmt: skip
    assert tm.requests[-1][0] == [7, 8, 9]


def test_the_client_rid_names_the_request(client, tm):
    body = client.post("/v1/completions", json={"prompt": "x", "request_id": "mine"}).json()
    assert tm.requests[-1][2] == "mine" and body["id"] == "mine"
