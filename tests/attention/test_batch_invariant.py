"""The batch-invariant backend: same numbers as plain attention, and bitwise the same
result for a token whether it is computed in a prefill, a chunk or a decode step."""

from __future__ import annotations

import os

import pytest
import torch

from sluice.runtime.attention.batch_invariant import BatchInvariantAttentionBackend
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers

HEADS, KV_HEADS, DIM = 4, 2, 16


def make_batch(kv, table, rows, prefix_lens, extend_lens, mode):
    seq = [p + e for p, e in zip(prefix_lens, extend_lens, strict=False)]
    loc = torch.cat([table[r, p : p + e].long() for r, p, e in zip(rows, prefix_lens, extend_lens, strict=False)])
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(
        mode=mode, input_ids=t([0] * len(loc)), positions=t([0] * len(loc)), out_cache_loc=loc,
        req_pool_indices=t(rows), seq_lens=t(seq), prefix_lens=t(prefix_lens),
        extend_lens=t(extend_lens), seq_lens_cpu=seq, prefix_lens_cpu=prefix_lens,
        extend_lens_cpu=extend_lens, req_to_token=table, kv=kv,
    )


def run(backend, kv, table, rows, prefix_lens, extend_lens, q, k, v, mode=ForwardMode.EXTEND):
    batch = make_batch(kv, table, rows, prefix_lens, extend_lens, mode)
    backend.init_forward_metadata(batch)
    return backend.forward(q, k, v, 0, batch)


def setup(total=150, reqs=3):
    torch.manual_seed(0)
    kv = KVBuffers(1 + reqs * total, 1, KV_HEADS, DIM, torch.float32, "cpu")
    table = torch.zeros(reqs, total, dtype=torch.int32)
    for r in range(reqs):
        table[r] = 1 + r * total + torch.arange(total)
    q = torch.randn(total, HEADS, DIM)
    k = torch.randn(total, KV_HEADS, DIM)
    v = torch.randn(total, KV_HEADS, DIM)
    return kv, table, q, k, v


def test_matches_plain_attention():
    kv, table, q, k, v = setup()
    ref = run(TorchAttentionBackend(), kv, table, [0], [0], [100], q[:100], k[:100], v[:100])
    got = run(BatchInvariantAttentionBackend(), kv, table, [0], [0], [100], q[:100], k[:100], v[:100])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_a_token_gets_the_same_bits_in_prefill_chunk_and_decode():
    kv, table, q, k, v = setup()
    bi = BatchInvariantAttentionBackend()
    whole = run(bi, kv, table, [0], [0], [130], q[:130], k[:130], v[:130])
    # the same sequence as a 70-token chunk, then a 59-token chunk, then one decode token
    run(bi, kv, table, [1], [0], [70], q[:70], k[:70], v[:70])
    chunk = run(bi, kv, table, [1], [70], [59], q[70:129], k[70:129], v[70:129])
    step = run(bi, kv, table, [1], [129], [1], q[129:130], k[129:130], v[129:130], ForwardMode.DECODE)
    assert torch.equal(chunk, whole[70:129])
    assert torch.equal(step, whole[129:130])


def test_a_request_gets_the_same_bits_alone_and_in_a_batch():
    kv, table, q, k, v = setup()
    bi = BatchInvariantAttentionBackend()
    alone = run(bi, kv, table, [0], [0], [40], q[:40], k[:40], v[:40])
    qq = torch.cat([q[100:117], q[:40]])
    kk = torch.cat([k[100:117], k[:40]])
    vv = torch.cat([v[100:117], v[:40]])
    together = run(bi, kv, table, [2, 0], [0, 0], [17, 40], qq, kk, vv)
    assert torch.equal(together[17:], alone)


def test_the_triton_gemms_of_cuda_keep_the_bits(monkeypatch):
    """On CUDA the two GEMMs run the fixed-tile Triton `bmm`; here under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (tests/conftest.py turns it on)")
    from sluice.runtime.attention import batch_invariant

    monkeypatch.setattr(batch_invariant, "_batched_matmul", batch_invariant.triton_batched_matmul)
    kv, table, q, k, v = setup()
    bi = BatchInvariantAttentionBackend()
    whole = run(bi, kv, table, [0], [0], [80], q[:80], k[:80], v[:80])
    ref = run(TorchAttentionBackend(), kv, table, [0], [0], [80], q[:80], k[:80], v[:80])
    torch.testing.assert_close(whole, ref, atol=1e-5, rtol=1e-5)
    run(bi, kv, table, [1], [0], [50], q[:50], k[:50], v[:50])
    chunk = run(bi, kv, table, [1], [50], [29], q[50:79], k[50:79], v[50:79])
    step = run(bi, kv, table, [1], [79], [1], q[79:80], k[79:80], v[79:80], ForwardMode.DECODE)
    assert torch.equal(torch.cat([chunk, step]), whole[50:80])
