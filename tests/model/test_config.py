"""`ModelConfig` reads what the runtime needs from HF configs, old and new spellings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sluice.runtime.model.config import ModelConfig, RopeScaling
from sluice.runtime.model.llama import LlamaForCausalLM
from sluice.runtime.model.registry import architecture_for, model_config, read_model_config
from sluice.runtime.model.rotary import rope_attention_scaling, rope_inv_freq

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "eos_token_id": 2,
}


def config(**overrides: object) -> ModelConfig:
    return model_config({**BASE, **overrides})


def test_head_dim_is_derived_unless_given() -> None:
    assert config().head_dim == 16
    assert config(head_dim=32).head_dim == 32


def test_kv_heads_default_to_attention_heads() -> None:
    raw = {k: v for k, v in BASE.items() if k != "num_key_value_heads"}
    assert model_config(raw).num_key_value_heads == 4


def test_qwen2_has_qkv_bias_and_llama_follows_attention_bias() -> None:
    qwen2 = config(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    assert (qwen2.qkv_bias, qwen2.o_bias) == (True, False)
    assert (config().qkv_bias, config().o_bias) == (False, False)
    assert (config(attention_bias=True).qkv_bias, config(attention_bias=True).o_bias) == (
        True,
        True,
    )


def test_eos_ids_join_config_and_generation_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": 128001}))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [128001, 128008, 128009]})
    )
    assert read_model_config(tmp_path).eos_token_ids == (128001, 128008, 128009)


def test_missing_config_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_model_config(tmp_path)


def test_legacy_rope_scaling_keys_are_read() -> None:
    legacy = config(
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert legacy.rope_theta == 500000.0
    assert legacy.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    linear = config(rope_scaling={"type": "linear", "factor": 2.0})
    assert (linear.rope_scaling.rope_type, linear.rope_scaling.factor) == ("linear", 2.0)


def test_transformers5_rope_parameters_are_read() -> None:
    new = config(rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    assert new.rope_theta == 100000.0
    assert new.rope_scaling.rope_type == "default"


def test_unsupported_rope_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="longrope"):
        config(rope_scaling={"rope_type": "longrope", "factor": 4.0})


@pytest.mark.parametrize("rope_type", ["default", "linear", "llama3"])
def test_rope_frequencies_equal_transformers(rope_type: str) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": rope_type, "rope_theta": 500000.0}
    if rope_type != "default":
        params["factor"] = 8.0
    if rope_type == "llama3":
        params.update(
            low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
        )
    hf_config = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=params)
    if rope_type == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float) / 128))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_config)
    ours = config(
        hidden_size=256, num_attention_heads=2, num_key_value_heads=2, rope_parameters=params
    )

    assert torch.equal(rope_inv_freq(ours.head_dim, ours.rope_theta, ours.rope_scaling), expected)


def test_a_sliding_window_is_per_layer_and_no_longer_caps_the_context() -> None:
    mistral = config(model_type="mistral", max_position_embeddings=32768, sliding_window=4096,
                     num_hidden_layers=2)  # fmt: skip
    assert mistral.context_length == 32768
    assert [mistral.window_for(i) for i in range(2)] == [4096, 4096]
    qwen2 = config(model_type="qwen2", max_position_embeddings=32768, sliding_window=4096)
    assert qwen2.window_for(0) is None  # Qwen2 ignores the window unless use_sliding_window
    qwen2 = config(model_type="qwen2", sliding_window=64, use_sliding_window=True,
                   num_hidden_layers=3, max_window_layers=1)  # fmt: skip
    assert [qwen2.window_for(i) for i in range(3)] == [None, 64, 64]
    assert config().context_length == 512


def test_yarn_rope_matches_transformers() -> None:
    """gpt-oss's YaRN: the inverse frequencies and the cos/sin factor transformers computes."""
    from transformers import GptOssConfig

    params = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
              "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
    hf = GptOssConfig(hidden_size=64, head_dim=32, num_attention_heads=2, rope_parameters=params,
                      max_position_embeddings=131072)  # fmt: skip
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    ours = config(hidden_size=64, head_dim=32, num_attention_heads=2, num_key_value_heads=2,
                  rope_parameters=params, max_position_embeddings=131072)  # fmt: skip
    torch.testing.assert_close(rope_inv_freq(32, ours.rope_theta, ours.rope_scaling), expected)
    assert rope_attention_scaling(ours.rope_scaling) == pytest.approx(factor)


def test_llama_mistral_and_qwen2_share_one_implementation() -> None:
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert architecture_for(config(architectures=[name])).model_class in (None, LlamaForCausalLM)


def test_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        architecture_for(config(architectures=["GPT2LMHeadModel"], model_type="gpt2"))


def test_gemma2_scale_and_soft_caps_are_read_once_into_the_config() -> None:
    gemma2 = config(architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0)  # fmt: skip
    assert (gemma2.attention_scale, gemma2.attention_softcap) == (256**-0.5, 50.0)
    assert gemma2.final_logit_softcap == 30.0
    gemma3 = config(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                    hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None)  # fmt: skip
    assert gemma3.attention_scale == 256**-0.5  # no query_pre_attn_scalar: transformers' 256
    assert gemma3.attention_softcap is None and gemma3.final_logit_softcap is None
    assert config().attention_scale is None  # Llama: the backend's own scale


def test_gpt_oss_experts_are_read_once_into_the_config() -> None:
    gpt_oss = config(architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                     num_local_experts=8, num_experts_per_tok=2, swiglu_limit=5.0)  # fmt: skip
    moe = gpt_oss.moe
    assert moe is not None and moe.clamp is not None
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 128)
    assert (moe.clamp.alpha, moe.clamp.limit) == (1.702, 5.0)
    assert moe.sparse_layers == (0, 1)
