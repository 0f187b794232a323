"""`--reasoning-parser gpt-oss`: gpt-oss's Harmony replies, read by openai-harmony.

The replies are written by openai-harmony's own encoder (the oracle for what gpt-oss emits:
`render` of assistant messages on the analysis, final and commentary channels, the prompt's
`<|start|>assistant` and the stop token left out as the engine leaves them out), served by a
scripted engine a few tokens per chunk, and read through the official `openai` client:
analysis in `reasoning_content`, final in `content`, a message to `functions.X` a tool call
to X, streamed and whole, in chat and in the Responses API. Each expected value comes from
openai-harmony's `parse_messages_from_completion_tokens` of the same ids.
"""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM, chat_with_reasoning

from sluice.runtime.entrypoints.harmony import HarmonyOutput, harmony_encoding
from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.server_args import ServerArgs

oh = pytest.importorskip("openai_harmony")

MESSAGES = [{"role": "user", "content": "What is the weather in Tokyo?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}  # fmt: skip
START = 2  # `<|start|>assistant`: the prompt's end, not the reply's


def assistant(text: str, channel: str) -> list[int]:
    """One assistant message as openai-harmony renders it."""
    message = oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel(channel)
    return harmony_encoding().render(message)


def call(name: str, arguments: str) -> list[int]:
    """A function call as gpt-oss writes it (the recipient in the channel header, as in
    OpenAI's Harmony guide; openai-harmony parses it back, its `render` puts it elsewhere)."""
    text = (f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
            f"<|message|>{arguments}<|call|>")  # fmt: skip
    return harmony_encoding().encode(text, allowed_special="all")


def reply_ids(*messages: list[int]) -> list[int]:
    """What gpt-oss writes after the prompt's `<|start|>assistant`, without its stop token."""
    return [t for m in messages for t in m][START:-1]


def oracle(ids: list[int], stop: int) -> dict[str, object]:
    """openai-harmony's own reading of the reply: reasoning, content and calls."""
    parsed = harmony_encoding().parse_messages_from_completion_tokens(
        ids + [stop], oh.Role.ASSISTANT
    )
    text = lambda m: "".join(c.text for c in m.content)  # noqa: E731
    return {
        "reasoning": "".join(text(m) for m in parsed if m.channel == "analysis"),
        "content": "".join(text(m) for m in parsed if m.channel == "final"),
        "calls": [
            (m.recipient.removeprefix("functions."), json.loads(text(m)))
            for m in parsed
            if m.recipient
        ],  # fmt: skip
    }


THINK_THEN_ANSWER = reply_ids(
    assistant("The user asks about Tokyo's weather; I cannot look it up.", "analysis"),
    assistant("I can't check live weather, but Tokyo in December is cool and dry.", "final"),
)
THINK_THEN_CALL = reply_ids(
    assistant("Need to call get_weather for Tokyo.", "analysis"),
    call("get_weather", '{"location": "Tokyo"}'),
)
RETURN, CALL = 200002, 200012  # <|return|>, <|call|>: the stop tokens the engine drops


def make_client(ids: list[int], piece: int = 3, **flags: str):
    """A scripted engine replying `ids`, `piece` tokens per chunk."""
    from tiny_model import make_tokenizer

    enc = harmony_encoding()
    pieces = [ids[i : i + piece] for i in range(0, len(ids), piece)]
    tm = FakeTM(make_tokenizer(), reply=[enc.decode(p) for p in pieces], reply_ids=pieces,
                features=ALL_FEATURES, context_len=1024)  # fmt: skip
    args = ServerArgs(model="/m", **{"reasoning_parser": "gpt-oss", **flags})
    http = TestClient(build_app(tm, args))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                           max_retries=0)  # fmt: skip
    return client, http


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_reasoning_and_answer_as_harmony_reads_them(piece):
    want = oracle(THINK_THEN_ANSWER, RETURN)
    client, _ = make_client(THINK_THEN_ANSWER, piece)
    message = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
    assert (message.reasoning_content, message.content) == (want["reasoning"], want["content"])
    assert not message.tool_calls
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert (
        "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == want["reasoning"]
    )
    assert "".join(d.content or "" for d in deltas) == want["content"]
    if piece == 1:  # streamed as written, not at the end
        assert sum(1 for d in deltas if d.model_extra.get("reasoning_content")) > 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_to_a_function_is_a_tool_call(stream):
    want = oracle(THINK_THEN_CALL, CALL)
    assert want["calls"] == [("get_weather", {"location": "Tokyo"})]
    client, _ = make_client(THINK_THEN_CALL, piece=2)
    final, reasoning, chunks = chat_with_reasoning(
        client, stream, model=MODEL, messages=MESSAGES, tools=[WEATHER]
    )
    if stream:  # the arguments stream as they are written
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls) > 2
    choice = final.choices[0]
    assert reasoning == want["reasoning"]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == want["calls"]  # fmt: skip
    assert not choice.message.content


