"""The pure request rules: validation, defaults and the SamplingParams they build."""

import pytest
from pydantic import ValidationError

from sluice.runtime.entrypoints.errors import ProtocolError, from_validation_error
from sluice.runtime.entrypoints.json_types import SEED_MAX, SEED_MIN
from sluice.runtime.entrypoints.openai_protocol import (
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from sluice.runtime.entrypoints.request_params import (
    finish_reason,
    native_sampling_params,
    per_choice_params,
    stop_reason,
    to_sampling_params,
)
from sluice.runtime.ipc.messages import FinishReason, SamplingParams


def chat(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def completion(**fields):
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


def test_openai_and_extra_fields_map_onto_sampling_params():
    req = chat(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=-0.3,
        stop="END",
        stop_token_ids=[5],
        seed=42,
        ignore_eos=True,
        min_tokens=2,
        skip_special_tokens=False,
        logprobs=True,
    )
    assert to_sampling_params(req, prompt_len=10, context_len=100) == SamplingParams(
        max_new_tokens=7,
        min_new_tokens=2,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=-0.3,
        stop=["END"],
        stop_token_ids=[5],
        ignore_eos=True,
        seed=42,
        skip_special_tokens=False,
        logprobs=True,
        return_logprob=True,
    )


def test_defaults_are_openais():
    p = to_sampling_params(chat(), prompt_len=10, context_len=100)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (
        1.0,
        1.0,
        -1,
        0.0,
        1.0,
    )
    assert p.stop == [] and p.seed is None and not p.logprobs


def test_chat_without_max_tokens_may_use_the_rest_of_the_context():
    assert to_sampling_params(chat(), prompt_len=30, context_len=100).max_new_tokens == 70


def test_completions_without_max_tokens_default_to_16():
    assert to_sampling_params(completion(), prompt_len=30, context_len=100).max_new_tokens == 16


def test_max_completion_tokens_wins_over_max_tokens():
    req = chat(max_tokens=50, max_completion_tokens=5)
    assert to_sampling_params(req, 10, 100).max_new_tokens == 5


def test_a_tiny_temperature_means_greedy_and_top_k_zero_means_off():
    p = to_sampling_params(chat(temperature=1e-7, top_k=0), 10, 100)
    assert p.temperature == 0.0 and p.top_k == -1 and p.is_greedy


def test_stop_is_a_string_or_a_list_and_empty_strings_are_dropped():
    assert chat(stop="x").stop == ["x"]
    assert chat(stop=["a", "", "b", "a", "c", "d", "e"]).stop == ["a", "b", "c", "d", "e"]
    assert chat(stop=None).stop == []


def test_a_prompt_is_text_or_token_ids_or_a_list_of_those():
    assert completion(prompt="hi").prompt == ["hi"]
    assert completion(prompt=[1, 2]).prompt == [[1, 2]]
    assert completion(prompt=["hi", "yo"]).prompt == ["hi", "yo"]
    assert completion(prompt=[[3, 4], [5]]).prompt == [[3, 4], [5]]
    for bad in ([], [[]], [1, "a"], [["a"]], 5):
        with pytest.raises(ValidationError):
            completion(prompt=bad)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -0.1},
        {"temperature": "0.5"},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"max_tokens": "10"},
        {"max_tokens": 2.5},
        {"n": 0},
        {"n": MAX_N + 1},
        {"top_k": -2},
        {"min_p": 1.5},
        {"repetition_penalty": 0},
        {"frequency_penalty": 3},
        {"stream": "yes"},
        {"stop": 5},
        {"stop": ["ok", 5]},
        {"stop_token_ids": [-1]},
        {"seed": 2**64},
        {"logit_bias": {"5": 1.0}},
        {"messages": []},
        {"messages": [{"role": "", "content": "hi"}]},
        {"messages": [{"content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    ],
)
def test_invalid_fields_are_refused(fields):
    with pytest.raises(ValidationError):
        chat(**fields)


def test_validation_errors_name_the_field():
    with pytest.raises(ValidationError) as info:
        chat(temperature=-1)
    err = from_validation_error(info.value)
    assert err.status == 400 and err.param == "temperature"
    assert err.body()["error"]["type"] == "invalid_request_error"
    assert "temperature" in err.body()["error"]["message"]


def test_unknown_fields_are_refused_and_no_effect_fields_accepted():
    assert chat(user="u1", metadata={"a": "b"}, store=False).unsupported() is None
    err = chat(frobnicate=True).unsupported()
    assert err.param == "frobnicate" and "Unrecognized request argument" in err.message
    assert chat(use_beam_search=False, length_penalty=1.0).unsupported() is None
    assert chat(use_beam_search=True).unsupported().param == "use_beam_search"


def test_prompt_plus_max_tokens_beyond_the_context_is_refused():
    with pytest.raises(ProtocolError) as info:
        to_sampling_params(chat(max_tokens=91), prompt_len=10, context_len=100)
    assert info.value.code == "context_length_exceeded"
    assert "maximum context length is 100 tokens" in info.value.message
    assert "101 tokens (10 in the messages, 91 in the completion)" in info.value.message


def test_a_prompt_that_fills_the_context_is_refused():
    with pytest.raises(ProtocolError, match="maximum context length"):
        to_sampling_params(chat(), prompt_len=100, context_len=100)


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ProtocolError, match="min_tokens"):
        to_sampling_params(chat(max_tokens=3, min_tokens=4), 10, 100)


def test_stream_options_need_stream():
    with pytest.raises(ProtocolError, match="stream_options"):
        chat(stream_options={"include_usage": True}).check()
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage


def test_top_logprobs_need_logprobs():
    with pytest.raises(ProtocolError, match="top_logprobs"):
        chat(top_logprobs=2).check()


def test_n_choices_get_consecutive_seeds():
    params = to_sampling_params(chat(seed=7), 10, 100)
    assert [p.seed for p in per_choice_params(params, 3, base_seed=99)] == [7, 8, 9]
    unseeded = to_sampling_params(chat(), 10, 100)
    assert [p.seed for p in per_choice_params(unseeded, 2, base_seed=99)] == [99, 100]
    assert per_choice_params(unseeded, 1, base_seed=99)[0].seed is None


def test_derived_seeds_wrap_within_int64():
    params = to_sampling_params(chat(seed=SEED_MAX), 10, 100)
    assert [p.seed for p in per_choice_params(params, 2, 0)] == [SEED_MAX, SEED_MIN]


def test_finish_reasons_map_to_openais():
    assert finish_reason(None) is None
    assert finish_reason(FinishReason("stop", matched_token=2)) == "stop"
    assert finish_reason(FinishReason("length")) == "length"
    assert finish_reason(FinishReason("abort", message="x")) == "abort"
    assert stop_reason(FinishReason("stop", matched_str="###")) == "###"


def test_native_generate_params_use_sglang_names_and_default_to_128_tokens():
    req = GenerateRequest.model_validate(
        {"text": "hi", "sampling_params": {"temperature": 0, "stop": "x", "min_new_tokens": 1}}
    )
    (sp,) = req.sampling_params
    p = native_sampling_params(req, sp, prompt_len=10, context_len=1000)
    assert (p.max_new_tokens, p.temperature, p.stop, p.min_new_tokens) == (128, 0.0, ["x"], 1)
    assert native_sampling_params(req, sp, prompt_len=10, context_len=50).max_new_tokens == 40


def test_null_fields_take_their_defaults():
    req = completion(n=None, stream=None, max_tokens=None, stop=None, temperature=None)
    assert (req.n, req.stream, req.max_tokens, req.stop, req.temperature) == (
        1,
        False,
        16,
        [],
        None,
    )


def test_top_logprobs_default_to_zero():
    assert chat(logprobs=True).top_logprobs_num() == 0
