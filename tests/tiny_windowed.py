"""Tiny random Gemma 2, Gemma 3 and gpt-oss models for the windowed-attention tests.

Each is a Hugging Face folder (config, safetensors, the tiny byte-level tokenizer of
`tiny_model`) whose windows are short (8-16 tokens), so prompts of 40-100 tokens cross
them; norms, sinks and biases are randomised (HF initialises them to constants), scales and
soft-caps are set where they change the result, and both RoPE bases differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_model import EOS_TOKEN_ID, make_tokenizer

WINDOWED_FAMILIES = ("gemma3", "gemma2", "gpt_oss")


def _config(family: str, vocab: int, overrides: dict[str, Any]) -> Any:
    from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig

    common: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6, eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0, bos_token_id=None, initializer_range=0.08,
    )  # fmt: skip
    if family == "gemma3":
        config = Gemma3TextConfig(
            **common, intermediate_size=96, num_hidden_layers=4, sliding_window=12,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            query_pre_attn_scalar=24,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        )  # fmt: skip
        config.architectures = ["Gemma3ForCausalLM"]
    elif family == "gemma2":
        config = Gemma2Config(
            **common, intermediate_size=96, num_hidden_layers=3, sliding_window=10,
            query_pre_attn_scalar=40, attn_logit_softcapping=1.5, final_logit_softcapping=4.0,
        )  # fmt: skip
        config.architectures = ["Gemma2ForCausalLM"]
    else:
        config = GptOssConfig(
            **common, intermediate_size=48, num_hidden_layers=2, sliding_window=8,
            num_local_experts=4, num_experts_per_tok=2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 64},
        )  # fmt: skip
        config.architectures = ["GptOssForCausalLM"]
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def make_tiny_windowed(path: Path, family: str, seed: int = 0, **overrides: Any) -> Path:
    """Write a random tiny `family` ("gemma3", "gemma2" or "gpt_oss") model into `path`."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = make_tokenizer()
    config = _config(family, len(tokenizer), overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name or "sinks" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=EOS_TOKEN_ID, pad_token_id=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_hf(path: Path) -> Any:
    """Transformers' model on the folder, eager attention (the reference), fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
