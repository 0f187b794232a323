"""The HTTP routes over a scripted TokenizerManager: shapes, counts, parameters."""

from fastapi import Response
from fastapi.testclient import TestClient
from http_fakes import CONTEXT_LEN, MODEL, FakeTM

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.ipc.messages import FinishReason, SchedulerStats
from sluice.runtime.server_args import ServerArgs

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital?"}]}


def test_models_lists_the_served_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [
        (MODEL, "model", CONTEXT_LEN)
    ]


def test_chat_applies_the_chat_template(client, tm, tokenizer):
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    text = tokenizer.apply_chat_template(
        CHAT["messages"], add_generation_prompt=True, tokenize=False
    )
    assert tm.requests[0][0] == tokenizer.encode(text, add_special_tokens=False)


def test_chat_returns_the_text_finish_reason_and_usage(client, tm):
    body = client.post("/v1/chat/completions", json=CHAT).json()
    prompt_len = len(tm.requests[0][0])
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello world!"}
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 3,
        "total_tokens": prompt_len + 3,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def test_chat_hits_max_tokens_with_finish_reason_length(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}).json()
    assert body["choices"][0]["message"]["content"] == "Hello world"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_chat_without_max_tokens_gets_the_rest_of_the_context(client, tm):
    client.post("/v1/chat/completions", json=CHAT)
    ids, sampling, _ = tm.requests[0]
    assert sampling.max_new_tokens == CONTEXT_LEN - len(ids)


def test_a_stop_string_is_reported_as_stop_with_its_reason(client, tm):
    tm.finish = FinishReason("stop", matched_str="###")
    body = client.post("/v1/chat/completions", json={**CHAT, "stop": ["###"]}).json()
    assert tm.requests[0][1].stop == ["###"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["stop_reason"] == "###"


def test_completion_tokenizes_the_prompt_and_returns_text(client, tm, tokenizer):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Once upon a time"})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert tm.requests[0][0] == tokenizer.encode("Once upon a time")
    assert tm.requests[0][1].max_new_tokens == 16
    assert body["choices"][0]["text"] == "Hello world!"
    assert body["usage"]["prompt_tokens"] == len(tm.requests[0][0])


def test_completion_accepts_token_ids(client, tm):
    client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7]})
    assert tm.requests[0][0] == [5, 6, 7]


def test_completion_echo_prepends_the_prompt(client):
    body = client.post("/v1/completions", json={"prompt": "Say:", "echo": True}).json()
    assert body["choices"][0]["text"] == "Say:Hello world!"


def test_sampling_fields_reach_the_scheduler(client, tm):
    client.post(
        "/v1/chat/completions",
        json={
            **CHAT,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "min_p": 0.1,
            "seed": 3,
            "repetition_penalty": 1.2,
            "ignore_eos": True,
            "min_tokens": 1,
            "stop_token_ids": [9],
        },
    )
    s = tm.requests[0][1]
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.7, 0.8, 20, 0.1, 3)
    assert (s.repetition_penalty, s.ignore_eos, s.min_new_tokens, s.stop_token_ids) == (
        1.2,
        True,
        1,
        [9],
    )


def test_n_runs_n_requests_with_derived_seeds(client, tm):
    body = client.post("/v1/chat/completions", json={**CHAT, "n": 3, "seed": 10}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert sorted(r[1].seed for r in tm.requests) == [10, 11, 12]
    assert len({r[2] for r in tm.requests}) == 3
    assert body["usage"]["completion_tokens"] == 9
    assert body["usage"]["prompt_tokens"] == len(tm.requests[0][0])


def test_unknown_fields_are_refused_and_no_effect_ones_accepted(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "frobnicate": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    ok = {**CHAT, "user": "u", "metadata": {"k": "v"}, "store": False}
    assert client.post("/v1/chat/completions", json=ok).status_code == 200


def test_the_model_may_be_omitted_or_named_by_path(client):
    assert (
        client.post("/v1/chat/completions", json={"messages": CHAT["messages"]}).status_code == 200
    )
    assert (
        client.post("/v1/chat/completions", json={**CHAT, "model": "/models/tiny"}).status_code
        == 200
    )


def test_chat_logprobs_carry_the_chosen_tokens(client, tokenizer):
    body = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True}).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["logprob"] for c in content] == [-0.5, -0.5, -0.5]
    assert content[0]["token"] == tokenizer.decode([10])
    assert content[0]["top_logprobs"] == []


def test_completion_logprobs_carry_the_chosen_tokens(client):
    body = client.post("/v1/completions", json={"prompt": "x", "logprobs": 0}).json()
    lp = body["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-0.5, -0.5, -0.5] and len(lp["tokens"]) == 3
    assert lp["text_offset"][0] == 0 and len(lp["top_logprobs"]) == 3


def test_native_generate_takes_text_or_ids(client, tm):
    body = client.post(
        "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    ).json()
    assert body["text"] == "Hello world" and body["output_ids"] == [10, 11]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert body["meta_info"]["completion_tokens"] == 2
    client.post("/generate", json={"input_ids": [4, 5]})
    assert tm.requests[1][0] == [4, 5]


def test_native_generate_reports_an_abort_in_band(client, tm):
    tm.finish = FinishReason("abort", message="out of memory")
    body = client.post("/generate", json={"text": "hi"}).json()
    assert body["meta_info"]["finish_reason"] == {"type": "abort", "message": "out of memory"}


def test_health_is_200_only_when_ready_and_not_draining(client, tm):
    assert client.get("/health").status_code == 200
    tm.is_ready = False
    assert client.get("/health").status_code == 503
    tm.is_ready, tm.draining = True, True
    assert client.get("/health").status_code == 503


def test_health_and_liveness_say_engine_down_once_the_engine_is_gone(client, tm):
    assert client.get("/health/live").json() == {"status": "alive"}
    tm.is_ready, tm.down = False, "the scheduler process exited with code -9"
    for path in ("/health", "/health/live"):
        r = client.get(path)
        assert (r.status_code, r.json()) == (503, {"status": "engine-down"})


def test_server_info_has_the_args_without_the_key_and_the_managers_info(tokenizer):
    app = build_app(FakeTM(tokenizer), ServerArgs(model="/m", api_key="sekret"))
    with TestClient(app) as c:
        info = c.get("/server_info", headers={"Authorization": "Bearer sekret"}).json()
    assert info["model"] == "/m" and info["page_size"] == 1 and info["context_len"] == CONTEXT_LEN
    assert "api_key" not in info and "sekret" not in str(info)


def test_server_info_carries_the_schedulers_latest_stats(client, tm):
    assert "scheduler_stats" not in client.get("/server_info").json()
    tm.stats = SchedulerStats(running_requests=2, max_total_tokens=512)
    stats = client.get("/server_info").json()["scheduler_stats"]
    assert stats["running_requests"] == 2 and stats["max_total_tokens"] == 512


def test_the_api_key_guards_every_route_but_health_and_metrics(tokenizer):
    async def metrics():
        return Response("sluice_up 1\n", media_type="text/plain")

    app = build_app(FakeTM(tokenizer), ServerArgs(api_key="sekret"), metrics_handler=metrics)
    with TestClient(app) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sekret"}):
            r = c.get("/v1/models", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").text == "sluice_up 1\n"


def test_without_a_metrics_handler_there_is_no_metrics_route(client):
    assert client.get("/metrics").status_code == 404
