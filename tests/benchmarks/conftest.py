"""Makes the repository's `benchmarks` package importable, and builds tiny tokenizers.

The tokenizers are made here from `tokenizers` models, so the benchmark's pure parts are
tested with no server, no network and no model weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture(scope="session")
def word_tokenizer():
    """Whitespace-separated words, one token each: decode/encode round trips exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


@pytest.fixture(scope="session")
def byte_bpe_tokenizer():
    """A small byte-level BPE like GPT-2's and SmolLM2's, trained on a few lines with
    multi-byte characters, so some of its tokens are partial UTF-8 sequences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [
        "The quick brown fox jumps over the lazy dog, again and again.",
        "Sluice serves language models with continuous batching: café, naïve, 東京, 😀.",
    ]
    tok.train_from_iterator(lines * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
