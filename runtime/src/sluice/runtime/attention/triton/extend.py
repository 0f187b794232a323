"""Paged extend (prefill) attention in Triton: a cached prefix read in place, then the new
tokens causally.

One program per (request, KV head, tile of query rows). A tile's rows are (new token,
query head of the KV head's GQA group) pairs, so every K/V tile is loaded once for the
whole group. The program first attends over the request's cached prefix, reading its KV
slots through the request->token table straight from the KV cache (no gather, nothing
copied per chunk: a chunked prompt's earlier chunks are simply prefix), then over the new
tokens' own K/V (contiguous in the forward's `k`/`v`) with the causal mask. fp32 online
softmax; rows past the request's tokens are computed on zeros and never stored.

Per-layer options: with a sliding window a tile starts reading at its first query's window
(keys before it are never loaded) and masks each row to its own window; soft-capping maps
each score through `cap * tanh(s / cap)` before the mask; a sink logit per head joins each
row's softmax at the end (one more term, zero value).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluice.runtime.attention.triton.config import TritonAttentionConfig, next_power_of_2
from sluice.runtime.attention.triton.decode import _soft_cap


@triton.jit
def _online_softmax_step(scores, v, m_i, l_i, acc):
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    req_to_token_ptr, req_pool_indices_ptr, prefix_lens_ptr, extend_lens_ptr, extend_starts_ptr,
    stride_qt, stride_qh,
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_cks, stride_ckh,
    stride_cvs, stride_cvh,
    stride_ot, stride_oh,
    stride_table,
    scale, window, softcap, sinks_ptr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)

    extend_len = tl.load(extend_lens_ptr + req).to(tl.int32)
    num_rows = extend_len * GROUP
    if tile * BLOCK_M < num_rows:
        prefix_len = tl.load(prefix_lens_ptr + req).to(tl.int32)
        first = tl.load(extend_starts_ptr + req).to(tl.int64)
        row = tl.load(req_pool_indices_ptr + req).to(tl.int64)

        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < num_rows
        token = rows // GROUP  # index among the request's new tokens
        head = kv_head * GROUP + rows % GROUP
        d_offs = tl.arange(0, BLOCK_D)
        d_mask = d_offs < HEAD_DIM
        q = tl.load(
            q_ptr + (first + token)[:, None] * stride_qt + head[:, None] * stride_qh
            + d_offs[None, :],
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )  # fmt: skip
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # the window's lower bound per row (absolute positions); -1: no window
        query_pos = prefix_len + token
        low = tl.where(window > 0, query_pos - window, -1)  # keys at positions > low
        tile_first = tl.minimum((tile * BLOCK_M) // GROUP, extend_len - 1)
        prefix_start = tl.where(window > 0, tl.maximum(prefix_len + tile_first + 1 - window, 0), 0)

        # the cached prefix: every new token sees all of it (with a window, its tail)
        for n0 in range(prefix_start, prefix_len, BLOCK_N):
            n_offs = n0 + tl.arange(0, BLOCK_N)
            n_mask = n_offs < prefix_len
            slots = tl.load(req_to_token_ptr + row * stride_table + n_offs, mask=n_mask, other=0)
            slots = slots.to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_cache_ptr + slots[:, None] * stride_cks + kv_head * stride_ckh + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )
            scores = tl.dot(q, tl.trans(k.to(q.dtype))) * scale
            if HAS_SOFTCAP:
                scores = _soft_cap(scores, softcap)
            scores = tl.where(n_mask[None, :] & (n_offs[None, :] > low[:, None]), scores,
                              float("-inf"))  # fmt: skip
            v = tl.load(
                v_cache_ptr + slots[:, None] * stride_cvs + kv_head * stride_cvh + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )
            m_i, l_i, acc = _online_softmax_step(scores, v.to(q.dtype), m_i, l_i, acc)

        # the new tokens: causal, and only up to the tile's last token
        last_token = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, extend_len - 1)
        new_start = tl.where(window > 0, tl.maximum(tile_first + 1 - window, 0), 0)
        for n0 in range(new_start, last_token + 1, BLOCK_N):
            n_offs = n0 + tl.arange(0, BLOCK_N)
            n_mask = n_offs < extend_len
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_ptr + (first + n_offs)[:, None] * stride_kt + kv_head * stride_kh
                + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )  # fmt: skip
            scores = tl.dot(q, tl.trans(k.to(q.dtype))) * scale
            if HAS_SOFTCAP:
                scores = _soft_cap(scores, softcap)
            visible = n_mask[None, :] & (n_offs[None, :] <= token[:, None])
            visible = visible & (prefix_len + n_offs[None, :] > low[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            v = tl.load(
                v_ptr + (first + n_offs)[:, None] * stride_vt + kv_head * stride_vh
                + d_offs[None, :],
                mask=kv_mask,
                other=0.0,
            )  # fmt: skip
            m_i, l_i, acc = _online_softmax_step(scores, v.to(q.dtype), m_i, l_i, acc)

        if HAS_SINKS:  # one more softmax term, exp(sink), with a zero value
            sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0).to(tl.float32)
            m_all = tl.maximum(m_i, sink)
            keep = tl.exp(m_i - m_all)
            acc = acc * keep[:, None]
            l_i = l_i * keep + tl.exp(sink - m_all)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        tl.store(
            out_ptr + (first + token)[:, None] * stride_ot + head[:, None] * stride_oh
            + d_offs[None, :],
            (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )  # fmt: skip


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    max_extend_len: int,
    scale: float,
    config: TritonAttentionConfig,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """Write into `out` the attention of each request's new tokens (`q`, `k`, `v` rows
    `extend_starts[i]` onwards, `extend_lens[i]` of them) over its cached prefix (the first
    `prefix_lens[i]` slots of its `req_to_token` row) and, causally, over themselves; with
    `window`, `sinks` and `softcap` as the decode kernel takes them."""
    batch = req_pool_indices.shape[0]
    if batch == 0 or max_extend_len == 0:
        return
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_m = config.extend_block_m
    tiles = -(-max_extend_len * group // block_m)
    _extend_kernel[(batch, num_kv_heads, tiles)](
        q, k, v, k_cache, v_cache, out,
        req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_starts,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1),
        v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1),
        req_to_token.stride(0),
        scale, window or 0, softcap or 0.0, sinks if sinks is not None else q,
        HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, next_power_of_2(head_dim)),
        BLOCK_M=block_m, BLOCK_N=config.extend_block_n,
        num_warps=config.num_warps,
    )  # fmt: skip
