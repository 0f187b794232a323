"""Published configs read as transformers reads them, defaults included.

Each config below is a published checkpoint's `config.json`, typed in by hand (nothing is
downloaded). The oracle is transformers' own config class built from the same dict: what
it derives (`layer_types` from `sliding_window_pattern` or the family's alternation) and
what it defaults (Gemma 3 4B's `text_config` lists six fields) must be what Sluice reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.runtime.model.config import FULL, SLIDING, ModelConfig
from sluice.runtime.model.config_defaults import FAMILY_DEFAULTS
from sluice.runtime.model.registry import architecture_for, model_config

GEMMA_2_2B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "use_cache": True, "vocab_size": 256000,
}  # fmt: skip
GEMMA_3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 262144,
}  # fmt: skip
GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
        "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
        "patch_size": 14, "vision_use_head": False,
    },
}  # fmt: skip
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False,
    "pad_token_id": 199999, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
}  # fmt: skip
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
}  # fmt: skip
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 32000,
}  # fmt: skip
WINDOWED = {"gemma-2-2b": GEMMA_2_2B, "gemma-3-1b-it": GEMMA_3_1B, "gemma-3-4b-it": GEMMA_3_4B,
            "gpt-oss-20b (no layer_types)": GPT_OSS_20B}  # fmt: skip
PUBLISHED = {**WINDOWED, "llama-3.2-1b": LLAMA_3_2_1B, "mistral-7b-v0.1": MISTRAL_7B_V01,
             "qwen3-0.6b": QWEN3_0_6B, "mixtral-8x7b": MIXTRAL_8X7B}  # fmt: skip


def transformers_text_config(raw: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**raw)
    return getattr(config, "text_config", None) or config


def _rope(hf: Any) -> tuple[float, float | None, str, float]:
    """transformers' (full-attention base, sliding base or None, full scaling type, factor)."""
    params = hf.rope_parameters
    if "full_attention" in params:
        full, local = params["full_attention"], params["sliding_attention"]["rope_theta"]
    else:
        full, local = params, None
    return float(full["rope_theta"]), local, full.get("rope_type", "default"), full.get("factor", 1.0)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_config_reads_as_transformers_reads_it(name: str) -> None:
    raw = PUBLISHED[name]
    ours: ModelConfig = model_config(raw)
    hf = transformers_text_config(raw)
    if getattr(hf, "head_dim", None) is None:  # the model derives it
        hf.head_dim = hf.hidden_size // hf.num_attention_heads
    hf_window = getattr(hf, "sliding_window", None)
    hf_types = tuple(getattr(hf, "layer_types", None) or ())
    if hf_window is None:  # no window: every layer attends to everything
        assert ours.sliding_window is None and set(ours.layer_types) == {FULL}
    elif hf_types:
        assert ours.layer_types == hf_types
    else:  # Mistral: transformers keeps no list; the window applies to every layer
        assert set(ours.layer_types) == {SLIDING}
    if name in WINDOWED:
        assert FULL in ours.layer_types and SLIDING in ours.layer_types
    assert ours.sliding_window == hf_window
    for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_size",
                  "intermediate_size", "tie_word_embeddings"):  # fmt: skip
        assert getattr(ours, field) == getattr(hf, field), field
    theta, local, rope_type, factor = _rope(hf)
    assert ours.rope_theta == theta
    assert ours.rope_local_theta == (float(local) if local is not None else None)
    assert (ours.rope_scaling.rope_type, ours.rope_scaling.factor) == (rope_type, factor)
    if hasattr(hf, "query_pre_attn_scalar"):
        assert ours.attention_scale == pytest.approx(hf.query_pre_attn_scalar**-0.5)
        assert ours.attention_softcap == hf.attn_logit_softcapping
        assert ours.final_logit_softcap == hf.final_logit_softcapping
    architecture_for(ours)  # served


def test_gemma_3_4b_keeps_the_wrappers_end_of_turn_id() -> None:
    assert model_config(GEMMA_3_4B).eos_token_ids == (1, 106)


def test_gemma_3_1b_has_a_global_layer_every_sixth() -> None:
    types = model_config(GEMMA_3_1B).layer_types
    assert [i for i, t in enumerate(types) if t == FULL] == [5, 11, 17, 23]


@pytest.mark.parametrize("family", list(FAMILY_DEFAULTS))
def test_the_defaults_are_transformers_own(family: str) -> None:
    from transformers import AutoConfig

    hf = AutoConfig.for_model(family)
    for key, value in FAMILY_DEFAULTS[family].items():
        if key in ("rope_theta", "rope_local_base_freq"):
            theta, local, _, _ = _rope(hf)
            assert value == (theta if key == "rope_theta" else local), key
        elif key == "sliding_window_pattern":
            assert value == hf._sliding_window_pattern
        else:
            assert getattr(hf, key) == value, key
