"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2): its decoder layer and weight rules.

One decoder layer serves all of them: Qwen2 differs only by a bias on q/k/v, which
`ModelConfig.qkv_bias` carries. The whole model is `model.causal_lm.CausalLM`
(`LlamaForCausalLM` is its old name); the rules below map Hugging Face's separate q/k/v and
gate/up projections onto the fused parameters and say how tensor parallelism splits each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.attention_block import Attention
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.layers import RMSNorm, SwiGLUMLP
from sluice.runtime.model.moe import MoE


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        tp: TensorParallelGroup = SINGLE_RANK,
    ):
        super().__init__()
        self.tp = tp
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.self_attn = Attention(config, layer_id, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.mlp: nn.Module
        if config.moe is not None and layer_id in config.moe.sparse_layers:
            self.mlp = MoE(config.hidden_size, config.moe, device, dtype)
        else:
            self.mlp = SwiGLUMLP(
                config.hidden_size, config.intermediate_size, config.mlp_bias, device, dtype
            )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.tp.all_reduce(
            self.self_attn(self.input_layernorm(x), cos, sin, batch, backend)
        )
        return x + self.tp.all_reduce(self.mlp(self.post_attention_layernorm(x)))


LlamaForCausalLM = CausalLM  # the model class's name before the registry


def attention_rules(prefix: str = "model.layers.{layer}.self_attn") -> tuple[WeightRule, ...]:
    """q/k/v (column-split into the fused qkv), o (row-split), with their optional biases."""
    target = "layers.{layer}.self_attn"
    rules = []
    for kind in ("weight", "bias"):
        rules += [
            WeightRule.literal(
                f"{prefix}.{p}_proj.{kind}", f"{target}.qkv_proj.{kind}", p, "column"
            )
            for p in "qkv"
        ]
        rules.append(
            WeightRule.literal(f"{prefix}.o_proj.{kind}", f"{target}.o_proj.{kind}", "o", "row")
        )
    return tuple(rules)


def dense_mlp_rules(prefix: str = "model.layers.{layer}.mlp") -> tuple[WeightRule, ...]:
    """gate/up (column-split into the fused gate_up), down (row-split), optional biases."""
    target = "layers.{layer}.mlp"
    rules = []
    for kind in ("weight", "bias"):
        rules += [
            WeightRule.literal(
                f"{prefix}.{p}_proj.{kind}", f"{target}.gate_up_proj.{kind}", p, "column"
            )
            for p in ("gate", "up")
        ]
        rules.append(
            WeightRule.literal(
                f"{prefix}.down_proj.{kind}", f"{target}.down_proj.{kind}", "down", "row"
            )
        )
    return tuple(rules)


def common_rules() -> tuple[WeightRule, ...]:
    """Embedding (vocab-split), final norm and the two per-layer norms (replicated)."""
    return (
        WeightRule.literal("model.embed_tokens.weight", "embed_tokens", split="vocab"),
        WeightRule.literal("model.norm.weight", "norm.weight"),
        *(
            WeightRule.literal(
                f"model.layers.{{layer}}.{norm}.weight", f"layers.{{layer}}.{norm}.weight"
            )
            for norm in ("input_layernorm", "post_attention_layernorm")
        ),
    )


LLAMA_RULES = common_rules() + attention_rules() + dense_mlp_rules()

ARCHITECTURES = (
    Architecture(
        names=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
        model_types=("llama", "mistral", "qwen2"),
        decoder_layer=LlamaDecoderLayer,
        weight_rules=LLAMA_RULES,
        read_options=lambda raw, config: silu_only(raw),
    ),
)


def silu_only(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The SwiGLU MLP's activation: only SiLU is implemented."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported (only 'silu')")
    return {}


def qk_norm_rules(prefix: str = "model.layers.{layer}.self_attn") -> tuple[WeightRule, ...]:
    """Qwen3's per-head q/k norms (replicated: every head uses the same weights)."""
    return tuple(
        WeightRule.literal(f"{prefix}.{n}.weight", f"layers.{{layer}}.self_attn.{n}.weight")
        for n in ("q_norm", "k_norm")
    )
