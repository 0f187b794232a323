"""Paged attention in plain torch: any device, the CPU default.

Decode gathers every request's keys and values padded to the longest request and runs one
masked `scaled_dot_product_attention` per layer; the query heads of a KV group ride in the
query-length dimension, so GQA needs no copy of K/V. Extend runs one SDPA per request with
a causal mask offset by the request's cached prefix. Gather indices and masks are built
once per forward in `init_forward_metadata`. Padding tokens past the batch's requests
(`ForwardBatch.padded`) get zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.model.forward_batch import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class _DecodeMetadata:
    slots: torch.Tensor  # [batch * max_len] int64, padding points at slot 0
    mask: torch.Tensor  # [batch, 1, 1, max_len] bool, True where a slot is attended
    max_len: int


@dataclass(frozen=True)
class _ExtendRequest:
    start: int  # first of this request's new tokens in the flat token dimension
    end: int
    slots: torch.Tensor  # [seq_len] int64, the request's row of req_to_token
    mask: torch.Tensor | None  # [extend_len, seq_len] bool; None: no cached prefix, plain causal


class TorchAttentionBackend(AttentionBackend):
    """`AttentionBackend` built from `index_select` and `scaled_dot_product_attention`."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__(scale)
        self._decode: _DecodeMetadata | None = None
        self._extend: list[_ExtendRequest] | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._decode = None
        self._extend = None
        if batch.mode == ForwardMode.DECODE:
            self._decode = self._decode_metadata(batch)
        else:
            self._extend = self._extend_metadata(batch)

    @staticmethod
    def _decode_metadata(batch: ForwardBatch) -> _DecodeMetadata:
        max_len = max(batch.seq_lens_cpu)
        device = batch.req_to_token.device
        rows = batch.req_to_token[batch.req_pool_indices, :max_len].to(torch.int64)
        positions = torch.arange(max_len, device=device)
        valid = positions[None, :] < batch.seq_lens.to(device)[:, None]
        slots = torch.where(valid, rows, torch.zeros_like(rows))
        return _DecodeMetadata(slots.reshape(-1), valid[:, None, None, :], max_len)

    @staticmethod
    def _extend_metadata(batch: ForwardBatch) -> list[_ExtendRequest]:
        device = batch.req_to_token.device
        pool_indices = batch.req_pool_indices.tolist()
        requests = []
        start = 0
        for i, (prefix, extend) in enumerate(
            zip(batch.prefix_lens_cpu, batch.extend_lens_cpu, strict=True)
        ):
            end = start + extend
            seq_len = prefix + extend
            row = batch.req_to_token[pool_indices[i], :seq_len].to(torch.int64)
            mask = None
            if prefix > 0:
                query_pos = prefix + torch.arange(extend, device=device)
                mask = torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None]
            requests.append(_ExtendRequest(start, end, row, mask))
            start = end
        return requests

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        scale = self.scale_for(q.shape[-1])
        if self._decode is not None:
            return self._forward_decode(q, layer_id, batch, self._decode, scale)
        if self._extend is None:
            raise RuntimeError("init_forward_metadata() was not called before forward()")
        return self._forward_extend(q, k, v, layer_id, batch, self._extend, scale)

    @staticmethod
    def _forward_decode(
        q: torch.Tensor, layer_id: int, batch: ForwardBatch, meta: _DecodeMetadata, scale: float
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        num_reqs = batch.batch_size  # rows past it are padding (`ForwardBatch.padded`)
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        num_kv_heads = k_cache.shape[1]
        group = num_heads // num_kv_heads
        shape = (num_reqs, meta.max_len, num_kv_heads, head_dim)
        keys = k_cache.index_select(0, meta.slots).view(shape).transpose(1, 2).to(q.dtype)
        values = v_cache.index_select(0, meta.slots).view(shape).transpose(1, 2).to(q.dtype)
        # the `group` query heads sharing a KV head act as `group` queries of one head
        queries = q[:num_reqs].reshape(num_reqs, num_kv_heads, group, head_dim)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=meta.mask, scale=scale
        ).reshape(num_reqs, num_heads, head_dim)
        if num_tokens > num_reqs:
            out = torch.cat([out, out.new_zeros(num_tokens - num_reqs, num_heads, head_dim)])
        return out

    @staticmethod
    def _forward_extend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        requests: list[_ExtendRequest],
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        padded = q.shape[0] > (requests[-1].end if requests else 0)
        out = torch.zeros_like(q) if padded else torch.empty_like(q)
        for req in requests:
            if req.mask is None and k_cache.dtype == k.dtype:
                # nothing cached: the new k/v are the whole sequence, no gather needed
                keys, values = k[req.start : req.end], v[req.start : req.end]
            else:
                keys = k_cache.index_select(0, req.slots).to(q.dtype)
                values = v_cache.index_select(0, req.slots).to(q.dtype)
            queries = q[req.start : req.end].transpose(0, 1)[None]  # [1, heads, tokens, dim]
            result = F.scaled_dot_product_attention(
                queries,
                keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None],
                attn_mask=req.mask,
                is_causal=req.mask is None,
                scale=scale,
                enable_gqa=True,
            )
            out[req.start : req.end] = result[0].transpose(0, 1)
        return out
