"""The `cpu` backend (compiled kernels and the torch varlen fallback) against plain math.

The oracle is causal softmax attention written out per request in fp64 over the keys and
values the request's `req_to_token` row points at; the torch backend is a second witness.
Batches are ragged, pages are shuffled (page sizes 1 and 16), GQA groups vary, prefixes
are cached, long sequences cross the split-KV chunk size, and an extend in chunks must give
what one whole extend gives.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from sluice.runtime.attention import cpu_backend
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend, VarlenTorchAttention
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.kernels import cpu_extension as extension
from sluice.runtime.memory.kv_buffers import KVBuffers

HEAD_DIM = 64
BF16_TOL = 2e-2

needs_kernels = pytest.mark.skipif(
    not extension.available(), reason=f"CPU kernels not built: {extension.load()}"
)


def make_backends() -> list[tuple[str, object]]:
    backends = [("varlen", lambda: VarlenTorchAttention())]
    if extension.available():
        backends.insert(0, ("kernels", lambda: CpuAttentionBackend(use_kernels=True)))
    return backends


@dataclass
class Pool:
    """A KV pool with whole pages handed out in shuffled order, and a request table."""

    heads: int
    kv_heads: int
    page_size: int
    kv_dtype: torch.dtype = torch.float32
    num_pages: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        self.kv = KVBuffers(self.num_pages * self.page_size, 1, self.kv_heads, HEAD_DIM,
                            self.kv_dtype, "cpu")  # fmt: skip
        self.kv.k[0].copy_(torch.randn(self.kv.k[0].shape, generator=gen))
        self.kv.v[0].copy_(torch.randn(self.kv.v[0].shape, generator=gen))
        self.req_to_token = torch.zeros(16, 4096, dtype=torch.int32)
        self.req_to_token[:] = self.num_pages * self.page_size - 1  # stale entries: ignored
        self.lens = [0] * 16
        self.pages: list[list[int]] = [[] for _ in range(16)]
        self.free = list(range(1, self.num_pages))
        random.Random(self.seed).shuffle(self.free)

    def allocate(self, row: int, count: int) -> list[int]:
        slots = []
        for pos in range(self.lens[row], self.lens[row] + count):
            if pos % self.page_size == 0:
                self.pages[row].append(self.free.pop())
            slots.append(self.pages[row][pos // self.page_size] * self.page_size + pos % self.page_size)
        self.req_to_token[row, self.lens[row] : self.lens[row] + count] = torch.tensor(slots)
        self.lens[row] += count
        return slots

    def share(self, dst: int, src: int, length: int) -> None:
        assert length % self.page_size == 0
        self.pages[dst] = self.pages[src][: length // self.page_size]
        self.req_to_token[dst, :length] = self.req_to_token[src, :length]
        self.lens[dst] = length

    def batch(self, mode: ForwardMode, rows: list[int], extend_lens: list[int]) -> ForwardBatch:
        prefix = [self.lens[r] for r in rows]
        locs = [s for r, n in zip(rows, extend_lens, strict=True) for s in self.allocate(r, n)]
        seq = [p + n for p, n in zip(prefix, extend_lens, strict=True)]
        tokens = sum(extend_lens)
        return ForwardBatch(
            mode=mode,
            input_ids=torch.zeros(tokens, dtype=torch.int64),
            positions=torch.zeros(tokens, dtype=torch.int64),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64),
            seq_lens=torch.tensor(seq),
            prefix_lens=torch.tensor(prefix),
            extend_lens=torch.tensor(extend_lens),
            seq_lens_cpu=seq,
            prefix_lens_cpu=prefix,
            extend_lens_cpu=list(extend_lens),
            req_to_token=self.req_to_token,
            kv=self.kv,
        )


def reference(batch: ForwardBatch, q: torch.Tensor, heads: int) -> torch.Tensor:
    """fp64 causal attention per request over the slots of its row (after the write)."""
    k_all, v_all = batch.kv.k[0].double(), batch.kv.v[0].double()
    kv_heads = k_all.shape[1]
    out, start = [], 0
    for row, prefix, n in zip(batch.req_pool_indices.tolist(), batch.prefix_lens_cpu,
                              batch.extend_lens_cpu, strict=True):  # fmt: skip
        slots = batch.req_to_token[row, : prefix + n].long()
        keys = k_all[slots].repeat_interleave(heads // kv_heads, dim=1)
        values = v_all[slots].repeat_interleave(heads // kv_heads, dim=1)
        queries = q[start : start + n].double()
        scores = torch.einsum("qhd,khd->hqk", queries, keys) / math.sqrt(HEAD_DIM)
        allowed = torch.arange(prefix + n)[None, :] <= (prefix + torch.arange(n))[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
        start += n
    return torch.cat(out)


def run(backend: object, batch: ForwardBatch, q, k, v) -> torch.Tensor:
    backend.init_forward_metadata(batch)
    return backend.forward(q, k, v, 0, batch)


def new_qkv(tokens: int, heads: int, kv_heads: int, dtype=torch.float32, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(tokens, h, HEAD_DIM, generator=gen).to(dtype) for h in (heads, kv_heads, kv_heads)
    )


def prefill(pool: Pool, rows: list[int], lens: list[int], seed: int = 7) -> None:
    """Fill rows with `lens` tokens of random K/V (what earlier forwards would have written)."""
    gen = torch.Generator().manual_seed(seed)
    for row, n in zip(rows, lens, strict=True):
        slots = torch.tensor(pool.allocate(row, n), dtype=torch.int64)
        pool.kv.k[0][slots] = torch.randn(n, pool.kv_heads, HEAD_DIM, generator=gen).to(pool.kv_dtype)
        pool.kv.v[0][slots] = torch.randn(n, pool.kv_heads, HEAD_DIM, generator=gen).to(pool.kv_dtype)


@pytest.mark.parametrize("name,factory", make_backends())
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (9, 3), (8, 1)])
def test_decode_of_ragged_requests_matches_math(name, factory, page_size, heads, kv_heads) -> None:
    pool = Pool(heads, kv_heads, page_size, seed=page_size + heads)
    lens = [1, 5, 37, 300, 600, 64, 2]  # 300 and 600 cross the 256-key split-KV chunk
    rows = list(range(1, len(lens) + 1))
    prefill(pool, rows, [n - 1 for n in lens])
    batch = pool.batch(ForwardMode.DECODE, rows, [1] * len(rows))
    q, k, v = new_qkv(len(rows), heads, kv_heads)
    out = run(factory(), batch, q, k, v)
    torch.testing.assert_close(out.double(), reference(batch, q, heads), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,factory", make_backends())
@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_with_cached_prefixes_matches_math_and_torch(name, factory, page_size) -> None:
    heads, kv_heads = 9, 3
    pool = Pool(heads, kv_heads, page_size, seed=3)
    rows, prefixes, extends = [1, 2, 3, 4, 5], [0, 16, 48, 0, 320], [5, 33, 1, 70, 17]
    prefill(pool, rows, prefixes)
    batch = pool.batch(ForwardMode.EXTEND, rows, extends)
    q, k, v = new_qkv(sum(extends), heads, kv_heads)
    out = run(factory(), batch, q, k, v)
    expected = reference(batch, q, heads)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    witness = run(TorchAttentionBackend(), batch, q, k, v)
    torch.testing.assert_close(out, witness, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,factory", make_backends())
def test_chunked_extend_equals_one_extend(name, factory) -> None:
    """A 100-token prompt in chunks of 32, each chunk reading the earlier ones in place."""
    heads, kv_heads = 8, 2
    whole, chunked = Pool(heads, kv_heads, 16, seed=5), Pool(heads, kv_heads, 16, seed=5)
    q, k, v = new_qkv(100, heads, kv_heads, seed=9)
    full = run(factory(), whole.batch(ForwardMode.EXTEND, [1], [100]), q, k, v)
    parts, start = [], 0
    for n in (32, 32, 32, 4):
        batch = chunked.batch(ForwardMode.EXTEND, [1], [n])
        parts.append(run(factory(), batch, q[start : start + n], k[start : start + n],
                         v[start : start + n]))  # fmt: skip
        start += n
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=1e-5)


@needs_kernels
def test_shared_prefix_pages_are_read_in_place() -> None:
    """Two requests pointing at the same cached pages, each extending its own suffix."""
    heads, kv_heads = 9, 3
    pool = Pool(heads, kv_heads, 16, seed=11)
    prefill(pool, [1], [64])
    pool.share(2, 1, 48)
    batch = pool.batch(ForwardMode.EXTEND, [1, 2], [3, 20])
    q, k, v = new_qkv(23, heads, kv_heads)
    out = run(CpuAttentionBackend(use_kernels=True), batch, q, k, v)
    torch.testing.assert_close(out.double(), reference(batch, q, heads), atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float32, torch.bfloat16),
                                              (torch.bfloat16, torch.float32)])  # fmt: skip
def test_bf16_matches_math_within_tolerance(mode, q_dtype, kv_dtype) -> None:
    heads, kv_heads = 9, 3
    pool = Pool(heads, kv_heads, 16, kv_dtype=kv_dtype, seed=13)
    prefill(pool, [1, 2, 3], [0, 40, 290])
    extends = [1, 1, 1] if mode == ForwardMode.DECODE else [9, 24, 3]
    if mode == ForwardMode.DECODE:
        prefill(pool, [1], [5])
    batch = pool.batch(mode, [1, 2, 3], extends)
    q, k, v = new_qkv(sum(extends), heads, kv_heads, dtype=q_dtype)
    out = run(CpuAttentionBackend(use_kernels=True), batch, q, k, v)
    assert out.dtype == q_dtype
    torch.testing.assert_close(out.double(), reference(batch, q, heads), atol=BF16_TOL, rtol=BF16_TOL)


@pytest.mark.parametrize("name,factory", make_backends())
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_padding_rows_are_zero_and_leave_real_rows_alone(name, factory, mode) -> None:
    heads, kv_heads = 8, 2
    pool = Pool(heads, kv_heads, 1, seed=17)
    prefill(pool, [1, 2], [10, 3])
    extends = [1, 1] if mode == ForwardMode.DECODE else [4, 2]
    batch = pool.batch(mode, [1, 2], extends)
    q, k, v = new_qkv(sum(extends), heads, kv_heads)
    padded = batch.padded(8)
    extra = padded.num_tokens - batch.num_tokens

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(extra, *x.shape[1:])])

    out = run(factory(), padded, pad(q), pad(k), pad(v))
    expected = reference(batch, q, heads)  # after the forward wrote the new K/V
    torch.testing.assert_close(out[: batch.num_tokens].double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[batch.num_tokens :], torch.zeros_like(out[batch.num_tokens :]))


@needs_kernels
def test_new_keys_and_values_are_written_before_attending() -> None:
    pool = Pool(8, 2, 16, seed=19)
    batch = pool.batch(ForwardMode.EXTEND, [1], [20])
    q, k, v = new_qkv(20, 8, 2)
    run(CpuAttentionBackend(use_kernels=True), batch, q, k, v)
    assert torch.equal(pool.kv.k[0][batch.out_cache_loc], k)
    assert torch.equal(pool.kv.v[0][batch.out_cache_loc], v)


def test_fallback_is_chosen_when_kernels_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_backend.extension, "load", lambda: "no C++ compiler on PATH")
    backend = CpuAttentionBackend()
    assert backend.implementation == "torch-varlen"


@needs_kernels
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_a_dtype_without_kernels_runs_the_torch_fallback(mode) -> None:
    heads, kv_heads = 8, 2
    pool = Pool(heads, kv_heads, 16, kv_dtype=torch.float16, seed=23)
    prefill(pool, [1, 2], [30, 4])
    extends = [1, 1] if mode == ForwardMode.DECODE else [5, 9]
    batch = pool.batch(mode, [1, 2], extends)
    q, k, v = new_qkv(sum(extends), heads, kv_heads, dtype=torch.float16)
    backend = CpuAttentionBackend(use_kernels=True)
    out = run(backend, batch, q, k, v)
    assert backend._fallback is not None
    torch.testing.assert_close(out.double(), reference(batch, q, heads), atol=5e-3, rtol=5e-3)