def test_without_tools_a_message_to_a_recipient_stays_content():
    client, _ = make_client(THINK_THEN_CALL)
    message = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
    assert not message.tool_calls and message.content == '{"location": "Tokyo"}'


def test_separate_reasoning_false_puts_the_analysis_in_the_content():
    want = oracle(THINK_THEN_ANSWER, RETURN)
    client, _ = make_client(THINK_THEN_ANSWER)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                       extra_body={"separate_reasoning": False})  # fmt: skip
    assert r.choices[0].message.content == want["reasoning"] + want["content"]


def test_the_responses_api_gives_a_reasoning_item_and_a_function_call():
    want = oracle(THINK_THEN_CALL, CALL)
    client, _ = make_client(THINK_THEN_CALL)
    r = client.responses.create(model=MODEL, input="weather in Tokyo?", tools=[
        {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}])  # fmt: skip
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == want["reasoning"]
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == want["calls"][0]


@pytest.mark.parametrize(
    "extra, param",
    [({"tool_choice": "required", "tools": [WEATHER]}, "tool_choice"),
     ({"response_format": {"type": "json_object"}}, "response_format")],
)  # fmt: skip
def test_what_would_force_the_replys_text_is_refused(extra, param):
    _, http = make_client(THINK_THEN_ANSWER)
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **extra})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param and "Harmony" in r.json()["error"]["message"]


def test_a_reply_cut_short_keeps_what_was_written():
    ids = THINK_THEN_ANSWER[: len(THINK_THEN_ANSWER) // 3]  # inside the analysis message
    out = HarmonyOutput()
    pieces = out.feed(ids, last=True)
    assert pieces.reasoning and not pieces.content
    assert pieces.reasoning in oracle(THINK_THEN_ANSWER, RETURN)["reasoning"]


def test_gpt_oss_parsers_do_not_mix_with_others():
    with pytest.raises(ValueError, match="Harmony"):
        ServerArgs(model="/m", reasoning_parser="qwen3", tool_call_parser="gpt-oss").validate()


def test_the_server_refuses_to_start_without_the_vocabulary(tmp_path, tiny_llama_path):
    empty = tmp_path / "no-vocab"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "sluice.runtime", "serve", "--model", str(tiny_llama_path),
         "--reasoning-parser", "gpt-oss"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TIKTOKEN_ENCODINGS_BASE": str(empty)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert "o200k" in run.stderr and "TIKTOKEN_ENCODINGS_BASE" in run.stderr, run.stderr


def test_a_reply_that_is_not_harmony_is_kept_as_content():
    text = "Plain words, no channels."
    out = HarmonyOutput()
    ids = harmony_encoding().encode(text, allowed_special=set())
    first = out.feed(ids[:2], last=False)
    rest = out.feed(ids[2:], last=True)
    assert first.content == "" and rest.content == text and not rest.reasoning
