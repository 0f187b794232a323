"""Write a tiny Hugging Face model as a GGUF file the way llama.cpp's converter names and
lays it out (gguf-py's own tensor-name map and metadata keys), unquantized (F32), so a test
can serve the GGUF and hold it to transformers' own GGUF loader.

Families: Qwen3 (`qwen3`), Qwen3-MoE (`qwen3moe`: each layer's experts stacked into one
tensor per projection), Gemma 3 (`gemma3`: RMSNorm gains written as `1 + w`, as llama.cpp
stores Gemma's norms) and Mixtral (llama.cpp's `llama` with `expert_count`: q and k
permuted as its converter permutes them, experts stacked). The tokenizer goes in as llama.cpp's `gpt2` BPE (tokens,
merges, token types) with the chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

ARCH = {"qwen3": "QWEN3", "qwen3_moe": "QWEN3MOE", "gemma3_text": "GEMMA3", "mixtral": "LLAMA"}
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def write_gguf(folder: Path, out: Path) -> Path:
    """The HF model folder `folder` (config, safetensors, tokenizer) as the GGUF `out`."""
    import gguf
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    model_type = config["model_type"]
    arch = getattr(gguf.MODEL_ARCH, ARCH[model_type])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, layers)
    writer = gguf.GGUFWriter(str(out), arch_name)
    _metadata(writer, config, model_type)
    _tokenizer(writer, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    if model_type == "qwen3_moe":
        tensors = _stack_experts(tensors, config)
    if model_type == "mixtral":
        tensors = _mixtral_layout(tensors, config)
    for name, tensor in tensors.items():
        base, _, suffix = name.rpartition(".")
        mapped = names.get_name(base)
        if mapped is None:
            raise ValueError(f"no GGUF name for {name}")
        data = tensor.float()
        if model_type == "gemma3_text" and base.endswith("norm"):
            data = data + 1  # llama.cpp stores Gemma's (1 + w) gains
        writer.add_tensor(f"{mapped}.{suffix}", data.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _metadata(writer: Any, config: dict[str, Any], model_type: str) -> None:
    import gguf

    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    if model_type == "gemma3_text":
        full = rope["full_attention"]
        writer.add_rope_freq_base(full["rope_theta"])
        writer.add_sliding_window(config["sliding_window"])
        if full.get("rope_type", "default") != "default":  # Gemma 3 4B+: linear x8
            writer.add_rope_scaling_type(gguf.RopeScalingType(full["rope_type"]))
            writer.add_rope_scaling_factor(full["factor"])
    else:
        writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    if model_type in ("qwen3_moe", "mixtral"):
        writer.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if "moe_intermediate_size" in config:
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_file_type(0)  # all F32


def _tokenizer(writer: Any, folder: Path) -> None:
    import gguf

    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    size = max([*vocab.values(), *added.values()]) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for text, i in added.items():
        tokens[i], types[i] = text, gguf.TokenType.CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    if eos in added:
        writer.add_eos_token_id(added[eos])
    template = config.get("chat_template")
    if template:
        writer.add_chat_template(template)


def _stack_experts(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each layer's per-expert projections as one `[experts, out, in]` tensor, named
    `model.layers.L.mlp.experts.<proj>.weight` (what gguf-py maps to `ffn_*_exps`)."""
    out: dict[str, torch.Tensor] = {}
    experts = config.get("num_experts") or config["num_local_experts"]
    for name, tensor in tensors.items():
        if ".mlp.experts." not in name:
            out[name] = tensor
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        for proj in EXPERT_PROJECTIONS:
            parts = [tensors.get(f"{prefix}.{e}.{proj}.weight") for e in range(experts)]
            if all(p is not None for p in parts):
                out[f"{prefix}.{proj}.weight"] = torch.stack(parts)  # type: ignore[arg-type]
        if f"{prefix}.gate_up_proj" in tensors:  # transformers 5's fused layout
            gate_up = tensors[f"{prefix}.gate_up_proj"]
            width = gate_up.shape[1] // 2
            out[f"{prefix}.gate_proj.weight"] = gate_up[:, :width]
            out[f"{prefix}.up_proj.weight"] = gate_up[:, width:]
            out[f"{prefix}.down_proj.weight"] = tensors[f"{prefix}.down_proj"]
    return out


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter's q/k permutation (rotary halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _mixtral_layout(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """q/k permuted; each layer's experts stacked under the names gguf-py maps to
    `ffn_*_exps` (`block_sparse_moe.experts.w1/w3/w2`)."""
    out: dict[str, torch.Tensor] = {}
    experts = config["num_local_experts"]
    for name, tensor in tensors.items():
        if name.endswith("q_proj.weight"):
            out[name] = _permute(tensor, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            out[name] = _permute(tensor, config["num_key_value_heads"])
        elif ".experts." not in name:
            out[name] = tensor
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts"
        for w in ("w1", "w2", "w3"):
            out[f"{prefix}.{w}.weight"] = torch.stack(
                [tensors[f"{prefix}.{e}.{w}.weight"] for e in range(experts)]
            )
    return out
