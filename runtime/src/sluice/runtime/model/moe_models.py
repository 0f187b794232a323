"""Qwen3-MoE and Mixtral: the Llama decoder layer with a mixture-of-experts MLP (`model.moe`).

- `Qwen3MoeForCausalLM`: Qwen3's per-head q/k norms; experts in the layers that
  `decoder_sparse_step` and `mlp_only_layers` pick, a dense MLP in the others; softmax top-k
  routing, renormalised only with `norm_topk_prob`. Checkpoint names
  `mlp.gate` (router) and `mlp.experts.{e}.{gate,up,down}_proj`.
- `MixtralForCausalLM`: experts in every layer, top-2 of the router's softmax renormalised
  (a softmax over the chosen logits). Names `block_sparse_moe.gate` and
  `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2` (down).

Shared experts (Qwen2-MoE, DeepSeek) are not implemented; such configs are other
architectures and are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.config import ModelConfig, MoEOptions
from sluice.runtime.model.llama import (
    LlamaDecoderLayer,
    attention_rules,
    common_rules,
    dense_mlp_rules,
    qk_norm_rules,
    silu_only,
)


def expert_rules(prefix: str, gate: str, up: str, down: str) -> tuple[WeightRule, ...]:
    """The router (replicated) and each expert's gate/up (column) and down (row) projections
    under `prefix` (`model.layers.{layer}.mlp`), named `gate`, `up`, `down` there."""
    target = "layers.{layer}.mlp"
    experts = f"{prefix}.experts.{{expert}}"
    return (
        WeightRule.literal(f"{prefix}.gate.weight", f"{target}.gate.weight"),
        WeightRule.literal(f"{experts}.{gate}.weight", f"{target}.w13", "expert_gate", "column"),
        WeightRule.literal(f"{experts}.{up}.weight", f"{target}.w13", "expert_up", "column"),
        WeightRule.literal(f"{experts}.{down}.weight", f"{target}.w2", "expert_down", "row"),
    )


def qwen3_moe_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    silu_only(raw)
    # transformers 5 writes `num_local_experts` (its attribute map), the Hub's configs `num_experts`
    num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    step = int(raw.get("decoder_sparse_step", 1) or 1)
    dense = set(raw.get("mlp_only_layers") or ())
    sparse = tuple(
        i
        for i in range(config.num_hidden_layers)
        if i not in dense and num_experts > 0 and (i + 1) % step == 0
    )
    if int(raw.get("shared_expert_intermediate_size", 0) or 0):
        raise ValueError("shared_expert_intermediate_size is not supported (no shared experts)")
    moe = MoEOptions(
        num_experts=num_experts,
        top_k=int(raw.get("num_experts_per_tok", 8)),
        intermediate_size=int(raw["moe_intermediate_size"]),
        renormalize=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )
    return {"qk_norm": True, "moe": moe if sparse else None}


def mixtral_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    silu_only(raw)
    moe = MoEOptions(
        num_experts=int(raw.get("num_local_experts", 8)),
        top_k=int(raw.get("num_experts_per_tok", 2)),
        intermediate_size=config.intermediate_size,
        renormalize=True,
        sparse_layers=tuple(range(config.num_hidden_layers)),
    )
    return {"moe": moe}


ARCHITECTURES = (
    Architecture(
        names=("Qwen3MoeForCausalLM",),
        model_types=("qwen3_moe",),
        decoder_layer=LlamaDecoderLayer,
        weight_rules=common_rules()
        + attention_rules()
        + qk_norm_rules()
        + dense_mlp_rules()
        + expert_rules("model.layers.{layer}.mlp", "gate_proj", "up_proj", "down_proj"),
        read_options=qwen3_moe_options,
    ),
    Architecture(
        names=("MixtralForCausalLM",),
        model_types=("mixtral",),
        decoder_layer=LlamaDecoderLayer,
        weight_rules=common_rules()
        + attention_rules()
        + expert_rules("model.layers.{layer}.block_sparse_moe", "w1", "w3", "w2"),
        read_options=mixtral_options,
    ),
)
