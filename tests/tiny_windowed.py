"""Tiny random Gemma 2, Gemma 3, gpt-oss and Mistral models for the windowed-attention tests.

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

WINDOWED_FAMILIES = ("gemma3", "gemma2", "gpt_oss")  # full and sliding layers
ALL_SLIDING_FAMILY = "mistral"  # every layer slides (Mistral 7B v0.1)


def _config(family: str, vocab: int, overrides: dict[str, Any]) -> Any:
    from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig, MistralConfig

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
    elif family == "mistral":
        config = MistralConfig(**common, intermediate_size=96, num_hidden_layers=3,
                               sliding_window=12, rope_theta=5e4)  # fmt: skip
        config.architectures = ["MistralForCausalLM"]
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


def published_shape(path: Path, family: str) -> None:
    """Rewrite the folder's config.json the way the published checkpoints write theirs:
    no `layer_types` (transformers derives them: Gemma 2 and gpt-oss alternate, Gemma 3
    has `sliding_window_pattern`), and Gemma 3's RoPE bases as `rope_theta` and
    `rope_local_base_freq` (transformers 4's keys) instead of `rope_parameters`."""
    import json

    file = path / "config.json"
    raw = json.loads(file.read_text())
    raw.pop("layer_types")
    if family == "gemma3":
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params["full_attention"]["rope_theta"]
        raw["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        raw["sliding_window_pattern"] = PUBLISHED_GEMMA3_PATTERN
    file.write_text(json.dumps(raw, indent=2))


# with 4 layers, a pattern of 3 puts the global layer at index 2 (the published 6 would
# need 6 layers for one)
PUBLISHED_GEMMA3_PATTERN = 3


def make_tiny_windowed(
    path: Path, family: str, seed: int = 0, published: bool = False, **overrides: Any
) -> Path:
    """Write a random tiny `family` ("gemma3", "gemma2", "gpt_oss" or "mistral") model into `path`;
    `published`: with a config.json shaped like the published ones (`published_shape`)."""
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
    if published:
        published_shape(path, family)
    return path


def make_tiny_gemma3_multimodal(path: Path, seed: int = 0, transformers5_names: bool = False) -> Path:
    """A random tiny Gemma3ForConditionalGeneration (the language model of `_config
    ("gemma3")` beside a tiny SigLIP vision tower), config.json as published (a sparse
    `text_config`), the weights under `language_model.model.*` and `vision_tower.*` as the
    published 4B/12B/27B safetensors name them (and transformers saves them);
    `transformers5_names`: under transformers 5's module names instead
    (`model.language_model.*`, `model.vision_tower.*`, `lm_head.*`)."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    tokenizer = make_tokenizer()
    text = _config("gemma3", len(tokenizer), {}).to_dict()
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    config = Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=len(tokenizer) - 1, boi_token_index=len(tokenizer) - 2,
                          eoi_token_index=len(tokenizer) - 3, eos_token_id=EOS_TOKEN_ID)  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    weights = load_file(str(path / "model.safetensors"))
    assert any(k.startswith("language_model.model.") for k in weights), "saved names changed"
    if transformers5_names:
        renamed = {
            k.replace("language_model.model.", "model.language_model.")
            .replace("language_model.lm_head.", "lm_head.")
            .replace("vision_tower.", "model.vision_tower.")
            .replace("multi_modal_projector.", "model.multi_modal_projector."): v
            for k, v in weights.items()
        }  # fmt: skip
        save_file(renamed, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    keep = ("hidden_size", "intermediate_size", "model_type", "num_hidden_layers", "sliding_window",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "query_pre_attn_scalar", "rms_norm_eps")  # fmt: skip
    text_raw = {k: v for k, v in raw["text_config"].items() if k in keep}
    full = raw["text_config"]["rope_parameters"]
    text_raw["rope_theta"] = full["full_attention"]["rope_theta"]
    text_raw["rope_local_base_freq"] = full["sliding_attention"]["rope_theta"]
    text_raw["sliding_window_pattern"] = PUBLISHED_GEMMA3_PATTERN
    raw["text_config"] = text_raw
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path


def load_hf(path: Path) -> Any:
    """Transformers' model on the folder, eager attention (the reference), fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_greedy(hf: Any, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy `generate`: exactly `new_tokens` tokens after `ids`."""
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def served_greedy(url: str, ids: list[int], new_tokens: int) -> list[int]:
    """The server's greedy tokens for `ids` through /generate, exactly `new_tokens` of them."""
    import httpx

    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": params},
                   timeout=600)  # fmt: skip
    r.raise_for_status()
    return r.json()["output_ids"]
