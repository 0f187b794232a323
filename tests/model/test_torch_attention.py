"""The torch backend equals plain per-request causal attention over the paged KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 8


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int):
    """q `[n, H, D]` at positions prefix..prefix+n-1; k, v `[prefix+n, KV, D]`."""
    group = HEADS // KV_HEADS
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HEAD_DIM)
    allowed = torch.arange(k.shape[0])[None, :] <= (prefix + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_batch(mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int], seed: int):
    """Random cached K/V for the prefixes, random new q/k/v; returns ours and the reference."""
    generator = torch.Generator().manual_seed(seed)
    num_reqs, max_len = (
        len(prefix_lens),
        max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)),
    )
    kv = KVBuffers(4096, 1, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    kv.k[0].normal_(generator=generator)
    kv.v[0].normal_(generator=generator)
    req_to_token = torch.zeros(num_reqs + 1, max_len + 3, dtype=torch.int32)
    slots = torch.randperm(4095, generator=generator)[: num_reqs * max_len] + 1  # never slot 0
    locs = []
    for i, (prefix, extend) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        row = slots[i * max_len : i * max_len + prefix + extend]
        req_to_token[i + 1, : len(row)] = row.to(torch.int32)
        req_to_token[i + 1, len(row) :] = 4095  # stale entries past seq_len must be ignored
        locs.append(row[prefix:])
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator)
    k = torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator)
    v = torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    batch = ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        positions=torch.zeros(num_tokens, dtype=torch.int64),
        out_cache_loc=torch.cat(locs).to(torch.int64),
        req_pool_indices=torch.arange(1, num_reqs + 1),
        seq_lens=torch.tensor(seq_lens),
        prefix_lens=torch.tensor(prefix_lens),
        extend_lens=torch.tensor(extend_lens),
        seq_lens_cpu=seq_lens,
        prefix_lens_cpu=prefix_lens,
        extend_lens_cpu=extend_lens,
        req_to_token=req_to_token,
        kv=kv,
    )
    cached_k, cached_v = kv.k[0].clone(), kv.v[0].clone()
    backend = TorchAttentionBackend()
    backend.init_forward_metadata(batch)
    ours = backend.forward(q, k, v, 0, batch)

    expected, start = [], 0
    for i, (prefix, extend) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        row = req_to_token[i + 1, :prefix].long()
        keys = torch.cat([cached_k[row], k[start : start + extend]])
        values = torch.cat([cached_v[row], v[start : start + extend]])
        expected.append(reference_attention(q[start : start + extend], keys, values, prefix))
        start += extend
    return ours, torch.cat(expected), batch, k, v


def test_decode_of_64_ragged_requests_matches_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    prefixes = torch.randint(0, 60, (64,), generator=generator).tolist()
    ours, expected, *_ = run_batch(ForwardMode.DECODE, prefixes, [1] * 64, seed=1)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_extend_with_and_without_cached_prefixes_matches_reference() -> None:
    ours, expected, *_ = run_batch(ForwardMode.EXTEND, [0, 7, 30, 0], [5, 9, 1, 12], seed=2)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_new_keys_and_values_are_written_to_their_slots() -> None:
    _, _, batch, k, v = run_batch(ForwardMode.EXTEND, [3, 0], [4, 2], seed=3)
    assert torch.equal(batch.kv.k[0][batch.out_cache_loc], k)
    assert torch.equal(batch.kv.v[0][batch.out_cache_loc], v)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_padding_tokens_leave_the_real_ones_unchanged(mode: ForwardMode) -> None:
    extend_lens = [1, 1, 1] if mode == ForwardMode.DECODE else [2, 3, 1]
    _, _, batch, k, v = run_batch(mode, [4, 0, 9], extend_lens, seed=4)
    padded = batch.padded(8)
    extra = padded.num_tokens - batch.num_tokens
    q = torch.randn(batch.num_tokens, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(4))
    backend = TorchAttentionBackend()
    backend.init_forward_metadata(batch)
    unpadded = backend.forward(q, k, v, 0, batch)

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(extra, *x.shape[1:])])

    backend.init_forward_metadata(padded)
    out = backend.forward(pad(q), pad(k), pad(v), 0, padded)

    assert out.shape[0] == padded.num_tokens
    torch.testing.assert_close(out[: batch.num_tokens], unpadded)
    assert torch.equal(out[batch.num_tokens :], torch.zeros_like(out[batch.num_tokens :]))
