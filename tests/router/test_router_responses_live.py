"""The Responses API end to end: two real workers (fp32, the hermes tool parser) behind a
real router, driven by the official `openai` client and by the OpenAI Agents SDK.

The oracle for the text is transformers' greedy generation on the tiny model, from the
prompt its own chat template makes of the conversation. A conversation continued with
`previous_response_id` lands on the worker that stored it (the router's affinity, and its
probe after a restart), and reuses that worker's radix cache.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from router_testkit import wait_until

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration
WORKER_EXTRA = "--dtype float32 --tool-call-parser hermes"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
N = 8  # max_output_tokens
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}  # fmt: skip


class Report(BaseModel):
    """The agent's output type: bounded, so the tiny model's answer completes."""

    summary: str = Field(max_length=12)


@pytest.fixture(scope="module")
def workers(fleet):
    return [fleet.start_worker(extra=WORKER_EXTRA), fleet.start_worker(extra=WORKER_EXTRA)]


@pytest.fixture(scope="module")
def router(fleet, workers):
    with fleet.router("round-robin", workers) as url:
        yield url


@pytest.fixture(scope="module")
def hf(long_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(long_model, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(long_model)


@pytest.fixture
def client(router):
    c = openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def nothing_left_behind(fleet, workers):
    yield
    for url in workers:
        wait_until(lambda u=url: _idle(u), f"{url} idle with its KV pool free", timeout=30)


def _idle(url: str) -> bool:
    info = httpx.get(url + C.SERVER_INFO_PATH, timeout=10).json()
    return info.get("inflight_requests", 0) == 0


def greedy_text(hf, messages: list[dict], n: int = N) -> str:
    import torch

    model, tok = hf
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)  # fmt: skip
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def create(client, **kwargs):
    """responses.create through the router; (the response, the worker that served it)."""
    raw = client.responses.with_raw_response.create(model=None, **kwargs)
    return raw.parse(), raw.headers[C.ROUTER_WORKER_HEADER]


def test_greedy_text_equals_transformers_whole_and_streamed(client, hf):
    r, _ = create(client, input="What is the capital of France?", max_output_tokens=N, **GREEDY)
    expected = greedy_text(hf, [{"role": "user", "content": "What is the capital of France?"}])
    assert r.output_text == expected and r.status == "incomplete"
    events = list(client.responses.create(input="What is the capital of France?", stream=True,
                                          max_output_tokens=N, model=None, **GREEDY))  # fmt: skip
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == expected and events[-1].type == "response.incomplete"


def test_a_conversation_continues_on_the_worker_that_stored_it(client, hf, router, fleet, workers):
    conversation = [{"role": "system", "content": "Answer briefly."}]
    previous, holder = None, None
    for turn, question in enumerate(["Hello there.", "Tell me more.", "And then?"]):
        conversation.append({"role": "user", "content": question})
        # the instructions are sent each turn, as clients do: they are not carried over
        r, worker = create(client, input=question, previous_response_id=previous,
                           instructions="Answer briefly.", max_output_tokens=N, **GREEDY)  # fmt: skip
        if turn == 0:
            holder, first_prompt = worker, r.usage.input_tokens
        else:
            assert worker == holder  # round-robin alone would alternate
            assert r.usage.input_tokens_details.cached_tokens >= first_prompt - 16
        expected = greedy_text(hf, conversation)
        assert r.output_text == expected
        conversation.append({"role": "assistant", "content": r.output_text})
        previous = r.id
    got = client.responses.with_raw_response.retrieve(previous)
    assert got.headers[C.ROUTER_WORKER_HEADER] == holder and got.parse().id == previous
    items = client.responses.input_items.list(previous)
    assert [i.content[0].text for i in items.data] == ["And then?"]
    # a second router knows nothing yet: it asks the workers which one holds the response
    with fleet.router("round-robin", workers) as fresh:
        other = openai.OpenAI(base_url=f"{fresh}/v1", api_key="x", max_retries=0, timeout=120)
        for _ in range(2):
            r, worker = create(other, input="Once more.", previous_response_id=previous,
                               max_output_tokens=2, **GREEDY)  # fmt: skip
            assert worker == holder
        other.responses.delete(previous)
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(previous)


def test_a_required_call_and_a_strict_schema_validate(client):
    import jsonschema

    # bounded by the schema (one call, a city of at most 20 characters), so it completes
    r, _ = create(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=120, temperature=0.0)  # fmt: skip
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER["parameters"])
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}},
              "required": ["answer"], "additionalProperties": False}  # fmt: skip
    r, _ = create(client, input="Answer as JSON.", max_output_tokens=120, temperature=0.0,
                  text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                   "strict": True}})  # fmt: skip
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)


def test_the_agents_sdk_runs_a_tool_loop(router):
    """Turn 1 must call the tool; the SDK runs it, resets tool_choice to auto and asks
    again: the grammar then allows the agent's output type (a strict JSON schema) or another
    call, and the tool turns itself off after its second call, so the last turn answers in
    the output type (the tiny model's answer ends where the grammar ends it)."""
    agents = pytest.importorskip("agents")

    agents.set_tracing_disabled(True)
    called: list[str] = []

    @agents.function_tool(is_enabled=lambda ctx, agent: len(called) < 2)
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """Weather in a city."""
        called.append(city)
        return f"Sunny in {city}"

    async def run() -> agents.RunResult:
        oa = openai.AsyncOpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0, timeout=120)
        served = httpx.get(f"{router}/v1/models", timeout=10).json()["data"][0]["id"]
        model = agents.OpenAIResponsesModel(model=served, openai_client=oa)
        agent = agents.Agent(
            name="weather", instructions="Use the tool.", model=model, tools=[get_weather],
            output_type=Report,
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=200,
                                                temperature=0.0, parallel_tool_calls=False),
        )  # fmt: skip
        try:
            return await agents.Runner.run(agent, "Weather in Paris?", max_turns=4)
        finally:
            await oa.close()

    result = asyncio.run(run())
    assert 1 <= len(called) <= 2 and len(result.raw_responses) == len(called) + 1
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert [o.output for o in outputs] == [f"Sunny in {c}" for c in called]
    assert isinstance(result.final_output, Report)
