"""The contract every attention backend (torch, triton, flashinfer) fulfils."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from sluice.runtime.forward import ForwardBatch


@dataclass(frozen=True, eq=False)
class LayerAttention:
    """What one layer's attention asks of a backend besides q, k and v.

    - `window`: sliding-window attention as Hugging Face defines it (Mistral, Gemma 2/3,
      gpt-oss): the query at position `p` sees the keys at positions `p - window + 1`
      through `p` (`window` keys, itself included). None: every earlier key (full attention).
    - `sinks`: `[num_heads]` fp32 logits, one per query head of this rank (gpt-oss): each
      softmax gets one more term `exp(sink)` whose value vector is zero, so the weights of
      the real keys sum to less than one.
    - `softcap`: logit soft-capping (Gemma 2): scores (already scaled) become
      `softcap * tanh(score / softcap)` before the mask and the softmax. None: off.
    - `scale`: the scores' scale; None: the backend's own (`1 / sqrt(head_dim)` by default).

    The record is built once per layer by the model and handed to every `forward` call; a
    backend that cannot honour an option says so in `unsupported` (checked at load).
    """

    window: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be at least 1 token, got {self.window}")
        if self.softcap is not None and self.softcap <= 0:
            raise ValueError(f"logit soft-cap must be positive, got {self.softcap}")

    @property
    def is_plain(self) -> bool:
        """Full causal attention with at most a custom scale: what every backend does."""
        return self.window is None and self.sinks is None and self.softcap is None

    def first_visible(self, position: int) -> int:
        """The first key position the query at `position` sees."""
        return 0 if self.window is None else max(0, position - self.window + 1)


FULL_ATTENTION = LayerAttention()


class AttentionBackend(abc.ABC):
    """Paged causal attention over the KV cache, for extend (prefill) and decode batches.

    Call order per forward pass:

    1. `init_forward_metadata(batch)` once, before the first layer. It derives from the
       batch whatever every layer reuses (gather indices, masks, kernel plans), so the
       per-layer `forward` does no host-side work that depends only on the batch.
    2. `forward(q, k, v, layer_id, batch)` once per layer, where
       - `q` is `[num_tokens, num_heads, head_dim]`, `k` and `v` are
         `[num_tokens, num_kv_heads, head_dim]` for the new tokens of this forward, with
         RoPE already applied to `q` and `k`, tokens of all requests concatenated in
         request order (`batch.extend_lens[i]` tokens for request `i`);
       - it first stores `k`/`v` in `batch.kv` for layer `layer_id` at slots
         `batch.out_cache_loc`;
       - then each new token of request `i` attends to the KV slots
         `batch.req_to_token[batch.req_pool_indices[i], :batch.seq_lens[i]]`, causally: new
         token `j` sits at absolute position `prefix_lens[i] + j` and sees slots `0` through
         that position (a decode token sees all `seq_lens[i]` slots);
       - GQA: query head `h` uses KV head `h // (num_heads // num_kv_heads)`;
       - `options` (a `LayerAttention`, the layer's own) narrows that to a sliding window,
         adds per-head sink logits, soft-caps the scores and may replace the scale;
       - scores are scaled by `options.scale`, else the backend's `scale` (default
         `1 / sqrt(head_dim)`);
       - it returns `[num_tokens, num_heads, head_dim]` in `q`'s dtype.

    Slot 0 of the KV buffers is never allocated, so a backend may point padding at it.
    Backends hold no per-request state between forwards.

    CUDA graphs (`supports_cuda_graph`): a decode forward through the backend may be
    captured with static input tensors and replayed; `init_forward_metadata` must then do
    no work that waits for the device and must not allocate host-dependent shapes.
    Before the capture and before every replay the graph runner calls
    `init_forward_metadata_for_graph` with the padded batch (real host-side lengths), for
    host-side planning whose results land in buffers the captured kernels read.
    """

    supports_cuda_graph: ClassVar[bool] = False

    def __init__(self, scale: float | None = None) -> None:
        self.scale = scale

    def scale_for(self, head_dim: int, options: LayerAttention = FULL_ATTENTION) -> float:
        if options.scale is not None:
            return options.scale
        return self.scale if self.scale is not None else 1.0 / math.sqrt(head_dim)

    def unsupported(self, options: LayerAttention) -> str | None:
        """Why this backend cannot run a layer with `options`; None when it can. The loader
        asks for every layer and refuses the model with the reason."""
        return None

    @abc.abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare what all layers of this forward share; called once before the layers."""

    @abc.abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        """Store `k`/`v` at `batch.out_cache_loc`, then attend; see the class docstring."""

    def init_forward_metadata_for_graph(self, batch: ForwardBatch) -> None:
        """Host-side planning for a captured decode graph's batch; see the class docstring.
        Backends whose kernels read everything from the batch's tensors need nothing."""
        return None
