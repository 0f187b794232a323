"""Hand-written hostile input a schema cannot express, against one real server (a padded
vocabulary: ids in [512, 640) are the model's but no text tokenizes to them), each case
with the status OpenAI's contract gives it: out-of-range or malformed input is a 400 naming
what is wrong, extreme-but-valid values are served. After all of them: the server is up
and its KV pool is all free.
"""

from __future__ import annotations

import json

import httpx
import pytest
from reliability_kit import PADDED_VOCAB, TOKENIZER_SIZE, make_padded_llama
from server_process import serve

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "Once upon", "max_tokens": 4}


def nested(depth: int) -> str:
    return '{"prompt": "a", "max_tokens": 2, "user": "x", "metadata": ' + "[" * depth + "]" * depth + "}"


# (name, route, body: a dict sent as JSON or raw bytes, status, the error's param)
CASES = [
    ("prompt id past the vocab", "/v1/completions", {"prompt": [5, PADDED_VOCAB], "max_tokens": 2}, 400, "prompt"),
    ("negative prompt id", "/v1/completions", {"prompt": [5, -1], "max_tokens": 2}, 400, "prompt"),
    ("id past the tokenizer, in the vocab", "/v1/completions", {"prompt": [5, TOKENIZER_SIZE + 3], "max_tokens": 2}, 200, None),
    ("generate id past the vocab", "/generate", {"input_ids": [5, 10**6], "sampling_params": {"max_new_tokens": 2}}, 400, None),
    ("stop_token_ids past the vocab, min_tokens", "/v1/chat/completions", {**CHAT, "stop_token_ids": [10**6], "min_tokens": 2}, 400, "stop_token_ids"),
    ("stop_token_ids in the padding, min_tokens", "/v1/chat/completions", {**CHAT, "stop_token_ids": [PADDED_VOCAB - 1], "min_tokens": 2}, 200, None),
    ("temperature NaN", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, None),
    ("temperature 1e999", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', 400, "temperature"),
    ("temperature 1e30", "/v1/chat/completions", {**CHAT, "temperature": 1e30}, 200, None),
    ("temperature -1e30", "/v1/chat/completions", {**CHAT, "temperature": -1e30}, 400, "temperature"),
    ("top_p 1e30", "/v1/chat/completions", {**CHAT, "top_p": 1e30}, 400, "top_p"),
    ("repetition_penalty 1e30", "/v1/chat/completions", {**CHAT, "repetition_penalty": 1e30}, 200, None),
    ("frequency_penalty -1e30", "/v1/completions", {**COMPLETION, "frequency_penalty": -1e30}, 400, "frequency_penalty"),
    ("logprobs 10^6", "/v1/completions", {**COMPLETION, "logprobs": 10**6}, 400, "logprobs"),
    ("top_logprobs 10^6", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 10**6}, 400, "top_logprobs"),
    ("n 10^5", "/v1/chat/completions", {**CHAT, "n": 10**5}, 400, "n"),
    ("max_tokens 10^30", "/v1/completions", {**COMPLETION, "max_tokens": 10**30}, 400, "max_tokens"),
    ("seed 2^64", "/v1/completions", {**COMPLETION, "seed": 2**64}, 400, "seed"),
    ("lone surrogate in the prompt", "/v1/completions", b'{"prompt": "hi \\ud800 there", "max_tokens": 2}', 400, None),
    ("lone surrogate in a message", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400, None),
    ("5,000 stop strings (at most 16)", "/v1/completions", {**COMPLETION, "stop": [f"stop{i}" for i in range(5000)]}, 400, "stop"),
    ("a 300-character stop string (at most 256)", "/v1/completions", {**COMPLETION, "stop": ["x" * 300]}, 400, "stop"),
    ("JSON nested 10,000 deep", "/v1/completions", nested(10_000).encode(), 400, None),
    ("not JSON", "/v1/completions", b'{"prompt": "a", ', 400, None),
    ("a JSON array", "/v1/completions", b"[1, 2, 3]", 400, None),
    ("not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    with serve(make_padded_llama(folder / "padded-llama"), folder / "server.log") as srv:
        yield srv


@pytest.mark.parametrize("name, route, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_request_gets_its_status(server, name, route, body, status, param):
    if isinstance(body, bytes):
        r = httpx.post(server.url + route, content=body, timeout=120,
                       headers={"Content-Type": "application/json"})  # fmt: skip
    else:
        r = httpx.post(server.url + route, content=json.dumps(body), timeout=120,
                       headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == status, (name, r.status_code, r.text[:400])
    if status >= 400:
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], err
        if param is not None:
            assert err["param"] == param, err
    elif route != "/generate":
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop"), r.json()


def test_after_all_of_them_the_server_is_up_and_its_pool_free(server):
    assert server.proc.poll() is None, server.log_tail()
    assert httpx.get(server.url + C.HEALTH_PATH, timeout=10).status_code == 200
    stats = server.wait_idle(timeout=60)["scheduler_stats"]
    assert stats["free_tokens"] == stats["max_total_tokens"]
