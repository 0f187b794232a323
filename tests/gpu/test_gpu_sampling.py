"""FlashInfer's sampling kernels through `flashinfer_sample`: greedy rows are the argmax,
every drawn token lies in the set the torch filters allow (temperature, top-k, top-p,
min-p as `sampler.warp` defines them), and a seeded row draws the same token
wherever it sits in the batch."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.engine.sampler import warp
from sluice.runtime.ipc.messages import SamplingParams

VOCAB = 4096


@pytest.fixture(scope="module")
def fi_sample(device):
    if device != "cuda":
        pytest.skip("FlashInfer needs a GPU")
    pytest.importorskip("flashinfer")
    from sluice.runtime.engine.flashinfer_sampling import flashinfer_sample

    return flashinfer_sample


def _rows(n: int):
    """Per-row (temperature, top_k, top_p, min_p), covering each filter alone and together."""
    combos = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 20, 1.0, 0.0), (1.0, 0, 0.8, 0.0),
              (1.0, 0, 1.0, 0.1), (1.3, 50, 0.9, 0.05), (0.5, 1, 1.0, 0.0), (1.0, 5, 0.5, 0.2)]  # fmt: skip
    return [combos[i % len(combos)] for i in range(n)]


def _tensors(rows, device):
    t, k, p, m = zip(*rows, strict=True)
    return (torch.tensor(t, device=device), torch.tensor(k, dtype=torch.int32, device=device),
            torch.tensor(p, device=device), torch.tensor(m, device=device))  # fmt: skip


def test_drawn_tokens_lie_in_the_filtered_set_and_greedy_rows_take_the_argmax(fi_sample):
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(64, VOCAB, device="cuda", generator=gen) * 3
    rows = _rows(64)
    temperature, top_k, top_p, min_p = _tensors(rows, "cuda")
    for draw in range(20):
        tokens = fi_sample(logits, temperature, top_k, top_p, min_p, generator=gen)
        assert tokens.shape == (64,) and tokens.dtype == torch.int64
        for i, (t, k, p, m) in enumerate(rows):
            if t == 0.0:
                assert tokens[i] == logits[i].argmax(), f"greedy row {i}"
                continue
            params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
            allowed = warp(logits[i : i + 1].double(), [params]).softmax(-1)[0]
            assert allowed[tokens[i]] > 0, f"row {i} draw {draw}: token outside the allowed set"


def test_top_k_1_is_the_argmax(fi_sample):
    logits = torch.randn(16, VOCAB, device="cuda")
    ones = torch.ones(16, device="cuda")
    tokens = fi_sample(logits, ones, torch.ones(16, dtype=torch.int32, device="cuda"), ones,
                       torch.zeros(16, device="cuda"))  # fmt: skip
    assert torch.equal(tokens, logits.argmax(-1))


def test_a_seeded_row_draws_the_same_token_wherever_it_sits(fi_sample):
    logits = torch.randn(8, VOCAB, device="cuda")
    temperature, top_k, top_p, min_p = _tensors([(1.0, 0, 1.0, 0.0)] * 8, "cuda")
    seeds = torch.full((8,), -1, dtype=torch.int64)
    offsets = torch.zeros(8, dtype=torch.int64)
    seeds[2], offsets[2] = 1234, 8
    first = fi_sample(logits, temperature, top_k, top_p, min_p, seeds=seeds, offsets=offsets)
    # the same request (same logits row, seed and offset) moved to row 6 of another batch
    moved = torch.randn(8, VOCAB, device="cuda")
    moved[6] = logits[2]
    seeds2 = torch.full((8,), -1, dtype=torch.int64)
    offsets2 = torch.zeros(8, dtype=torch.int64)
    seeds2[6], offsets2[6] = 1234, 8
    second = fi_sample(moved, temperature, top_k, top_p, min_p, seeds=seeds2, offsets=offsets2)
    assert first[2] == second[6]
    draws = set()
    for offset in range(0, 400, 4):  # the offset moves the stream on: draws differ
        offsets2[6] = offset
        draws.add(int(fi_sample(moved, temperature, top_k, top_p, min_p, seeds=seeds2,
                                offsets=offsets2)[6]))  # fmt: skip
    assert len(draws) > 1
