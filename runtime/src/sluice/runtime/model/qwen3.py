"""Qwen3 (dense): the Llama decoder layer with an RMSNorm over each head of q and k.

`q_norm` / `k_norm` (over `head_dim`) run after the projections and before RoPE; `head_dim`
is explicit in the config (128 with 4096-wide hidden states in Qwen3-8B, not hidden/heads);
no q/k/v bias unless `attention_bias`. The norms are replicated under tensor parallelism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.runtime.model.architecture import Architecture
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.llama import LLAMA_RULES, LlamaDecoderLayer, qk_norm_rules, silu_only


def qwen3_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    return {**silu_only(raw), "qk_norm": True}


ARCHITECTURES = (
    Architecture(
        names=("Qwen3ForCausalLM",),
        model_types=("qwen3",),
        decoder_layer=LlamaDecoderLayer,
        weight_rules=LLAMA_RULES + qk_norm_rules(),
        read_options=qwen3_options,
    ),
)
