"""Structured outputs and tool calls of the bundled SmolLM2 through the real server and the
official `openai` client: outputs parse and validate against their schemas, tool calls'
arguments validate against the tool's parameters, streamed and not; in the overlap loop,
and in the normal loop on a pool small enough to retract."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from json_schemas import PERSON, PETS, WEATHER
from server_process import serve

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.bundled]
openai = pytest.importorskip("openai")

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "Describe a person who lives in Paris."}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["overlap", "normal-tiny-pool"])
def client(request, bundled_model_path, tmp_path_factory):
    extra = ["--max-running-requests", "8"]
    if request.param == "overlap":
        extra += ["--enable-overlap-schedule"]  # the CPU's default is the normal loop
    if request.param == "normal-tiny-pool":
        extra += ["--disable-overlap-schedule", "--max-total-tokens", "700",
                  "--init-new-token-ratio", "0.05"]  # fmt: skip
    log = tmp_path_factory.mktemp(request.param) / "server.log"
    with serve(bundled_model_path, log, *extra) as srv:
        c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=300)
        model = c.models.list().data[0].id
        yield c, model, srv
        c.close()


def schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_json_schema_outputs_parse_and_validate(client):
    c, model, srv = client

    def one(schema: dict) -> dict:
        r = c.chat.completions.create(
            model=model, messages=ASK, temperature=0, max_tokens=120,
            response_format=schema_format("thing", schema),
        )  # fmt: skip
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        out = json.loads(r.choices[0].message.content)
        jsonschema.validate(out, schema)
        return out

    # several at once: in the tiny pool, some are retracted and resume in their grammar
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, [PERSON, PETS, PERSON, PETS, {"type": "object"}, PERSON]))
    assert len(results) == 6


def test_guided_choice_and_regex(client):
    c, model, _ = client
    choices = ["Paris", "London", "Rome"]
    r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                             temperature=0, extra_body={"guided_choice": choices})  # fmt: skip
    assert r.choices[0].text in choices
    r = c.completions.create(model=model, prompt="A date: ", max_tokens=16, temperature=0,
                             extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"})  # fmt: skip
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", r.choices[0].text)


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_forced_tool_calls_have_valid_arguments_streamed_and_not(client, tool_choice):
    c, model, _ = client
    choice = (
        "required" if tool_choice == "required"
        else {"type": "function", "function": {"name": "get_weather"}}
    )  # fmt: skip
    kwargs = dict(model=model, messages=WEATHER_ASK, tools=[WEATHER, TIME], tool_choice=choice,
                  temperature=0, max_tokens=120)  # fmt: skip
    r = c.chat.completions.create(**kwargs)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])
    if tool_choice == "named":
        assert [call.function.name for call in calls] == ["get_weather"]
    # streamed: the official client's accumulator rebuilds the same calls from the deltas
    with c.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (t.function.name, t.function.arguments) for t in calls
    ]
