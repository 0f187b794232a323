"""`cpu`: paged attention for the CPU that reads K/V in place, with no padding and no gather.

Decode and extend go through one compiled kernel (`kernels/csrc/paged_attention.cpp`,
`torch.ops.sluice_cpu.paged_attention`): each request's keys and values are read straight
from the pool through its row of `req_to_token`, the query heads of a KV head share every
load, long sequences are split over threads (split-KV with an online softmax, in chunks at
fixed key positions, so a token's output does not depend on how its forward was cut), and
the work is dealt to threads by cost, so a skewed batch costs what a uniform one of the same total
length costs. A cached prefix is read in place by every chunk of an extend. A layer's sliding window,
sink logits and soft-cap (`LayerAttention`) are kernel arguments; a windowed layer reads
only its window's keys.

Before the kernel is used, `cpu_kernel_check` runs it once against float64 attention on
this CPU (it is compiled with `-march=native`, so each CPU runs its own instructions).
Where the kernels cannot be built (no C++ compiler), or fail that check, the backend runs
`VarlenTorchAttention`:
decode over the flat list of every request's slots (no padding to the longest request),
extend through the torch backend's per-request SDPA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.attention.cpu_kernel_check import kernel_problem
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.kernels import cpu_extension as extension

logger = logging.getLogger(__name__)

# keys per split-KV chunk, the same for decode and extend: chunks sit at whole multiples of
# it in key positions, so a query's keys are summed in the same groups whether it is computed
# in a prefill, after a cached prefix, in a chunk or as a decode step (cache invariance)
KV_CHUNK = 256
QUERY_BLOCK = 16  # extend queries per work unit (times the GQA group = rows)
KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # of q and of the cache; others run torch


@dataclass(frozen=True)
class _Metadata:
    rows: torch.Tensor  # [batch] int64 on the CPU, req_to_token row of each request
    prefix_lens: torch.Tensor  # [batch] int64, tokens before this forward's first new token
    extend_lens: torch.Tensor  # [batch] int64
    kv_chunk: int


class CpuAttentionBackend(AttentionBackend):
    def __init__(self, scale: float | None = None, *, use_kernels: bool | None = None) -> None:
        super().__init__(scale)
        reason = extension.load() if use_kernels is not False else None
        if reason is None and use_kernels is not False:
            reason = kernel_problem()
        if use_kernels and reason is not None:
            raise RuntimeError(f"CPU attention kernels unavailable: {reason}")
        if use_kernels is None:
            use_kernels = reason is None
            if reason is not None:
                logger.warning("cpu attention: compiled kernels unavailable (%s); using torch "
                               "varlen attention", reason)
        self.use_kernels = use_kernels
        self._fallback = None if use_kernels else VarlenTorchAttention(scale)
        self._meta: _Metadata | None = None

    @property
    def implementation(self) -> str:
        return "kernels" if self.use_kernels else "torch-varlen"

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self._fallback is not None:
            self._fallback.init_forward_metadata(batch)
            return
        extend = torch.tensor(batch.extend_lens_cpu, dtype=torch.int64)
        seq = torch.tensor(batch.seq_lens_cpu, dtype=torch.int64)
        self._meta = _Metadata(
            rows=batch.req_pool_indices.to("cpu", torch.int64),
            prefix_lens=seq - extend,
            extend_lens=extend,
            kv_chunk=KV_CHUNK,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        if self._fallback is not None:
            return self._fallback.forward(q, k, v, layer_id, batch, options)
        meta = self._meta
        if meta is None:
            raise RuntimeError("init_forward_metadata() was not called before forward()")
        if q.dtype not in KERNEL_DTYPES or batch.kv.dtype not in KERNEL_DTYPES:
            return self._unsupported_dtype(q, k, v, layer_id, batch, options)
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        return torch.ops.sluice_cpu.paged_attention(
            q, batch.kv.k[layer_id], batch.kv.v[layer_id], batch.req_to_token, meta.rows,
            meta.prefix_lens, meta.extend_lens, self.scale_for(q.shape[-1], options),
            meta.kv_chunk, QUERY_BLOCK, options.window or 0, options.sinks, options.softcap or 0.0,
        )  # fmt: skip

    def _unsupported_dtype(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention,
    ) -> torch.Tensor:
        """fp16 (or another dtype the kernels lack): from now on the torch fallback runs (the
        first layer of the first forward gets here; later calls take the fallback at once)."""
        logger.warning("cpu attention: no kernel for %s/%s; using torch varlen attention",
                       q.dtype, batch.kv.dtype)  # fmt: skip
        self._fallback = VarlenTorchAttention(self.scale)
        self._fallback.init_forward_metadata(batch)
        return self._fallback.forward(q, k, v, layer_id, batch, options)


class VarlenTorchAttention(AttentionBackend):
    """Torch-only fallback. Decode: every request's slots concatenated (total tokens, no
    padding), scores per (token, query head), softmax per request segment (a sliding window
    drops the slots before it, a sink joins each segment's max and sum). Extend: the torch
    backend's per-request attention."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__(scale)
        self._extend = TorchAttentionBackend(scale)
        # slots, their owner request, their position from the end of the request
        self._decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._decode = None
        if batch.mode != ForwardMode.DECODE:
            self._extend.init_forward_metadata(batch)
            return
        device = batch.req_to_token.device
        lens = torch.tensor(batch.seq_lens_cpu, dtype=torch.int64, device=device)
        owner = torch.repeat_interleave(torch.arange(len(batch.seq_lens_cpu), device=device), lens)
        starts = torch.cumsum(lens, 0) - lens
        positions = torch.arange(int(lens.sum()), device=device) - starts[owner]
        rows = batch.req_pool_indices.to(device)[owner]
        slots = batch.req_to_token[rows, positions].to(torch.int64)
        self._decode = (slots, owner, lens[owner] - positions)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        if self._decode is None:
            return self._extend.forward(q, k, v, layer_id, batch, options)
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        slots, owner, from_end = self._decode
        if options.window is not None:
            inside = from_end <= options.window
            slots, owner = slots[inside], owner[inside]
        num_reqs = batch.batch_size
        _, heads, dim = q.shape
        keys = batch.kv.k[layer_id].index_select(0, slots).float()  # [T, kv_heads, dim]
        values = batch.kv.v[layer_id].index_select(0, slots).float()
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        queries = q[:num_reqs].float().view(num_reqs, kv_heads, group, dim)[owner]
        scores = torch.einsum("tkgd,tkd->tkg", queries, keys) * self.scale_for(dim, options)
        if options.softcap is not None:
            scores = torch.tanh(scores / options.softcap) * options.softcap
        peak = torch.full((num_reqs, kv_heads, group), float("-inf"), device=q.device)
        sinks = None
        if options.sinks is not None:
            sinks = options.sinks.float().view(1, kv_heads, group).expand(num_reqs, -1, -1)
            peak = sinks.clone()
        peak = peak.scatter_reduce(0, owner[:, None, None].expand_as(scores), scores, "amax")
        weights = torch.exp(scores - peak[owner])
        total = torch.zeros_like(peak).index_add_(0, owner, weights)
        if sinks is not None:
            total += torch.exp(sinks - peak)
        out = torch.zeros(num_reqs, kv_heads, heads // kv_heads, dim, device=q.device)
        out.index_add_(0, owner, weights[..., None] * values[:, :, None, :])
        out = (out / total[..., None]).reshape(num_reqs, heads, dim).to(q.dtype)
        if q.shape[0] > num_reqs:
            out = torch.cat([out, out.new_zeros(q.shape[0] - num_reqs, heads, dim)])
        return out
