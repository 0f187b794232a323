"""Gemma 2 and Gemma 3 (text; Gemma 3's multimodal checkpoints served as text) over a
paged KV cache.

What sets them apart from the Llama family, all of it per transformers' `modeling_gemma2`
and `modeling_gemma3`:

- sliding-window and full-attention layers interleaved (`config.layer_types`: Gemma 2
  alternates, Gemma 3 has five local layers per global one), each layer's window, scale
  (`query_pre_attn_scalar ** -0.5`) and attention soft-cap (Gemma 2's
  `attn_logit_softcapping`) handed to the attention backend as its `LayerAttention`;
- two RoPE bases on Gemma 3 (`rope_local_base_freq` for the sliding layers, `rope_theta`
  with its scaling for the global ones);
- RMSNorm with a `(1 + weight)` gain computed in fp32; per-head RMSNorm of q and k on Gemma 3
  (QK-norm), before RoPE;
- four norms per layer: before and after attention, before and after the MLP;
- the embeddings multiplied by `sqrt(hidden_size)` (rounded to the weights' dtype);
- GeGLU: `down(gelu_tanh(gate(x)) * up(x))`;
- the final logits soft-capped (Gemma 2's `final_logit_softcapping`).

The model is `CausalLM` with Gemma's embedding scale, norms, RoPE bases and final soft-cap;
its weight rules are Llama's plus the two feed-forward norms and the q/k norms. Tensor
parallelism follows the rules (each rank holds its heads and MLP share); the row-parallel
outputs are all-reduced before the post-norms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.attention_block import Attention
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.config import ModelConfig, RopeScaling
from sluice.runtime.model.layers import Linear
from sluice.runtime.model.llama import attention_rules, common_rules, dense_mlp_rules
from sluice.runtime.model.parallel_layers import embed
from sluice.runtime.model.rotary import RotaryEmbedding

_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class GemmaRMSNorm(nn.Module):
    """`x / rms(x) * (1 + weight)` in fp32, rounded once to the input's dtype (Gemma's order)."""

    def __init__(self, dim: int, eps: float, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GeGLUMLP(nn.Module):
    """`down(gelu_tanh(gate(x)) * up(x))` with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.intermediate_size = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, False, device, dtype)
        self.down_proj = Linear(intermediate, hidden, False, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        tp: TensorParallelGroup,
    ):
        super().__init__()
        self.tp = tp
        eps, hidden = config.rms_norm_eps, config.hidden_size
        for name in _NORMS:
            setattr(self, name, GemmaRMSNorm(hidden, eps, device, dtype))
        self.self_attn = Attention(config, layer_id, device, dtype, norm=GemmaRMSNorm)
        self.sliding = config.window_for(layer_id) is not None
        self.mlp = GeGLUMLP(hidden, config.intermediate_size, device, dtype)

    def forward(
        self,
        x: torch.Tensor,
        ropes: Mapping[bool, tuple[torch.Tensor, torch.Tensor]],
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        cos, sin = ropes[self.sliding]
        attn = self.self_attn(self.input_layernorm(x), cos, sin, batch, backend)
        x = x + self.post_attention_layernorm(self.tp.all_reduce(attn))
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(self.tp.all_reduce(mlp))


class GemmaForCausalLM(CausalLM):
    """Gemma 2 / Gemma 3 text model: `CausalLM` (its rule-driven loading and sharding) with
    Gemma's embedding scale, final norm, two RoPE bases and final soft-cap."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallelGroup = SINGLE_RANK,
        *,
        architecture: Architecture,
    ) -> None:
        super().__init__(config, attn_backend, device, dtype, tp, architecture=architecture)
        # HF keeps the multiplier as a tensor cast to the weights' dtype
        self.embed_scale = float(torch.tensor(config.hidden_size**0.5, dtype=dtype))
        local_theta = config.rope_local_theta or config.rope_theta
        self.local_rotary = RotaryEmbedding(config.head_dim, local_theta, RopeScaling(), device)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.final_softcap = config.final_logit_softcap
        self.uses_sliding = any(config.window_for(i) for i in range(config.num_hidden_layers))

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits at each request's last new token (every token with
        `batch.return_all_logits`; `batch.extra_logit_indices` rows after them)."""
        self.attn_backend.init_forward_metadata(batch)
        hidden = embed(batch.input_ids, self.embed_tokens, self.shard.vocab_start, self.tp)
        hidden = hidden * self.embed_scale
        ropes = {False: self.rotary.cos_sin(batch.positions, hidden.dtype)}
        if self.uses_sliding:
            ropes[True] = self.local_rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, ropes, batch, self.attn_backend)
        logits = self.logits(hidden, batch)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def _read_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    act = config.hidden_act
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma's MLP is GeGLU (gelu_pytorch_tanh); hidden_activation={act!r} "
                         "is not supported")  # fmt: skip
    scalar = raw.get("query_pre_attn_scalar") or config.head_dim
    return {
        "qk_norm": str(raw.get("model_type", "")).startswith("gemma3"),
        "attention_scale": float(scalar) ** -0.5,
        "attention_softcap": _positive(raw.get("attn_logit_softcapping")),
        "final_logit_softcap": _positive(raw.get("final_logit_softcapping")),
    }


def _positive(value: Any) -> float | None:
    """A soft-cap of config.json: None (or 0) turns it off."""
    return float(value) if value else None


GEMMA_RULES = (
    common_rules()
    + attention_rules()
    + dense_mlp_rules()
    + tuple(
        WeightRule.literal(f"model.layers.{{layer}}.{n}.weight", f"layers.{{layer}}.{n}.weight")
        for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm",
                  "self_attn.q_norm", "self_attn.k_norm")  # the last two: Gemma 3 only
    )  # fmt: skip
)

# Gemma 3 4B, 12B and 27B are published as Gemma3ForConditionalGeneration: the language
# model (transformers 4 saved it under `language_model.model.*`, transformers 5 under
# `model.language_model.*`) beside a vision tower, which is not loaded (text only)
_LANGUAGE_MODEL_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION_PREFIXES = (
    "vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
)  # fmt: skip


def language_model_name(name: str) -> str | None:
    """A Gemma3ForConditionalGeneration tensor's name as Gemma3ForCausalLM's; None for the
    vision tower and its projector."""
    if name.startswith(_VISION_PREFIXES):
        return None
    for old, new in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


GEMMA = Architecture(
    names=("Gemma3ForCausalLM", "Gemma2ForCausalLM"),
    model_types=("gemma3_text", "gemma2"),
    decoder_layer=GemmaDecoderLayer,
    weight_rules=GEMMA_RULES,
    model_class=GemmaForCausalLM,
    read_options=_read_options,
)
ARCHITECTURES = (
    GEMMA,
    dataclasses.replace(
        GEMMA, names=("Gemma3ForConditionalGeneration",), model_types=("gemma3",),
        checkpoint_name=language_model_name,
    ),  # fmt: skip
)
