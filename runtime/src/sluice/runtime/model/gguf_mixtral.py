"""Mixtral GGUFs, which transformers' GGUF reader does not map: llama.cpp writes Mixtral as
its `llama` architecture with `llama.expert_count` experts, each layer's experts either
stacked (`blk.N.ffn_gate_exps`, `[experts, width, hidden]`) or, in older files, one tensor
per expert (`blk.N.ffn_gate.E`). The tensors are dequantized with gguf-py, renamed to
`MixtralForCausalLM`'s checkpoint names, and q/k get llama.cpp's rotary permutation undone
(what transformers does for the `llama` architecture).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

_LAYER = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<name>[a-z_]+)(?:\.(?P<expert>\d+))?\.weight$")
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}  # fmt: skip
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate_inp": "block_sparse_moe.gate",
}  # fmt: skip
_EXPERT_NAMES = {"ffn_gate": "w1", "ffn_up": "w3", "ffn_down": "w2"}


def expert_count(reader: Any) -> int:
    """The experts of a `llama`-architecture GGUF (0: a dense Llama)."""
    field = reader.fields.get("llama.expert_count")
    return int(field.contents()) if field is not None else 0


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation undone (its converter interleaves the rotary halves)."""
    dim = weights.shape[0] // heads // 2
    return weights.reshape(heads, dim, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def mixtral_tensors(gguf_path: Path, heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    """Every tensor of the file, fp32, under MixtralForCausalLM's names."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.name in _TOP:
            out[_TOP[tensor.name]] = torch.from_numpy(data.copy())
            continue
        m = _LAYER.match(tensor.name)
        if m is None:
            raise ValueError(f"unexpected tensor {tensor.name!r} in a Mixtral GGUF")
        prefix, name = f"model.layers.{m['layer']}", m["name"]
        if name in _LAYER_NAMES:
            if name == "attn_q":
                data = unpermute(data, heads)
            elif name == "attn_k":
                data = unpermute(data, kv_heads)
            out[f"{prefix}.{_LAYER_NAMES[name]}.weight"] = torch.from_numpy(data.copy())
            continue
        stacked = name.removesuffix("_exps")
        if stacked not in _EXPERT_NAMES:
            raise ValueError(f"unexpected tensor {tensor.name!r} in a Mixtral GGUF")
        target = _EXPERT_NAMES[stacked]
        experts = [(int(m["expert"]), data)] if m["expert"] is not None else list(enumerate(data))
        for e, weight in experts:
            out[f"{prefix}.block_sparse_moe.experts.{e}.{target}.weight"] = torch.from_numpy(
                np.ascontiguousarray(weight)
            )
    return out


def mixtral_config(llama_config: Any, reader: Any) -> Any:
    """The MixtralConfig of a `llama` GGUF with experts (transformers read it as Llama)."""
    from transformers import MixtralConfig

    fields = {k: v for k, v in llama_config.to_dict().items() if k in MixtralConfig().to_dict()}
    fields.pop("model_type", None)
    used = reader.fields.get("llama.expert_used_count")
    config = MixtralConfig(
        **fields, num_local_experts=expert_count(reader),
        num_experts_per_tok=int(used.contents()) if used is not None else 2,
    )  # fmt: skip
    config.architectures = ["MixtralForCausalLM"]
    return config
