"""The self-attention block every decoder layer here uses (Llama, Qwen, Mistral, the MoE
families, Gemma 2/3, gpt-oss).

One fused q/k/v projection, split; an optional per-head norm of q and k before RoPE (Qwen3's
RMSNorm, Gemma 3's `(1 + weight)` one: whatever `norm` the family passes, built when
`config.qk_norm`); RoPE with the cos/sin the model computed for the layer; the attention
backend with the layer's `LayerAttention`; the output projection. What the families differ
in is data, not code: the norm class, the config's attention options (window, soft-cap,
scale), and gpt-oss's learned sinks (a parameter of this block).

The parameter names (`qkv_proj`, `o_proj`, `q_norm`, `k_norm`, `sinks`) are what the weight
rules, the LoRA layers and W8A8 quantization find by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from sluice.runtime.attention.base import AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.layers import Linear, RMSNorm
from sluice.runtime.model.rotary import RotaryEmbedding

# builds a norm over `dim` features: (dim, eps, device, dtype) -> module
NormFactory = Callable[[int, float, torch.device | str, torch.dtype], nn.Module]


class Attention(nn.Module):
    """q/k/v -> per-head q/k norm (with `config.qk_norm`) -> RoPE -> backend -> o.

    `options` (the layer's `LayerAttention`) comes from the config: the layer's window,
    `attention_softcap`, `attention_scale`. `sinks`: a learned sink logit per query head
    (gpt-oss), a parameter loaded with the weights; `options.sinks` is that parameter
    itself, which loading fills in place, so the record built here stays the one the
    backend reads."""

    fused = False  # RoPE as one compiled CPU op (model.cpu_fused_ops)

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        *,
        norm: NormFactory = RMSNorm,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.qkv_proj = Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, device, dtype
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, config.o_bias, device, dtype)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if config.qk_norm:  # over each head's features, before RoPE
            self.q_norm = norm(config.head_dim, config.rms_norm_eps, device, dtype)
            self.k_norm = norm(config.head_dim, config.rms_norm_eps, device, dtype)
        options = LayerAttention(
            window=config.window_for(layer_id),
            softcap=config.attention_softcap,
            scale=config.attention_scale,
        )
        if sinks:
            self.sinks = nn.Parameter(
                torch.empty(config.num_attention_heads, device=device, dtype=torch.float32),
                requires_grad=False,
            )
            options = dataclasses.replace(options, sinks=self.sinks)
        self.options = options

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # rows of head_dim features
            q = self.q_norm(q.reshape(-1, self.head_dim)).view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view_as(k)
        if self.fused:
            q, k = torch.ops.sluice_cpu.rotary(q, k, cos, sin)
        else:
            q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = backend.forward(q, k, v, self.layer_id, batch, self.options)
        return self.o_proj(out.reshape(num_tokens, self.q_size))
