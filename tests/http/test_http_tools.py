"""Tool calling through the HTTP layer, parsed by the official `openai` client (its
non-streamed models and its stream accumulator, which rebuilds tool calls from deltas)."""

import json

import openai
import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.server_args import ServerArgs

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
HERMES_REPLY = [
    "Let me look.\n<tool",
    "_call>\n{\"name\": \"get_",
    "weather\", \"arguments\": {\"city\": \"Par",
    "is\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", ",
    "\"arguments\": {}}\n</tool_call>",
]


def make_client(tokenizer, reply, parser="hermes", features=ALL_FEATURES):
    tm = FakeTM(tokenizer, reply=reply, features=features, context_len=512)
    http = TestClient(build_app(tm, ServerArgs(model="/m", tool_call_parser=parser)))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                           max_retries=0)  # fmt: skip
    return client, tm


def calls_of(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


EXPECTED = [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {})]


def test_auto_tool_calls_are_parsed_and_finish_with_tool_calls(tokenizer):
    client, tm = make_client(tokenizer, HERMES_REPLY)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    assert calls_of(choice.message) == EXPECTED
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)


def test_streamed_tool_call_deltas_rebuild_the_same_calls(tokenizer):
    client, _ = make_client(tokenizer, HERMES_REPLY)
    with client.chat.completions.stream(
        model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME]
    ) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    assert calls_of(final.choices[0].message) == EXPECTED
    assert final.choices[0].message.content == "Let me look."
    assert final.choices[0].finish_reason == "tool_calls"
    heads = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if c.choices
             and tc.id]  # fmt: skip
    assert [(h.index, h.type, h.function.name, h.function.arguments) for h in heads] == [
        (0, "function", "get_weather", ""), (1, "function", "get_time", "")
    ]
    later = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if c.choices
             and not tc.id]  # fmt: skip
    assert all(tc.function.name is None and tc.function.arguments for tc in later)
    assert len([tc for tc in later if tc.index == 0]) > 1  # the arguments arrive in pieces


def test_parallel_tool_calls_false_keeps_the_first_call(tokenizer):
    client, _ = make_client(tokenizer, HERMES_REPLY)
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME], parallel_tool_calls=False
    )
    assert calls_of(r.choices[0].message) == EXPECTED[:1]


def test_llama3_json_calls(tokenizer):
    reply = ['<|python_tag|>{"name": "get_weather", ', '"parameters": {"city": "Paris"}}']
    client, _ = make_client(tokenizer, reply, parser="llama3_json")
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER])
    assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Paris"})]
    assert r.choices[0].message.content is None


def test_plain_text_with_tools_stays_content(tokenizer):
    client, _ = make_client(tokenizer, ["It is ", "sunny."])
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER])
    assert r.choices[0].message.content == "It is sunny."
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_a_named_tool_choice_enforces_the_parameters_schema(tokenizer):
    client, tm = make_client(tokenizer, ['{"city": ', '"Paris"}'])
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME], tool_choice=choice
    )
    c = tm.requests[0][1].constraint
    assert c.kind == "json_schema" and json.loads(c.spec) == WEATHER["function"]["parameters"]
    assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Paris"})]
    assert r.choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice=choice
    ) as stream:
        final = stream.get_final_completion()
    assert calls_of(final.choices[0].message) == [("get_weather", {"city": "Paris"})]


def test_required_builds_an_array_schema_of_the_tools(tokenizer):
    jsonschema = pytest.importorskip("jsonschema")
    reply = ['[{"name": "get_time", "parameters": {}}, ', '{"name": "get_weather", "parameters": {"city": "Oslo"}}]']  # noqa: E501
    client, tm = make_client(tokenizer, reply)
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required"
    )
    schema = json.loads(tm.requests[0][1].constraint.spec)
    jsonschema.validate(json.loads("".join(reply)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {}}], schema)  # no city
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    assert calls_of(r.choices[0].message) == [("get_time", {}), ("get_weather", {"city": "Oslo"})]
    client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME],
                                   tool_choice="required", parallel_tool_calls=False)  # fmt: skip
    assert json.loads(tm.requests[1][1].constraint.spec)["maxItems"] == 1


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),  # noqa: E501
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ],
)
def test_bad_tool_requests_are_a_400(tokenizer, kwargs, param):
    client, tm = make_client(tokenizer, ["x"])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, **kwargs)
    assert info.value.body["param"] == param and tm.requests == []


def test_auto_without_a_parser_is_a_400(tokenizer):
    client, _ = make_client(tokenizer, ["x"], parser="")
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER])
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER],
                                       tool_choice="none")  # fmt: skip
    assert r.choices[0].message.content == "x"


def test_tools_and_tool_results_go_through_the_template(tokenizer):
    from tiny_model import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = (
        "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}{call {{ c.function.name }} {{ c.function.arguments | tojson }}}{% endfor %}"  # noqa: E501
        "{% if m.tool_call_id %}(for {{ m.tool_call_id }}){% endif %}{% endfor %}"
    )
    client, tm = make_client(tok, ["ok"])
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    prompt = tok.decode(tm.requests[0][0])
    assert prompt == (
        '[tool get_weather]<user>Weather in Paris?<assistant>'
        '{call get_weather {"city": "Paris"}}<tool>sunny(for call_1)'
    )
