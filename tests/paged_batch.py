"""Random paged batches for attention backend tests, laid out as the scheduler lays them.

Each request's KV lives on pages of `page_size` slots handed out by the real
`TokenToKVPoolAllocator` (shuffled, so neighbouring positions rarely sit on neighbouring
pages); its `req_to_token` row maps positions to those slots, and entries past its length
hold a stale slot that a backend must never read. The cached prefix's K/V are random and
already in the pool; the new tokens' q/k/v are random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.kv_buffers import KVBuffers


@dataclass
class PagedCase:
    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache_k: torch.Tensor  # the pool before the forward wrote the new tokens
    cache_v: torch.Tensor


def make_case(
    mode: ForwardMode,
    prefix_lens: list[int],
    extend_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 16,
    page_size: int = 1,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    pool_tokens: int | None = None,
) -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    shuffle = random.Random(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    pages_needed = sum(-(-s // page_size) for s in seq_lens)
    total = pool_tokens or (pages_needed + 8) * page_size
    allocator = TokenToKVPoolAllocator(total, page_size)
    every_page = allocator.alloc_pages(allocator.num_pages)
    assert every_page is not None
    shuffle.shuffle(every_page)
    allocator.free(every_page)  # handed out again in shuffled order: pages scattered
    kv = KVBuffers(allocator.num_slots, 1, num_kv_heads, head_dim, dtype, device)
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=gen).to(dtype))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=gen).to(dtype))
    num_reqs = len(seq_lens)
    width = max(seq_lens) + 5
    req_to_token = torch.zeros(num_reqs + 3, width, dtype=torch.int32)
    rows = shuffle.sample(range(num_reqs + 3), num_reqs)
    locs = []
    for row, prefix, seq_len in zip(rows, prefix_lens, seq_lens, strict=True):
        pages = allocator.alloc_pages(-(-seq_len // page_size))
        assert pages is not None
        slots = torch.tensor(allocator.slots(pages, 0, seq_len), dtype=torch.int64)
        req_to_token[row, :seq_len] = slots.to(torch.int32)
        req_to_token[row, seq_len:] = allocator.num_slots - 1  # stale: must be ignored
        locs.append(slots[prefix:])
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    positions = [p + j for p, e in zip(prefix_lens, extend_lens, strict=True) for j in range(e)]

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    batch = ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=t(positions),
        out_cache_loc=torch.cat(locs).to(device),
        req_pool_indices=t(rows),
        seq_lens=t(seq_lens),
        prefix_lens=t(prefix_lens),
        extend_lens=t(extend_lens),
        seq_lens_cpu=seq_lens,
        prefix_lens_cpu=list(prefix_lens),
        extend_lens_cpu=list(extend_lens),
        req_to_token=req_to_token.to(device),
        kv=kv,
    )
    return PagedCase(
        batch, q.to(device), k.to(device), v.to(device), kv.k[0].clone(), kv.v[0].clone()
    )


def run_backend(backend: AttentionBackend, case: PagedCase) -> torch.Tensor:
    """One layer's forward on a fresh copy of the case's pool (backends write the new K/V)."""
    case.batch.kv.k[0].copy_(case.cache_k)
    case.batch.kv.v[0].copy_(case.cache_v)
    backend.init_forward_metadata(case.batch)
    return backend.forward(case.q, case.k, case.v, 0, case.batch)


def with_dtype(case: PagedCase, dtype: torch.dtype) -> PagedCase:
    """The same case (same values, rounded once) with tensors and pool in `dtype`."""
    b = case.batch
    kv = KVBuffers(b.kv.num_slots, 1, b.kv.num_kv_heads, b.kv.head_dim, dtype, case.q.device)
    kv.k[0].copy_(case.cache_k)
    kv.v[0].copy_(case.cache_v)
    batch = ForwardBatch(**{**b.__dict__, "kv": kv})
    return PagedCase(batch, case.q.to(dtype), case.k.to(dtype), case.v.to(dtype),
                     case.cache_k.to(dtype), case.cache_v.to(dtype))  # fmt: skip
