"""Tool-call parsers on hand-written model outputs; streaming (any chunking) equals the
whole parse, and each call's deltas start with the name then carry only arguments."""

import json

import pytest

from sluice.runtime.entrypoints.tool_parsers import (
    NamedFunctionParser,
    RequiredParser,
    get_tool_parser,
)
from sluice.runtime.entrypoints.tool_parsers.base import assemble

CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',  # noqa: E501
     "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("qwen25", '<tool_call>\n{"name": "a", "arguments": {"x": [1, {"y": "}<tool_call>"}]}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',  # noqa: E501
     None, [("a", {"x": [1, {"y": "}<tool_call>"}]}), ("b", {})]),
    ("hermes", '<tool_call>\n{"arguments": {"q": "\\"quoted\\""}, "name": "search"}\n</tool_call>',
     None, [("search", {"q": '"quoted"'})]),
    ("hermes", "No tools here, 1 < 2 and <b>bold</b>.", "No tools here, 1 < 2 and <b>bold</b>.", []),
    ("hermes", "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ("hermes", '<tool_call>\n{"name": "f"}\n</tool_call>', None, [("f", {})]),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": "x;y"}}',  # noqa: E501
     None, [("f", {"a": 1}), ("g", {"b": "x;y"})]),
    ("llama3_json", '{"name": "f", "arguments": {"a": true}}', None, [("f", {"a": True})]),
    ("llama3_json", "  The answer is {4}.", "  The answer is {4}.", []),
]


def _calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_whole_output_parses_into_content_and_calls(name, text, content, calls):
    parsed = get_tool_parser(name).parse(text)
    assert parsed.content == content and _calls(parsed) == calls


@pytest.mark.parametrize("name, text, content, calls", CASES)
@pytest.mark.parametrize("size", [1, 2, 7])
def test_streaming_in_any_chunks_equals_the_whole_parse(name, text, content, calls, size):
    stream = get_tool_parser(name).streaming()
    deltas = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
    deltas.append(stream.finish())
    streamed = assemble(deltas)
    assert streamed.content == content and _calls(streamed) == calls
    seen: set[int] = set()
    for d in deltas:
        for c in d.tool_calls:
            if c.index not in seen:
                assert c.id and c.name and c.arguments == ""  # the head comes first
                seen.add(c.index)
            else:
                assert c.id is None and c.name is None and c.arguments


def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far():
    parsed = get_tool_parser("hermes").parse('<tool_call>\n{"name": "f", "arguments": {"a": "unfin')
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", '{"a": "unfin')]


def test_forced_shapes():
    assert _calls(NamedFunctionParser("f").parse('{"a": 1}')) == [("f", {"a": 1})]
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    assert _calls(RequiredParser().parse(text)) == [("f", {"a": 1}), ("g", {})]


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("mistral")


def test_the_parsers_the_flags_offer_are_the_ones_implemented():
    """The text parsers, and gpt-oss's Harmony, which reads the token ids instead
    (`entrypoints/harmony.py`, tested in tests/http/test_http_harmony.py)."""
    from sluice.runtime.constants import HARMONY_PARSER, TOOL_CALL_PARSERS
    from sluice.runtime.entrypoints.tool_parsers import TOOL_PARSERS

    assert set(TOOL_CALL_PARSERS) == set(TOOL_PARSERS) | {HARMONY_PARSER}
