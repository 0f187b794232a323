"""Sluice's Triton decode and extend kernels equal the torch backend (fp32, 1e-5), run
under Triton's interpreter on CPU tensors."""

from __future__ import annotations

import pytest
import torch
from paged_batch import make_case, run_backend

from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardMode

pytest.importorskip("triton")
from sluice.runtime.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from sluice.runtime.attention.triton.config import TritonAttentionConfig  # noqa: E402

# the CPU tiles (16) with at most 4 splits of at least 16 keys: a 70-token request has 4
# splits of 32 keys, the last one short
CPU = TritonAttentionConfig.for_device("cpu")


def assert_matches_torch(case, config: TritonAttentionConfig = CPU) -> None:
    expected = run_backend(TorchAttentionBackend(), case)
    ours = run_backend(TritonAttentionBackend(config=config), case)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    # both wrote the new tokens' K/V where the batch said
    assert torch.equal(case.batch.kv.k[0][case.batch.out_cache_loc], case.k)
    assert torch.equal(case.batch.kv.v[0][case.batch.out_cache_loc], case.v)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (6, 2), (8, 2)])  # GQA groups 1, 3, 4
def test_decode_ragged_batch(page_size: int, heads: int, kv_heads: int) -> None:
    # one long request (several splits, the last one partial) and many short ones
    prefixes = [69, 0, 3, 15, 16, 1]
    case = make_case(ForwardMode.DECODE, prefixes, [1] * len(prefixes), num_heads=heads,
                     num_kv_heads=kv_heads, page_size=page_size, seed=page_size + heads)  # fmt: skip
    assert CPU.num_splits(70) == 3 and 70 % CPU.split_len(70) != 0
    assert_matches_torch(case)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (6, 2), (8, 2)])
def test_extend_with_cached_prefixes_ragged(page_size: int, heads: int, kv_heads: int) -> None:
    # no prefix, a prefix shorter than a tile, one spanning tiles; extends of 1..37 tokens
    case = make_case(ForwardMode.EXTEND, [0, 5, 40, 0], [37, 3, 20, 1], num_heads=heads,
                     num_kv_heads=kv_heads, page_size=page_size, seed=10 + page_size + heads)  # fmt: skip
    assert_matches_torch(case)


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_equals_one_shot_prefill(page_size: int) -> None:
    """A 45-token prompt prefilled in chunks of 16: each chunk attends to the chunks before
    it in place (as cached prefix) and gives the rows a one-shot prefill gives."""
    length, chunk = 45, 16
    whole = make_case(ForwardMode.EXTEND, [0], [length], num_heads=6, num_kv_heads=2,
                      page_size=page_size, seed=3)  # fmt: skip
    one_shot = run_backend(TorchAttentionBackend(), whole)
    backend = TritonAttentionBackend(config=CPU)
    batch = whole.batch
    batch.kv.k[0].copy_(whole.cache_k)
    batch.kv.v[0].copy_(whole.cache_v)
    row = batch.req_to_token[batch.req_pool_indices[0]]
    pieces = []
    for start in range(0, length, chunk):
        n = min(chunk, length - start)
        piece = type(batch)(
            mode=ForwardMode.EXTEND,
            input_ids=torch.zeros(n, dtype=torch.int64),
            positions=torch.arange(start, start + n),
            out_cache_loc=row[start : start + n].to(torch.int64),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=torch.tensor([start + n]),
            prefix_lens=torch.tensor([start]),
            extend_lens=torch.tensor([n]),
            seq_lens_cpu=[start + n],
            prefix_lens_cpu=[start],
            extend_lens_cpu=[n],
            req_to_token=batch.req_to_token,
            kv=batch.kv,
        )
        sl = slice(start, start + n)
        backend.init_forward_metadata(piece)
        pieces.append(backend.forward(whole.q[sl], whole.k[sl], whole.v[sl], 0, piece))
    torch.testing.assert_close(torch.cat(pieces), one_shot, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_padding_tokens_get_zeros_and_leave_real_rows_unchanged(mode: ForwardMode) -> None:
    extend = [1, 1, 1] if mode == ForwardMode.DECODE else [2, 5, 1]
    case = make_case(mode, [4, 0, 9], extend, num_heads=6, num_kv_heads=2, seed=4)
    unpadded = run_backend(TritonAttentionBackend(config=CPU), case)
    padded = case.batch.padded(8)
    extra = padded.num_tokens - case.batch.num_tokens

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(extra, *x.shape[1:])])

    case.batch.kv.k[0].copy_(case.cache_k)
    case.batch.kv.v[0].copy_(case.cache_v)
    backend = TritonAttentionBackend(config=CPU)
    backend.init_forward_metadata(padded)
    out = backend.forward(pad(case.q), pad(case.k), pad(case.v), 0, padded)
    torch.testing.assert_close(out[: case.batch.num_tokens], unpadded, atol=0, rtol=0)
    assert torch.equal(out[case.batch.num_tokens :], torch.zeros_like(out[case.batch.num_tokens :]))


def test_split_lengths_cover_every_key_once() -> None:
    gpu = TritonAttentionConfig.for_device("cuda")
    for config in (CPU, gpu):
        for seq_len in [1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4097, 32768]:
            split, n = config.split_len(seq_len), config.num_splits(seq_len)
            assert 1 <= n <= config.max_kv_splits
            assert split % config.decode_block_n == 0
            assert (n - 1) * split < seq_len <= n * split
