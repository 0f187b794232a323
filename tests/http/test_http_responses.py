"""The Responses API through the HTTP layer on a scripted engine, driven by the official
`openai` client (`client.responses.*`: its typed models and its typed stream events). The
prompt the engine gets is checked against the tokenizer's own chat template applied to the
conversation the request stands for."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, REPLY, FakeTM, call_asgi
from server_process import wait_for

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.entrypoints.responses_store import ResponseStore, StoredResponse
from sluice.runtime.entrypoints.tokenizer_manager import ABORTED_BY_REQUEST
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.server_args import ServerArgs

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
TEXT = "".join(REPLY)


def make(tokenizer, reply=None, **flags):
    tm = FakeTM(tokenizer, features=ALL_FEATURES, context_len=512)
    if reply is not None:
        tm.reply = reply
    http = TestClient(build_app(tm, ServerArgs(model="/m", **flags)))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                           max_retries=0)  # fmt: skip
    return client, tm, http


def prompt_of(tm) -> str:
    return tm.tokenizer.decode(tm.requests[-1][0])


def template(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_string_input_is_one_user_message_and_the_reply_one_message_item(tokenizer):
    client, tm, _ = make(tokenizer)
    r = client.responses.create(model=MODEL, input="Hi there", metadata={"k": "v"})
    assert prompt_of(tm) == template(tokenizer, [{"role": "user", "content": "Hi there"}])
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == TEXT and r.metadata == {"k": "v"} and r.model == MODEL
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert r.usage.output_tokens == len(REPLY) and r.usage.input_tokens == len(tm.requests[-1][0])
    assert r.usage.input_tokens_details.cached_tokens == tm.cached_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_lead_and_are_not_carried_to_the_next_turn(tokenizer):
    client, tm, _ = make(tokenizer)
    first = client.responses.create(model=MODEL, input="Hi", instructions="Be brief")
    assert prompt_of(tm) == template(
        tokenizer, [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    )
    client.responses.create(model=MODEL, input=[{"role": "user", "content": "More"}],
                            previous_response_id=first.id)  # fmt: skip
    assert prompt_of(tm) == template(tokenizer, [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": TEXT},
        {"role": "user", "content": "More"},
    ])  # fmt: skip


def test_a_stored_response_is_retrieved_continued_and_deleted(tokenizer):
    client, tm, http = make(tokenizer)
    r = client.responses.create(model=MODEL, input="Hi")
    raw = http.post("/v1/responses", json={"input": "Hi"})
    assert raw.headers["x-sluice-response-id"] == raw.json()["id"]
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    second = client.responses.create(model=MODEL, input="Again", previous_response_id=r.id)
    third = client.responses.create(model=MODEL, input="Once more", previous_response_id=second.id)
    assert third.previous_response_id == second.id
    assert prompt_of(tm) == template(tokenizer, [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": TEXT},
        {"role": "user", "content": "Again"}, {"role": "assistant", "content": TEXT},
        {"role": "user", "content": "Once more"},
    ])  # fmt: skip
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(r.id)
    assert err.value.body["code"] == "response_not_found"
    with pytest.raises(openai.BadRequestError) as err:  # OpenAI's status and code
        client.responses.create(model=MODEL, input="x", previous_response_id=r.id)
    assert err.value.body["param"] == "previous_response_id"
    assert err.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_input_items_list_the_responses_own_input_a_page_at_a_time(tokenizer):
    client, _, _ = make(tokenizer)
    first = client.responses.create(model=MODEL, input="Hi")
    given = [
        {"role": "user", "content": "one"},
        {"type": "message", "role": "user", "id": "msg_mine",
         "content": [{"type": "input_text", "text": "two"}]},
        {"role": "user", "content": "three"},
    ]  # fmt: skip
    r = client.responses.create(model=MODEL, input=given, previous_response_id=first.id)
    page = client.responses.input_items.list(r.id)
    texts = [i.content[0].text for i in page.data]
    assert texts == ["three", "two", "one"]  # newest first, and only this response's own
    assert page.data[1].id == "msg_mine" and all(i.id.startswith("msg_") for i in page.data)
    asc = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in asc.data] == ["one", "two"] and asc.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=asc.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["three"] and not rest.has_more
    assert [i.content[0].text for i in client.responses.input_items.list(first.id).data] == ["Hi"]
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(r.id, limit=101)


def test_store_false_keeps_nothing(tokenizer):
    client, _, http = make(tokenizer)
    r = client.responses.create(model=MODEL, input="Hi", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    assert "x-sluice-response-id" not in http.post("/v1/responses", json={"input": "Hi", "store": False}).headers


def test_a_store_of_size_zero_says_store_false(tokenizer):
    client, _, _ = make(tokenizer, responses_store_size=0)
    r = client.responses.create(model=MODEL, input="Hi")
    assert r.store is False


DOCUMENTED_ORDER = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.content_part.added", *["response.output_text.delta"] * len(REPLY),
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.completed",
]  # fmt: skip


def test_a_stream_sends_the_typed_events_in_order_and_ends_with_the_stored_response(tokenizer):
    client, _, _ = make(tokenizer)
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True,
                                          stream_options={"include_obfuscation": False}))
    assert [e.type for e in events] == DOCUMENTED_ORDER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == TEXT
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1].response
    assert done.status == "completed" and done.output_text == TEXT and done.usage.output_tokens == 3
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {done.output[0].id}
    assert client.responses.retrieve(done.id).model_dump() == done.model_dump()


def test_the_stream_helper_accumulates_the_final_response(tokenizer):
    client, _, _ = make(tokenizer)
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == TEXT and final.status == "completed"


def test_max_output_tokens_makes_it_incomplete(tokenizer):
    client, _, _ = make(tokenizer)
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "Hello world" and r.output[0].status == "incomplete"
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


REQUIRED_REPLY = ['[{"name": "get_weather", ', '"parameters": {"city": "Paris"}}]']


def test_a_required_function_call_is_a_function_call_item_and_its_output_continues(tokenizer):
    client, tm, _ = make(tokenizer, reply=REQUIRED_REPLY)
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                tool_choice="required")  # fmt: skip
    assert tm.requests[-1][1].constraint is not None  # the grammar forces the call's shape
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert r.tool_choice == "required" and r.tools[0].name == "get_weather"
    tm.reply = list(REPLY)
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "22 C"}]
    client.responses.create(model=MODEL, input=follow, previous_response_id=r.id, tools=[WEATHER],
                            tool_choice="none")  # fmt: skip
    request_ids = tm.requests[-1][0]
    expected = tokenizer.apply_chat_template([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 C"},
    ], tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert tokenizer.decode(request_ids) == expected


def test_a_streamed_function_call_sends_argument_deltas(tokenizer):
    client, _, _ = make(tokenizer, reply=REQUIRED_REPLY)
    events = list(client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required", stream=True
    ))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(deltas) == json.loads(done.arguments) == {"city": "Paris"}
    assert events[-1].response.output[0].arguments == done.arguments


def test_a_named_function_choice_forces_that_function(tokenizer):
    client, tm, _ = make(tokenizer, reply=['{"city": ', '"Rome"}'])
    r = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    [call] = r.output
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Rome"})
    assert json.loads(tm.requests[-1][1].constraint.spec)["required"] == ["city"]


def test_auto_tool_calls_are_parsed_with_the_servers_parser(tokenizer):
    reply = ["Let me look.\n<tool_call>\n", '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
             "\n</tool_call>"]  # fmt: skip
    client, _, _ = make(tokenizer, reply=reply, tool_call_parser="hermes")
    r = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER])
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output[0].content[0].text == "Let me look."
    assert json.loads(r.output[1].arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_chunk_that_ends_a_call_and_starts_text_keeps_the_whole_arguments(tokenizer, stream):
    reply = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"',
             '}}\n</tool_call>\nDone.']  # fmt: skip
    client, _, _ = make(tokenizer, reply=reply, tool_call_parser="hermes")
    kwargs = dict(model=MODEL, input="Weather?", tools=[WEATHER])
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        r = events[-1].response
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert json.loads(deltas) == {"city": "Oslo"}
    else:
        r = client.responses.create(**kwargs)
    assert [o.type for o in r.output] == ["function_call", "message"]
    assert json.loads(r.output[0].arguments) == {"city": "Oslo"} and r.output_text == "Done."


def test_a_response_aborted_by_abort_request_is_cancelled_and_not_stored(tokenizer):
    client, tm, http = make(tokenizer)
    tm.finish = FinishReason("abort", message=ABORTED_BY_REQUEST)
    r = client.responses.create(model=MODEL, input="Hi")
    assert r.status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert events[-1].type == "response.failed" and events[-1].response.status == "cancelled"


def test_a_request_id_of_a_stored_response_is_refused(tokenizer):
    _, _, http = make(tokenizer)
    assert http.post("/v1/responses", json={"input": "x", "request_id": "mine"}).status_code == 200
    again = http.post("/v1/responses", json={"input": "x", "request_id": "mine"})
    assert again.status_code == 400 and again.json()["error"]["param"] == "request_id"


def test_a_strict_json_schema_format_constrains_the_output(tokenizer):
    client, tm, _ = make(tokenizer, reply=['{"a": 1}'])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}  # fmt: skip
    r = client.responses.create(model=MODEL, input="JSON please", text={"format": {
        "type": "json_schema", "name": "thing", "schema": schema, "strict": True}})  # fmt: skip
    constraint = tm.requests[-1][1].constraint
    assert json.loads(constraint.spec) == schema and constraint.strict
    assert json.loads(r.output_text) == {"a": 1}
    assert r.text.format.type == "json_schema" and r.text.format.name == "thing"
    # a forced call with a text format: the call's grammar applies (there is no text)
    tm.reply = list(REQUIRED_REPLY)
    r = client.responses.create(model=MODEL, input="x", tools=[WEATHER], tool_choice="required",
                                text={"format": {"type": "json_object"}})  # fmt: skip
    assert json.loads(tm.requests[-1][1].constraint.spec)["type"] == "array"
    assert [o.type for o in r.output] == ["function_call"]


def test_auto_tools_with_a_format_let_the_model_answer_in_it_or_call(tokenizer):
    client, tm, _ = make(tokenizer, reply=['{"a": 1}'], tool_call_parser="hermes")
    fmt = {"type": "json_schema", "name": "thing", "strict": True,
           "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}  # fmt: skip
    r = client.responses.create(model=MODEL, input="x", tools=[WEATHER], text={"format": fmt})
    constraint = tm.requests[-1][1].constraint
    assert constraint.kind == "any_of" and r.output_text == '{"a": 1}'
    answer, call = json.loads(constraint.spec)
    assert json.loads(answer[0]["spec"]) == fmt["schema"]
    assert call[0] == "<tool_call>\n" and call[2] == "\n</tool_call>"
    assert json.loads(call[1]["spec"])["properties"]["name"]["enum"] == ["get_weather"]


QWEN3_REPLY = ["<think>", "Let me think", ".</think>", "\n\nParis", "."]


def test_reasoning_is_its_own_item_with_a_reasoning_parser(tokenizer):
    client, tm, _ = make(tokenizer, reply=QWEN3_REPLY, reasoning_parser="qwen3")
    r = client.responses.create(model=MODEL, input="Capital of France?",
                                reasoning={"effort": "high"})  # fmt: skip
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Let me think." and r.output_text == "Paris."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(model=MODEL, input="Again?", stream=True))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == "Let me think."
    assert events[-1].response.output[0].type == "reasoning"
    client.responses.create(model=MODEL, input="Quick?", reasoning={"effort": "none"})
    plain = template(tokenizer, [{"role": "user", "content": "Quick?"}])
    assert prompt_of(tm) == plain  # this template ignores enable_thinking; the kwarg reached it


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://a/b.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "background": True, "stream": True}, "stream"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning.effort"),
    ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": []}, "input"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
     "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "stream": True, "stream_options": {"include_usage": True}}, "stream_options"),
])  # fmt: skip
def test_what_is_not_built_is_a_400_naming_the_field(tokenizer, body, param):
    _, _, http = make(tokenizer)
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_an_engine_failure_mid_stream_ends_with_response_failed(tokenizer):
    client, tm, _ = make(tokenizer)
    tm.finish = FinishReason("error", message="the engine failed")
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "the engine failed"
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=MODEL, input="Hi")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_aborts_the_generation(tokenizer, stream):
    tm = FakeTM(tokenizer, hang=True, context_len=512)
    app = build_app(tm, ServerArgs(model="/m"))
    body = {"model": MODEL, "input": "Hi", "stream": stream}
    asyncio.run(call_asgi(app, "/v1/responses", body, disconnect_after_chunks=2 if stream else 0))
    assert len(tm.aborted) == 1 and tm.aborted[0].startswith("resp_") and not tm.live


def test_tokenize_and_detokenize_match_the_tokenizer(tokenizer):
    _, _, http = make(tokenizer)
    r = http.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    ids = tokenizer.encode("Hello world")
    assert r == {"count": len(ids), "max_model_len": 512, "tokens": ids,
                 "token_strs": tokenizer.convert_ids_to_tokens(ids)}  # fmt: skip
    messages = [{"role": "user", "content": "Hi"}]
    r = http.post("/tokenize", json={"messages": messages}).json()
    assert r["tokens"] == tokenizer.encode(template(tokenizer, messages), add_special_tokens=False)
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": tokenizer.decode(ids)}
    bad = http.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = http.post("/tokenize", json={"prompt": "x", "messages": messages})
    assert both.status_code == 400


def test_the_store_evicts_the_least_recently_used_and_expires_after_its_ttl():
    now = [0.0]
    store = ResponseStore(max_entries=2, ttl_s=10.0, clock=lambda: now[0])
    entry = StoredResponse({}, [])
    store.put("a", entry)
    store.put("b", entry)
    assert store.get("a") is entry  # a is now the most recently used
    store.put("c", entry)
    assert store.get("b") is None and store.get("a") is entry and store.get("c") is entry
    now[0] = 9.0
    assert store.get("a") is entry  # used again: its ttl starts again
    now[0] = 15.0
    assert store.get("c") is None and store.get("a") is entry
    now[0] = 30.0
    assert len(store) == 0


def test_a_background_response_runs_on_and_is_polled_to_completion(tokenizer):
    tm = FakeTM(tokenizer, features=ALL_FEATURES, context_len=512)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as http:  # one event loop throughout
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                               max_retries=0)  # fmt: skip
        r = client.responses.create(model=MODEL, input="Hi", background=True)
        assert r.status in ("queued", "in_progress") and r.background is True
        done = wait_for(lambda: (d := client.responses.retrieve(r.id)).status == "completed" and d,
                        timeout=10, what="the background response to complete")  # fmt: skip
        assert done.output_text == TEXT
        follow = client.responses.create(model=MODEL, input="More", previous_response_id=r.id)
        assert follow.status == "completed"
        with pytest.raises(openai.BadRequestError):  # finished: nothing to cancel
            client.responses.cancel(r.id)


def test_a_background_response_is_cancelled_and_its_generation_aborted(tokenizer):
    tm = FakeTM(tokenizer, features=ALL_FEATURES, context_len=512, hang=True)
    with TestClient(build_app(tm, ServerArgs(model="/m"))) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                               max_retries=0)  # fmt: skip
        r = client.responses.create(model=MODEL, input="Hi", background=True)
        assert client.responses.retrieve(r.id).status == "in_progress"
        with pytest.raises(openai.BadRequestError) as err:  # still running: not continuable
            client.responses.create(model=MODEL, input="x", previous_response_id=r.id)
        assert err.value.body["param"] == "previous_response_id"
        cancelled = client.responses.cancel(r.id)
        assert cancelled.status == "cancelled"
        assert tm.aborted == [r.id] and not tm.live  # the engine let the request go
        assert client.responses.retrieve(r.id).status == "cancelled"
        again = client.responses.create(model=MODEL, input="Hi", background=True)
        client.responses.delete(again.id)  # a running one is stopped, then forgotten
        assert again.id in tm.aborted and not tm.live
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(again.id)
