"""Logprobs through the real server equal transformers' log_softmax of the same fp32 model:
the chosen token's, the top-k alternatives (sorted, the chosen one among them when it is
best), and the prompt's, at every position."""

from __future__ import annotations

import httpx
import pytest
import torch
from server_process import serve

pytestmark = pytest.mark.integration

PROMPT = [11, 57, 203, 9, 88, 140, 31]
K = 5
TOL = 1e-3


@pytest.fixture(scope="module")
def hf_model(tiny_llama_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(tiny_llama_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("logprobs") / "server.log"
    with serve(tiny_llama_path, log, "--dtype", "float32") as srv:
        yield srv


@torch.inference_mode()
def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_generate_output_and_top_logprobs_match_transformers(server, hf_model):
    body = {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": K,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    meta = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["meta_info"]
    chosen, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    tokens = [t for _, t, *_ in chosen]
    ref = hf_logprobs(hf_model, PROMPT + tokens)
    for i, ((lp, token, *_), top) in enumerate(zip(chosen, tops, strict=True)):
        row = ref[len(PROMPT) - 1 + i]
        assert lp == pytest.approx(row[token].item(), abs=TOL)
        want = row.topk(K)
        assert [t for _, t, *_ in top] == want.indices.tolist()
        assert [v for v, *_ in top] == pytest.approx(want.values.tolist(), abs=TOL)
        assert [v for v, *_ in top] == sorted((v for v, *_ in top), reverse=True)
        assert token == top[0][1]  # greedy: the chosen token is the best


def test_prompt_logprobs_match_transformers(server, hf_model):
    body = {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
    meta = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["meta_info"]
    got = meta["input_token_logprobs"]
    ref = hf_logprobs(hf_model, PROMPT)
    want = [ref[i - 1, PROMPT[i]].item() for i in range(1, len(PROMPT))]
    assert [v for v in _values(got)] == pytest.approx(want, abs=TOL)


def test_prompt_logprobs_of_a_cached_prompt_are_computed_again(server, hf_model):
    # the same prompt twice: the second could reuse the cached prefix, but its logprobs
    # need the logits there, so those positions are computed, not matched
    body = {"input_ids": PROMPT + [5, 6], "return_logprob": True, "logprob_start_len": 3,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
    first = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["meta_info"]
    second = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["meta_info"]
    ids = PROMPT + [5, 6]
    ref = hf_logprobs(hf_model, ids)
    want = [ref[i - 1, ids[i]].item() for i in range(3, len(ids))]
    for meta in (first, second):
        assert list(_values(meta["input_token_logprobs"])) == pytest.approx(want, abs=TOL)


def test_chat_top_logprobs_match_transformers(server, hf_model):
    messages = [{"role": "user", "content": "Hello there"}]
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": 6, "temperature": 0,
        "logprobs": True, "top_logprobs": K, "return_tokens_as_token_ids": True,
        "return_token_ids": True, "ignore_eos": True}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt_token_ids"]
    content = r.json()["choices"][0]["logprobs"]["content"]
    tokens = [int(c["token"].removeprefix("token_id:")) for c in content]
    ref = hf_logprobs(hf_model, prompt + tokens)
    for i, c in enumerate(content):
        row = ref[len(prompt) - 1 + i]
        assert c["logprob"] == pytest.approx(row[tokens[i]].item(), abs=TOL)
        want = row.topk(K)
        assert [
            int(t["token"].removeprefix("token_id:")) for t in c["top_logprobs"]
        ] == want.indices.tolist()
        assert [t["logprob"] for t in c["top_logprobs"]] == pytest.approx(
            want.values.tolist(), abs=TOL
        )


def _values(entries):
    for e in entries:
        yield e[0] if isinstance(e, list) else e
