"""`TritonAttentionBackend`: Sluice's own paged decode and extend kernels.

On a GPU the kernels compile for the device (bf16/fp16 storage, fp32 accumulation). On the
CPU they run only under Triton's interpreter (`TRITON_INTERPRET=1`, set before Triton is
imported), on fp32 tensors: that is how the test suite proves them without a GPU.

Per forward, `init_forward_metadata` keeps references to the batch's own device tensors
(request rows, lengths) and derives the extend offsets; nothing in it waits for the
device, so a decode forward through this backend can be captured in a CUDA graph with
static input buffers and replayed for any lengths (the kernels read the lengths on the
device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.attention.triton.config import TritonAttentionConfig
from sluice.runtime.attention.triton.decode import decode_attention
from sluice.runtime.attention.triton.extend import extend_attention
from sluice.runtime.forward import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class _Metadata:
    mode: ForwardMode
    num_reqs: int
    num_req_tokens: int  # tokens that belong to requests; rows past them are padding
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_starts: torch.Tensor | None  # extend: first new token of each request
    max_extend_len: int


class TritonAttentionBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(
        self, scale: float | None = None, config: TritonAttentionConfig | None = None
    ) -> None:
        super().__init__(scale)
        self.config = config
        self._meta: _Metadata | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.config is None:
            self.config = TritonAttentionConfig.for_device(str(batch.req_to_token.device))
        starts = None
        if batch.mode == ForwardMode.EXTEND:
            starts = torch.cumsum(batch.extend_lens, 0) - batch.extend_lens
        self._meta = _Metadata(
            mode=batch.mode,
            num_reqs=batch.batch_size,
            num_req_tokens=sum(batch.extend_lens_cpu),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            prefix_lens=batch.prefix_lens,
            extend_lens=batch.extend_lens,
            extend_starts=starts,
            max_extend_len=max(batch.extend_lens_cpu, default=0),
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
        meta, config = self._meta, self.config
        if meta is None or config is None:
            raise RuntimeError("init_forward_metadata() was not called before forward()")
        config = config.for_head_dim(q.shape[-1])
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        padded = q.shape[0] > meta.num_req_tokens
        out = torch.zeros_like(q) if padded else torch.empty_like(q)
        scale = self.scale_for(q.shape[-1], options)
        if meta.mode == ForwardMode.DECODE:
            decode_attention(
                q, k_cache, v_cache, batch.req_to_token, meta.req_pool_indices, meta.seq_lens,
                out, scale, config, options.window, options.sinks, options.softcap,
            )  # fmt: skip
        else:
            assert meta.extend_starts is not None
            extend_attention(
                q, k, v, k_cache, v_cache, out, batch.req_to_token, meta.req_pool_indices,
                meta.prefix_lens, meta.extend_lens, meta.extend_starts, meta.max_extend_len,
                scale, config, options.window, options.sinks, options.softcap,
            )  # fmt: skip
        return out
