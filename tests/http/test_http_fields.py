"""No silently ignored fields: each refused field is a 400 naming it; fields that change
nothing are accepted; the not-yet-wired features are refused until the scheduler lists
them in SchedulerReady.features, and then reach SamplingParams."""

import pytest
from fastapi.testclient import TestClient
from http_fakes import MODEL, FakeTM

from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.entrypoints.request_fields import COMMON_REFUSED, NO_EFFECT, SAMPLING_REFUSED
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.server_args import ServerArgs

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": MODEL, "prompt": "hi"}
ON = {  # a value that asks for the feature, per refused field
    "length_penalty": 0.5,
    "stream_interval": 4,
    "include_reasoning": False,
    "stream_reasoning": False,
    "return_mm_kwargs": False,
    "bad_words": ["x"],
    "allowed_token_ids": [1],
}
PERSON = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
NOT_YET = [  # (route body, field named in the error)
    ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}, "response_format"),  # noqa: E501
    ({**CHAT, "guided_json": PERSON}, "guided_json"),
    ({**CHAT, "guided_regex": "[a-z]+"}, "guided_regex"),
    ({**CHAT, "guided_choice": ["a", "b"]}, "guided_choice"),
    ({**CHAT, "guided_grammar": 'root ::= "a"'}, "guided_grammar"),
    ({**CHAT, "structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ({**CHAT, "regex": "a+"}, "regex"),
    ({**CHAT, "ebnf": 'root ::= "a"'}, "ebnf"),
    ({**COMPLETION, "json_schema": '{"type": "integer"}'}, "json_schema"),
    ({**CHAT, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ({**COMPLETION, "logprobs": 3}, "logprobs"),
    ({**CHAT, "prompt_logprobs": 1}, "prompt_logprobs"),
    ({**COMPLETION, "echo": True, "logprobs": 0}, "echo"),
    ({**CHAT, "spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({**CHAT, "priority": 3}, "priority"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tool_choice"),  # noqa: E501
]


def _path(body):
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def assert_400_naming(r, field):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"], err
    return err


@pytest.mark.parametrize("field", sorted(COMMON_REFUSED))
def test_each_refused_field_is_a_400_naming_it(client, tm, field):
    value = ON.get(field, True)
    err = assert_400_naming(client.post("/v1/chat/completions", json={**CHAT, field: value}), field)
    assert err["code"] == "unsupported_parameter" and COMMON_REFUSED[field].reason in err["message"]
    assert tm.requests == []


@pytest.mark.parametrize("field", sorted(COMMON_REFUSED))
def test_a_refused_field_with_its_off_value_is_accepted(client, field):
    off = COMMON_REFUSED[field].off[0]
    assert client.post("/v1/completions", json={**COMPLETION, field: off}).status_code == 200


@pytest.mark.parametrize("field", sorted(SAMPLING_REFUSED))
def test_each_refused_sampling_param_of_generate_is_a_400_naming_it(client, field):
    body = {"text": "hi", "sampling_params": {field: ON.get(field, "x")}}
    assert_400_naming(client.post("/generate", json=body), f"sampling_params.{field}")


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**CHAT, "temprature": 0.5}),
    ("/v1/completions", {**COMPLETION, "max_token": 3}),
    ("/generate", {"text": "hi", "sampling_params": {"max_tokens": 3}}),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True, "x": 1}}),  # noqa: E501
])  # fmt: skip
def test_a_misspelt_field_is_a_400_not_ignored(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"], r.text


@pytest.mark.parametrize("field", sorted(NO_EFFECT))
def test_fields_that_change_nothing_are_accepted(client, field):
    assert client.post("/v1/chat/completions", json={**CHAT, field: "x"}).status_code == 200


@pytest.mark.parametrize("body, field", NOT_YET, ids=[f for _, f in NOT_YET])
def test_features_the_scheduler_lacks_are_refused_not_yet(client, tm, body, field):
    err = assert_400_naming(client.post(_path(body), json=body), field)
    assert "not supported yet" in err["message"] or "--schedule-policy" in err["message"]
    assert tm.requests == []


@pytest.fixture
def wired(tokenizer):
    tm = FakeTM(tokenizer, features=ALL_FEATURES)
    with TestClient(build_app(tm, ServerArgs(model="/models/tiny"))) as c:
        yield c, tm


@pytest.mark.parametrize(
    "body, kind, spec",
    [
        ({**CHAT, "response_format": {"type": "json_object"}}, "json_object", ""),
        ({**CHAT, "guided_json": PERSON}, "json_schema", None),
        ({**CHAT, "guided_regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({**CHAT, "guided_choice": ["a", "b"]}, "choice", '["a", "b"]'),
        ({**CHAT, "guided_grammar": 'start: "a"'}, "lark", 'start: "a"'),
        ({**CHAT, "ebnf": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
        ({"text": "hi", "sampling_params": {"regex": "b+"}}, "regex", "b+"),
    ],
)
def test_once_wired_a_constraint_reaches_sampling_params(wired, body, kind, spec):
    client, tm = wired
    path = "/generate" if "text" in body else _path(body)
    assert client.post(path, json=body).status_code == 200
    c = tm.requests[0][1].constraint
    assert c.kind == kind and (spec is None or c.spec == spec)


def test_strict_false_reaches_the_constraint(wired):
    client, tm = wired
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": False}}
    client.post("/v1/chat/completions", json={**CHAT, "response_format": rf})
    assert tm.requests[0][1].constraint.strict is False


@pytest.mark.parametrize(
    "body, field, reason",
    [
        ({**CHAT, "guided_json": {"type": "object", "properties": 5}}, "guided_json", "properties"),
        ({**CHAT, "guided_regex": "(("}, "guided_regex", "parenthesis"),
        ({**CHAT, "guided_grammar": "root ::= nope"}, "guided_grammar", "nope"),
        ({**CHAT, "regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
    ],
)
def test_a_constraint_the_library_cannot_compile_is_a_400_with_its_reason(
    wired, body, field, reason
):
    client, tm = wired
    err = assert_400_naming(client.post("/v1/chat/completions", json=body), field)
    assert reason in err["message"] and tm.requests == []


def test_once_wired_top_logprobs_and_priority_reach_sampling_params(tokenizer):
    tm = FakeTM(tokenizer, features=ALL_FEATURES)
    args = ServerArgs(model="/m", max_top_logprobs=5)
    object.__setattr__(args, "schedule_policy", "priority")  # the lead adds the policy
    with TestClient(build_app(tm, args)) as c:
        body = {**CHAT, "logprobs": True, "top_logprobs": 5, "priority": -2}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        r = c.post("/v1/chat/completions", json={**body, "top_logprobs": 6})
        assert r.status_code == 400 and "--max-top-logprobs" in r.json()["error"]["message"]
    p = tm.requests[0][1]
    assert (p.top_logprobs_num, p.priority, p.return_logprob) == (5, -2, True)
