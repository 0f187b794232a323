"""Paged attention in plain torch: any device, the reference.

Decode gathers every request's keys and values padded to the longest request and runs one
masked `scaled_dot_product_attention` per layer; the query heads of a KV group ride in the
query-length dimension, so GQA needs no copy of K/V. Extend runs one SDPA per request with
a causal mask offset by the request's cached prefix. Gather indices and masks are built
once per forward in `init_forward_metadata` (a sliding window's masks once per window, when
its first layer asks). Padding tokens past the batch's requests (`ForwardBatch.padded`) get
zeros.

Soft-capping and sink logits are not SDPA's: a layer with either runs `attend`, the same
attention written out (scores, cap, mask, softmax with the sink column, values) in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch, ForwardMode


def attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
    options: LayerAttention,
    sinks: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
) -> torch.Tensor:
    """Softmax attention `[..., heads, queries, dim]` over `[..., kv_heads, keys, dim]`
    (GQA when the head counts differ: query head `h` uses KV head `h // group`).

    `visible` (bool, broadcastable to the scores) marks the keys each query sees; with
    `is_causal` and no mask the plain causal mask. `sinks`, broadcastable to
    `[..., heads, queries, 1]`, is `options.sinks` shaped for these queries."""
    if options.softcap is None and sinks is None:
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=visible, is_causal=is_causal and visible is None,
            scale=scale, enable_gqa=queries.shape[-3] != keys.shape[-3],
        )  # fmt: skip
    group = queries.shape[-3] // keys.shape[-3]
    if group > 1:
        keys = keys.repeat_interleave(group, dim=-3)
        values = values.repeat_interleave(group, dim=-3)
    scores = torch.matmul(queries.float(), keys.float().transpose(-1, -2)) * scale
    if options.softcap is not None:
        scores = torch.tanh(scores / options.softcap) * options.softcap
    if visible is None and is_causal:
        q_len, k_len = scores.shape[-2:]
        visible = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril(k_len - q_len)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.float().expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, values.float()).to(queries.dtype)


def window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """`[queries, keys]` bool: key at or before the query and, with a window, inside it."""
    visible = key_pos[None, :] <= query_pos[:, None]
    if window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - window
    return visible


@dataclass
class _DecodeMetadata:
    slots: torch.Tensor  # [batch * max_len] int64, padding points at slot 0
    seq_lens: torch.Tensor  # [batch] int64 on the slots' device
    max_len: int
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by window

    def mask(self, window: int | None) -> torch.Tensor:
        """`[batch, 1, 1, max_len]` bool, True where a slot is attended."""
        if window not in self.masks:
            positions = torch.arange(self.max_len, device=self.seq_lens.device)
            valid = positions[None, :] < self.seq_lens[:, None]
            if window is not None:
                valid &= positions[None, :] >= self.seq_lens[:, None] - window
            self.masks[window] = valid[:, None, None, :]
        return self.masks[window]


@dataclass
class _ExtendRequest:
    start: int  # first of this request's new tokens in the flat token dimension
    end: int
    prefix: int
    slots: torch.Tensor  # [seq_len] int64, the request's row of req_to_token
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # by window

    def mask(self, window: int | None) -> torch.Tensor | None:
        """`[extend_len, seq_len]` bool; None: no cached prefix and no window, plain causal."""
        if self.prefix == 0 and (window is None or window >= self.end - self.start):
            return None
        if window not in self.masks:
            device = self.slots.device
            query_pos = self.prefix + torch.arange(self.end - self.start, device=device)
            key_pos = torch.arange(self.slots.shape[0], device=device)
            self.masks[window] = window_mask(query_pos, key_pos, window)
        return self.masks[window]


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
        seq_lens = batch.seq_lens.to(device)
        valid = positions[None, :] < seq_lens[:, None]
        slots = torch.where(valid, rows, torch.zeros_like(rows))
        meta = _DecodeMetadata(slots.reshape(-1), seq_lens, max_len)
        meta.masks[None] = valid[:, None, None, :]
        return meta

    @staticmethod
    def _extend_metadata(batch: ForwardBatch) -> list[_ExtendRequest]:
        pool_indices = batch.req_pool_indices.tolist()
        requests = []
        start = 0
        for i, (prefix, extend) in enumerate(
            zip(batch.prefix_lens_cpu, batch.extend_lens_cpu, strict=True)
        ):
            end = start + extend
            row = batch.req_to_token[pool_indices[i], : prefix + extend].to(torch.int64)
            requests.append(_ExtendRequest(start, end, prefix, row))
            start = end
        return requests

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        scale = self.scale_for(q.shape[-1], options)
        if self._decode is not None:
            return self._forward_decode(q, layer_id, batch, self._decode, scale, options)
        if self._extend is None:
            raise RuntimeError("init_forward_metadata() was not called before forward()")
        return self._forward_extend(q, k, v, layer_id, batch, self._extend, scale, options)

    @staticmethod
    def _forward_decode(
        q: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        meta: _DecodeMetadata,
        scale: float,
        options: LayerAttention,
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
        sinks = None if options.sinks is None else options.sinks.view(num_kv_heads, group, 1)
        out = attend(
            queries, keys, values, meta.mask(options.window), scale, options, sinks
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
        options: LayerAttention,
    ) -> torch.Tensor:
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        padded = q.shape[0] > (requests[-1].end if requests else 0)
        out = torch.zeros_like(q) if padded else torch.empty_like(q)
        sinks = None if options.sinks is None else options.sinks.view(-1, 1, 1)
        for req in requests:
            mask = req.mask(options.window)
            if req.prefix == 0 and k_cache.dtype == k.dtype:
                # nothing cached: the new k/v are the whole sequence, no gather needed
                keys, values = k[req.start : req.end], v[req.start : req.end]
            else:
                keys = k_cache.index_select(0, req.slots).to(q.dtype)
                values = v_cache.index_select(0, req.slots).to(q.dtype)
            queries = q[req.start : req.end].transpose(0, 1)[None]  # [1, heads, tokens, dim]
            result = attend(
                queries, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask, scale,
                options, sinks, is_causal=mask is None,
            )  # fmt: skip
            out[req.start : req.end] = result[0].transpose(0, 1)
        return out
