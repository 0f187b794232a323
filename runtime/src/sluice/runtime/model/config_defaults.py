"""What transformers assumes for a field a family's `config.json` leaves out.

Published configs are not complete: Gemma 3 4B/12B/27B list a handful of `text_config`
fields (the rest are `Gemma3TextConfig`'s defaults), Gemma 2 and Gemma 3 1B carry no
`layer_types`, and every family's config class fills the gaps its own way. `ModelConfig`
reads a config over these defaults, so a published config means what it means to
transformers. The values are transformers' config classes' own (tests/model check them
against the classes).
"""

from __future__ import annotations

from typing import Any

# the text model of a multimodal wrapper whose `text_config` names no model_type
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}

# what Gemma 2 and Gemma 3 (text) share
_GEMMA: dict[str, Any] = {
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256, "sliding_window": 4096,
}  # fmt: skip

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {
        **_GEMMA, "vocab_size": 256000, "max_position_embeddings": 8192, "rope_theta": 10000.0,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    },
    "gemma3_text": {
        **_GEMMA, "vocab_size": 262208, "max_position_embeddings": 131072,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
    },
    "gpt_oss": {
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "sliding_window": 128, "attention_bias": True,
        "num_local_experts": 128, "num_experts_per_tok": 4,
    },
}  # fmt: skip

# every `n`-th layer attends to everything, the others through the window (transformers'
# `layer_types` when a config has none: Gemma 2 and gpt-oss alternate, Gemma 3 has
# `sliding_window_pattern`, 6 by default); a family not listed slides in every layer
GLOBAL_EVERY: dict[str, str | int] = {"gemma2": 2, "gpt_oss": 2, "gemma3_text": "sliding_window_pattern"}


def with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` over its family's defaults (a field sent as null stays null, as transformers
    keeps it)."""
    return {**FAMILY_DEFAULTS.get(str(raw.get("model_type", "")), {}), **raw}


def global_every(raw: dict[str, Any]) -> int | None:
    """Every how many layers one attends to everything, when `layer_types` is absent."""
    rule = GLOBAL_EVERY.get(str(raw.get("model_type", "")))
    if isinstance(rule, str):
        return int(raw.get(rule) or FAMILY_DEFAULTS["gemma3_text"][rule])
    return rule
