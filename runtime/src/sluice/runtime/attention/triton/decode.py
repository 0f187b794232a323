"""Paged decode attention in Triton: split-KV (flash-decoding) plus a reduce kernel.

Stage 1, one program per (request, KV head, split): the program reads the request's KV
slots for its split straight from the request->token table, loads each K/V tile once for
all the query heads of its GQA group (they ride in the rows of one `tl.dot`), and keeps an
online softmax in fp32. It writes the split's normalised partial output and its
log-sum-exp. Stage 2, one program per (request, query head), merges the splits.

Per-layer options: a sliding window narrows the keys to the last `window` of the request
(the splits cover only those), soft-capping maps each score through `cap * tanh(s / cap)`,
and sink logits join the reduce's softmax (one more term, zero value).

The number of splits of a request is computed on the device from its length (an even
share of `MAX_SPLITS`, at least `MIN_SPLIT_LEN` tokens, whole tiles), so the launch grid
depends only on the batch size: the same launches can be captured in a CUDA graph and
replayed for any lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluice.runtime.attention.triton.config import TritonAttentionConfig, next_power_of_2


@triton.jit
def _soft_cap(scores, softcap):
    """`softcap * tanh(scores / softcap)`, tanh written with the sigmoid (all backends)."""
    return softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)


@triton.jit
def _window_start(seq_len, window):
    """The first key position a decode query at `seq_len - 1` sees (`window` 0: none)."""
    return tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)


@triton.jit
def _split_len(seq_len, MAX_SPLITS: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    share = tl.maximum(tl.cdiv(seq_len, MAX_SPLITS), MIN_SPLIT_LEN)
    return tl.cdiv(share, BLOCK_N) * BLOCK_N


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr,
    mid_out_ptr, mid_lse_ptr,
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_table,
    stride_mt, stride_mh, stride_ms,
    stride_lt, stride_lh,
    scale, window, softcap,
    HAS_SOFTCAP: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    row = tl.load(req_pool_indices_ptr + req).to(tl.int64)
    lo = _window_start(seq_len, window)
    split_len = _split_len(seq_len - lo, MAX_SPLITS, MIN_SPLIT_LEN, BLOCK_N)
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    if start < end:
        h_offs = tl.arange(0, BLOCK_H)
        heads = kv_head * GROUP + h_offs
        h_mask = h_offs < GROUP
        d_offs = tl.arange(0, BLOCK_D)
        d_mask = d_offs < HEAD_DIM
        q = tl.load(
            q_ptr + req * stride_qt + heads[:, None] * stride_qh + d_offs[None, :],
            mask=h_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n_offs = n0 + tl.arange(0, BLOCK_N)
            n_mask = n_offs < end
            slots = tl.load(req_to_token_ptr + row * stride_table + n_offs, mask=n_mask, other=0)
            slots = slots.to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_cache_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )
            scores = tl.dot(q, tl.trans(k.to(q.dtype))) * scale  # [BLOCK_H, BLOCK_N], fp32
            if HAS_SOFTCAP:
                scores = _soft_cap(scores, softcap)
            scores = tl.where(n_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_cache_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
            m_i = m_new
        out_offs = req * stride_mt + heads[:, None] * stride_mh + split * stride_ms
        tl.store(
            mid_out_ptr + out_offs + d_offs[None, :],
            acc / l_i[:, None],
            mask=h_mask[:, None] & d_mask[None, :],
        )
        tl.store(
            mid_lse_ptr + req * stride_lt + heads * stride_lh + split,
            m_i + tl.log(l_i),
            mask=h_mask,
        )


@triton.jit
def _decode_reduce_kernel(
    mid_out_ptr, mid_lse_ptr, seq_lens_ptr, out_ptr, sinks_ptr,
    stride_mt, stride_mh, stride_ms,
    stride_lt, stride_lh,
    stride_ot, stride_oh,
    window,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    seen = seq_len - _window_start(seq_len, window)
    num_splits = tl.cdiv(seen, _split_len(seen, MAX_SPLITS, MIN_SPLIT_LEN, BLOCK_N))
    s_offs = tl.arange(0, MAX_SPLITS)
    s_mask = s_offs < num_splits
    d_offs = tl.arange(0, BLOCK_D)
    d_mask = d_offs < HEAD_DIM
    lse = tl.load(
        mid_lse_ptr + req * stride_lt + head * stride_lh + s_offs, mask=s_mask, other=float("-inf")
    )
    peak = tl.max(lse, 0)
    if HAS_SINKS:  # the sink's term: exp(sink) over a zero value, in the same frame
        sink = tl.load(sinks_ptr + head).to(tl.float32)
        peak = tl.maximum(peak, sink)
    weights = tl.exp(lse - peak)  # splits past num_splits weigh exactly 0
    total = tl.sum(weights, 0)
    if HAS_SINKS:
        total += tl.exp(sink - peak)
    partial = tl.load(
        mid_out_ptr + req * stride_mt + head * stride_mh + s_offs[:, None] * stride_ms
        + d_offs[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # fmt: skip
    result = tl.sum(weights[:, None] * partial, 0) / total
    tl.store(
        out_ptr + req * stride_ot + head * stride_oh + d_offs,
        result.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    config: TritonAttentionConfig,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """Write into `out[:batch]` (`[tokens, heads, head_dim]`) the attention of decode
    query `q[i]` over the first `seq_lens[i]` slots of row `req_pool_indices[i]` of
    `req_to_token` (the last `window` of them with a window); `k_cache`/`v_cache` are
    `[slots, kv_heads, head_dim]`; `sinks` `[heads]` fp32; `softcap` caps the scores."""
    batch = req_pool_indices.shape[0]
    if batch == 0:
        return
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    splits = config.max_kv_splits
    mid_out = torch.empty(batch, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=q.device)
    block_h = max(16, next_power_of_2(group))
    block_d = max(16, next_power_of_2(head_dim))
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, mid_out, mid_lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        scale, window or 0, softcap or 0.0,
        HAS_SOFTCAP=softcap is not None,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        BLOCK_N=config.decode_block_n, MAX_SPLITS=splits, MIN_SPLIT_LEN=config.min_split_len,
        num_warps=config.num_warps,
    )  # fmt: skip
    _decode_reduce_kernel[(batch, num_heads)](
        mid_out, mid_lse, seq_lens, out, sinks if sinks is not None else mid_lse,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        window or 0,
        HAS_SINKS=sinks is not None,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=config.decode_block_n,
        MAX_SPLITS=splits, MIN_SPLIT_LEN=config.min_split_len,
        num_warps=config.num_warps,
    )  # fmt: skip
