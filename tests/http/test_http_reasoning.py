"""`--reasoning-parser qwen3`: Qwen3's `<think>` block becomes `reasoning_content`, streamed
and not, read through the official `openai` client; `enable_thinking: false` reaches a
Qwen3-shaped chat template; Qwen3's tool calls (hermes shape) after its reasoning."""

import json

import openai
import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM, chat_with_reasoning

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.entrypoints.reasoning import ReasoningSplitter, split_reasoning
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.server_args import ServerArgs

# Qwen3's template, shortened: tools in the system turn, calls as <tool_call> JSON, and an
# empty think block after the generation prompt when enable_thinking is false
QWEN3_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
THINKING_REPLY = ["<thi", "nk>\nThe user greets", " me.</th", "ink>\n", "\nHello", " there!"]
MESSAGES = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


@pytest.fixture
def qwen3_tokenizer():
    from tiny_model import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def make_client(tokenizer, reply, reasoning="qwen3", tools=""):
    tm = FakeTM(tokenizer, reply=reply, features=ALL_FEATURES, context_len=1024)
    args = ServerArgs(model="/m", reasoning_parser=reasoning, tool_call_parser=tools)
    http = TestClient(build_app(tm, args))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                           max_retries=0)  # fmt: skip
    return client, tm, http


@pytest.mark.parametrize(
    "text, reasoning, content",
    [
        ("<think>\nA plan.\n</think>\n\nThe answer.", "\nA plan.\n", "The answer."),
        ("The answer, no thinking.", "", "The answer, no thinking."),
        ("<think>cut short", "cut short", ""),
        ("<thi", "", "<thi"),
        ("  <think>a</think>b", "a", "b"),
    ],
)
def test_a_whole_reply_splits_into_reasoning_and_content(text, reasoning, content):
    split = split_reasoning(text)
    assert (split.reasoning, split.content) == (reasoning, content)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_any_streaming_cut_gives_the_whole_replys_split(size):
    text = "<think>\nWeigh </thin and </ options.\n</think>\n\nDone </think> here."
    splitter = ReasoningSplitter()
    parts = [splitter.feed(text[i : i + size]) for i in range(0, len(text), size)]
    parts.append(splitter.finish())
    whole = split_reasoning(text)
    assert "".join(p.reasoning for p in parts) == whole.reasoning
    assert "".join(p.content for p in parts) == whole.content == "Done </think> here."


def test_reasoning_content_is_separated(qwen3_tokenizer):
    client, _, _ = make_client(qwen3_tokenizer, THINKING_REPLY)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    message = r.choices[0].message
    assert message.content == "Hello there!"
    assert message.model_extra["reasoning_content"] == "\nThe user greets me."


def test_streamed_reasoning_arrives_as_reasoning_deltas(qwen3_tokenizer):
    client, _, _ = make_client(qwen3_tokenizer, THINKING_REPLY)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas]
    assert "".join(r for r in reasoning if r) == "\nThe user greets me."
    assert "".join(d.content or "" for d in deltas) == "Hello there!"
    assert sum(1 for r in reasoning if r) > 1  # streamed in pieces, not at the end
    assert not any(d.content and "think>" in d.content for d in deltas)


def test_separate_reasoning_false_keeps_the_think_block_in_content(qwen3_tokenizer):
    client, _, _ = make_client(qwen3_tokenizer, THINKING_REPLY)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                       extra_body={"separate_reasoning": False})  # fmt: skip
    assert r.choices[0].message.content == "".join(THINKING_REPLY)
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_without_a_reasoning_parser_the_reply_is_all_content(qwen3_tokenizer):
    client, _, _ = make_client(qwen3_tokenizer, THINKING_REPLY, reasoning="")
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert r.choices[0].message.content == "".join(THINKING_REPLY)


def test_stream_reasoning_false_is_refused_as_not_supported(qwen3_tokenizer):
    _, _, http = make_client(qwen3_tokenizer, THINKING_REPLY)
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES,
                                                "stream_reasoning": False})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_reasoning"


def test_enable_thinking_false_reaches_the_template(qwen3_tokenizer):
    client, tm, _ = make_client(qwen3_tokenizer, ["Hello."])
    client.chat.completions.create(model=MODEL, messages=MESSAGES)
    client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    thinking, direct = (qwen3_tokenizer.decode(ids) for ids, *_ in tm.requests)
    assert thinking.endswith("<|im_start|>assistant\n")
    assert direct.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_calls_after_reasoning(qwen3_tokenizer, stream):
    reply = ["<think>\nI need the weather.\n</think>\n\n", "<tool_call>\n{\"name\": \"get_",
             "weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]  # fmt: skip
    client, tm, _ = make_client(qwen3_tokenizer, reply, tools="qwen25")
    final, reasoning, _ = chat_with_reasoning(
        client, stream, model=MODEL, messages=MESSAGES, tools=[WEATHER]
    )
    choice = final.choices[0]
    assert reasoning == "\nI need the weather.\n"
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == [("get_weather", {"city": "Paris"})]  # fmt: skip
    assert not choice.message.content
    assert '"name": "get_weather"' in qwen3_tokenizer.decode(
        tm.requests[0][0]
    )  # tools in the prompt


# Qwen3-2507 Thinking (and DeepSeek-R1): the template opens the block, the reply has no <think>
OPENING_TEMPLATE = QWEN3_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n",
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n",
)


@pytest.mark.parametrize("stream", [False, True])
def test_a_template_that_opens_the_think_block_puts_the_reply_in_reasoning(qwen3_tokenizer, stream):
    assert OPENING_TEMPLATE != QWEN3_TEMPLATE
    qwen3_tokenizer.chat_template = OPENING_TEMPLATE
    client, tm, _ = make_client(qwen3_tokenizer, ["Let me ", "think.\n</th", "ink>\n\nParis", "."])
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
    else:
        message = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
        thought, content = message.reasoning_content, message.content
    assert tm.tokenizer.decode(tm.requests[-1][0]).endswith("<think>\n")
    assert (thought, content) == ("Let me think.\n", "Paris.")
    r = client.responses.create(model=MODEL, input="hi")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Let me think.\n" and r.output_text == "Paris."


def test_deepseek_r1_is_the_same_split(qwen3_tokenizer):
    qwen3_tokenizer.chat_template = OPENING_TEMPLATE  # R1's template opens <think> too
    client, _, _ = make_client(qwen3_tokenizer, ["Hmm.", "</think>", "Done."], reasoning="deepseek_r1")
    message = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
    assert (message.reasoning_content, message.content) == ("Hmm.", "Done.")


def test_a_reply_to_a_template_without_the_open_block_stays_content(qwen3_tokenizer):
    client, _, _ = make_client(qwen3_tokenizer, ["Paris", "."])
    message = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
    assert not message.reasoning_content and message.content == "Paris."


@pytest.mark.parametrize("pieces", [["<think>\nabc</think>\n\nhi"], ["<th", "ink>", "\nabc</think>hi"]])
def test_a_think_tag_repeated_after_the_templates_own_is_dropped(pieces):
    from sluice.runtime.entrypoints.reasoning import ReasoningSplitter

    splitter = ReasoningSplitter.starting(True)
    parts = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    assert "".join(p.reasoning for p in parts) == "abc"
    assert "".join(p.content for p in parts) == "hi"
