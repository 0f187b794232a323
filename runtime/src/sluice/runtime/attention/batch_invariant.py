"""Batch-invariant paged attention in torch (`--enable-deterministic-inference`).

A request's attention output must not depend on what else shares its batch, nor on whether
its token is computed in a prefill, a chunk, or a decode step. So every reduction has a
fixed shape and order:

- each request is computed on its own (no padding to other requests' lengths);
- its query rows are padded to a multiple of `ROW_MULTIPLE` (CPU GEMMs give bitwise-equal
  rows only when the row count is such a multiple);
- its keys are padded to whole splits of `SPLIT` slots; scores, exp-sums and the
  probability-weighted values are computed per split with same-shaped GEMMs and summed
  across splits sequentially, so the trailing splits a prefill query cannot see add exact
  zeros.

A layer's sliding window only narrows the mask (masked keys add exact zeros as before);
soft-capping acts on the scores; a sink logit joins the max and adds one term to the sum.

On CUDA both GEMMs run the fixed-tile Triton kernel (`kernels/triton_batch_invariant.bmm`),
since cuBLAS picks its kernel by the shape. It is several times slower than
`TorchAttentionBackend`; it is only used in that mode (on the CPU only in fp32: bf16 runs
the `cpu` backend, which is row-invariant by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch

SPLIT = 64
ROW_MULTIPLE = 16


def _batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` over leading batch dims. On CUDA the fixed-tile Triton kernel (cuBLAS picks
    its kernel by the shape, and `rows` differs from request to request); on the CPU torch's
    GEMM, whose rows are bitwise alike at multiples of ROW_MULTIPLE rows."""
    if a.is_cuda:
        return triton_batched_matmul(a, b)
    return torch.matmul(a.contiguous(), b.contiguous())


def triton_batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` over leading batch dims on `kernels.triton_batch_invariant.bmm`, in `a`'s dtype."""
    from sluice.runtime.kernels.triton_batch_invariant import bmm

    flat_b = b.reshape(-1, *b.shape[-2:]).transpose(-1, -2)  # [B, N, K]
    out = bmm(a.reshape(-1, *a.shape[-2:]), flat_b)
    return out.view(*a.shape[:-2], a.shape[-2], b.shape[-1])


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


@dataclass
class _Request:
    start: int
    num_queries: int
    padded_queries: int
    prefix: int
    slots: torch.Tensor  # [padded_len] int64, padding at slot 0
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # by window

    def visible(self, window: int | None) -> torch.Tensor:
        """`[padded_queries, padded_len]` bool."""
        if window not in self.masks:
            device = self.slots.device
            query_pos = self.prefix + torch.arange(self.padded_queries, device=device)
            key_pos = torch.arange(self.slots.numel(), device=device)
            visible = key_pos[None, :] <= query_pos[:, None]
            if window is not None:
                visible &= key_pos[None, :] > query_pos[:, None] - window
            visible[self.num_queries :] = False
            visible[self.num_queries :, 0] = True  # padding rows see one slot: no NaN, dropped
            self.masks[window] = visible
        return self.masks[window]


class BatchInvariantAttentionBackend(AttentionBackend):
    def __init__(self, scale: float | None = None) -> None:
        super().__init__(scale)
        self._requests: list[_Request] = []

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.req_to_token.device
        rows = batch.req_pool_indices.tolist()
        self._requests = []
        start = 0
        for row, prefix, extend in zip(
            rows, batch.prefix_lens_cpu, batch.extend_lens_cpu, strict=True
        ):
            seq_len = prefix + extend
            padded_len = round_up(seq_len, SPLIT)
            padded_q = round_up(extend, ROW_MULTIPLE)
            slots = torch.zeros(padded_len, dtype=torch.int64, device=device)
            slots[:seq_len] = batch.req_to_token[row, :seq_len]
            self._requests.append(_Request(start, extend, padded_q, prefix, slots))
            start += extend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        num = sum(r.num_queries for r in self._requests)
        batch.kv.write(layer_id, batch.out_cache_loc[:num], k[:num], v[:num])
        scale = self.scale_for(q.shape[-1], options)
        out = torch.zeros_like(q)  # rows past the requests' tokens (padding) stay zero
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        for req in self._requests:
            out[req.start : req.start + req.num_queries] = self._attend(
                q[req.start : req.start + req.num_queries], k_cache, v_cache, req, scale, options
            )
        return out

    @staticmethod
    def _attend(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req: _Request,
        scale: float,
        options: LayerAttention,
    ) -> torch.Tensor:
        n, heads, dim = q.shape
        kv_heads = k_cache.shape[1]
        group = heads // kv_heads
        splits = req.slots.numel() // SPLIT
        rows = req.padded_queries * group
        queries = q.new_zeros(req.padded_queries, heads, dim)
        queries[:n] = q
        # [kv_heads, rows, dim] with rows = (query, head-in-group)
        queries = queries.view(req.padded_queries, kv_heads, group, dim).permute(1, 0, 2, 3)
        queries = queries.reshape(kv_heads, 1, rows, dim).expand(kv_heads, splits, rows, dim)
        keys = k_cache.index_select(0, req.slots).to(q.dtype)
        values = v_cache.index_select(0, req.slots).to(q.dtype)
        keys = keys.view(splits, SPLIT, kv_heads, dim).permute(2, 0, 3, 1)  # [kvh, splits, dim, S]
        values = values.view(splits, SPLIT, kv_heads, dim).permute(
            2, 0, 1, 3
        )  # [kvh, splits, S, dim]
        scores = _batched_matmul(queries, keys) * scale  # [kvh, splits, rows, S]
        if options.softcap is not None:
            scores = torch.tanh(scores / options.softcap) * options.softcap
        visible = req.visible(options.window).view(req.padded_queries, 1, splits, SPLIT)
        visible = visible.expand(req.padded_queries, group, splits, SPLIT).reshape(
            rows, splits, SPLIT
        )
        scores = scores.masked_fill(~visible.permute(1, 0, 2)[None], float("-inf"))
        peak = scores.amax(dim=(1, 3), keepdim=True)  # max is exact in any order
        sinks = None
        if options.sinks is not None:  # [kvh, 1, rows, 1], rows = (query, head in group)
            sinks = options.sinks.to(scores.dtype).view(kv_heads, 1, 1, group)
            sinks = sinks.expand(kv_heads, req.padded_queries, 1, group).reshape(kv_heads, 1, rows, 1)
            peak = torch.maximum(peak, sinks)
        weights = torch.exp(scores - peak)
        split_sums = weights.sum(dim=3)  # [kvh, splits, rows], fixed-size reductions
        partial = _batched_matmul(weights, values)  # [kvh, splits, rows, dim]
        total, acc = split_sums[:, 0], partial[:, 0]
        for s in range(1, splits):  # sequential: trailing all-masked splits add exact zeros
            total = total + split_sums[:, s]
            acc = acc + partial[:, s]
        if sinks is not None:
            total = total + torch.exp(sinks - peak)[:, 0, :, 0]
        result = acc / total[..., None]  # [kvh, rows, dim]
        result = result.view(kv_heads, req.padded_queries, group, dim).permute(1, 0, 2, 3)
        return result.reshape(req.padded_queries, heads, dim)[:n]
