"""Our Llama-family forward over a paged KV cache equals transformers' forward (fp32)."""

from __future__ import annotations

import pytest
import torch
from model_harness import (
    ModelPair,
    PagedRunner,
    assert_logits_close,
    assert_same_greedy_tokens,
    prompt,
)


def test_single_request_prefill_matches_hf_at_every_position(pair: ModelPair) -> None:
    ids = prompt(23, seed=0, vocab=pair.config.vocab_size)
    runner = PagedRunner(pair.model, page_size=1)

    ours = runner.extend([(0, ids)], return_all_logits=True)

    reference = pair.hf_logits(ids)
    assert_logits_close(ours, reference)
    assert_same_greedy_tokens(ours, reference)


def test_prefill_returns_only_the_last_tokens_logits_by_default(pair: ModelPair) -> None:
    ids = prompt(9, seed=1, vocab=pair.config.vocab_size)
    ours = PagedRunner(pair.model, page_size=1).extend([(0, ids)])
    assert ours.shape == (1, pair.config.vocab_size)
    assert_logits_close(ours[0], pair.hf_logits(ids)[-1])


@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_of_different_lengths_matches_hf(pair: ModelPair, page_size: int) -> None:
    lengths = [5, 17, 33, 1]
    prompts = [prompt(n, seed=10 + i, vocab=pair.config.vocab_size) for i, n in enumerate(lengths)]
    runner = PagedRunner(pair.model, page_size=page_size)

    ours = runner.extend([(row, ids) for row, ids in enumerate(prompts)])

    reference = torch.stack([pair.hf_logits(ids)[-1] for ids in prompts])
    assert_logits_close(ours, reference)
    assert_same_greedy_tokens(ours, reference)


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_on_a_shared_cached_prefix_matches_hf(pair: ModelPair, page_size: int) -> None:
    vocab = pair.config.vocab_size
    shared = prompt(32, seed=20, vocab=vocab)
    first_suffix, second_suffix = prompt(5, seed=21, vocab=vocab), prompt(11, seed=22, vocab=vocab)
    runner = PagedRunner(pair.model, page_size=page_size)
    runner.extend([(0, shared)])  # prefill the prefix once
    runner.extend([(0, first_suffix)])
    runner.share_prefix(dst=1, src=0, length=len(shared))

    ours = runner.extend([(1, second_suffix)], return_all_logits=True)

    reference = pair.hf_logits(shared + second_suffix)[len(shared) :]
    assert_logits_close(ours, reference)
    assert_same_greedy_tokens(ours, reference)


def test_mixed_batch_of_cached_and_fresh_requests_matches_hf(pair: ModelPair) -> None:
    vocab = pair.config.vocab_size
    head, tail, fresh = prompt(16, 30, vocab), prompt(7, 31, vocab), prompt(12, 32, vocab)
    runner = PagedRunner(pair.model, page_size=16)
    runner.extend([(0, head)])

    ours = runner.extend([(0, tail), (1, fresh)], return_all_logits=True)

    reference = torch.cat([pair.hf_logits(head + tail)[len(head) :], pair.hf_logits(fresh)])
    assert_logits_close(ours, reference)


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_decode_steps_match_hf_full_sequence_logits(pair: ModelPair, page_size: int) -> None:
    vocab, steps = pair.config.vocab_size, 6
    prompts = [prompt(n, seed=40 + n, vocab=vocab) for n in (3, 14, 20)]
    runner = PagedRunner(pair.model, page_size=page_size)
    sequences = [list(ids) for ids in prompts]
    step_logits = [[] for _ in prompts]

    logits = runner.extend(list(enumerate(prompts)))
    for _ in range(steps):
        for row, row_logits in enumerate(logits):
            step_logits[row].append(row_logits)
            sequences[row].append(int(row_logits.argmax()))
        logits = runner.decode([(row, seq[-1]) for row, seq in enumerate(sequences)])

    for row, ids in enumerate(sequences):
        reference = pair.hf_logits(ids)[len(prompts[row]) - 1 : -1]
        ours = torch.stack(step_logits[row])
        assert_logits_close(ours, reference)
        assert_same_greedy_tokens(ours, reference)


def test_decode_of_many_requests_with_ragged_lengths_matches_hf(
    model_pairs: dict[str, ModelPair],
) -> None:
    pair = model_pairs["llama"]
    vocab = pair.config.vocab_size
    prompts = [prompt(1 + 3 * i, seed=50 + i, vocab=vocab) for i in range(12)]
    runner = PagedRunner(pair.model, page_size=4, num_pages=128, max_requests=12)
    runner.extend(list(enumerate(prompts)))
    next_tokens = [prompt(1, seed=70 + i, vocab=vocab)[0] for i in range(len(prompts))]

    ours = runner.decode(list(enumerate(next_tokens)))

    reference = torch.stack(
        [pair.hf_logits(ids + [t])[-1] for ids, t in zip(prompts, next_tokens, strict=True)]
    )
    assert_logits_close(ours, reference)
