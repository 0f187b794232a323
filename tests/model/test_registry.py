"""The model registry: what each architecture declares, and what start-up refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import make_tiny_llama

from sluice.runtime.cli import main
from sluice.runtime.model.architecture import WeightRule
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.llama import LlamaForCausalLM
from sluice.runtime.model.registry import (
    architecture_for,
    find_architecture,
    model_config,
    supported_architectures,
)
from sluice.runtime.model.sharding import ModelShard


def _edit_config(folder: Path, **changes: object) -> Path:
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))
    return folder


def _serve_refusal(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["serve", "--model", str(folder), "--device", "cpu"])
    return code, capsys.readouterr().err.splitlines()[-1]


def test_the_llama_family_is_one_registered_architecture() -> None:
    names = supported_architectures()
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert name in names
    assert LlamaForCausalLM is CausalLM


def test_model_type_is_the_fallback_when_architectures_is_empty() -> None:
    raw = {"architectures": [], "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512}  # fmt: skip
    config = model_config(raw)
    assert find_architecture(config) is architecture_for(
        model_config({**raw, "architectures": ["Qwen2ForCausalLM"]})
    )


def test_an_unknown_architecture_exits_2_naming_the_supported_ones(tmp_path, capsys) -> None:
    folder = _edit_config(make_tiny_llama(tmp_path / "m"), architectures=["GPT2LMHeadModel"])
    code, last = _serve_refusal(folder, capsys)
    assert code == 2
    assert last.startswith(
        "sluice serve: unsupported model architecture GPT2LMHeadModel; supported: "
    )
    assert "LlamaForCausalLM" in last


def test_a_known_architecture_with_an_unknown_option_exits_2_naming_it(tmp_path, capsys) -> None:
    folder = _edit_config(make_tiny_llama(tmp_path / "m"), hidden_act="gelu")
    code, last = _serve_refusal(folder, capsys)
    assert code == 2
    assert last == "sluice serve: hidden_act='gelu' is not supported (only 'silu')"


def test_an_unknown_rope_type_exits_2_naming_it(tmp_path, capsys) -> None:
    folder = _edit_config(
        make_tiny_llama(tmp_path / "m"),
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    code, last = _serve_refusal(folder, capsys)
    assert code == 2
    assert "rope type 'dynamic' is not supported" in last


def test_a_rule_lists_the_names_it_expects_and_matches_only_them() -> None:
    rule = WeightRule.literal(
        "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
        "layers.{layer}.mlp.experts.w13",
        "expert_up",
        "column",
    )
    name = rule.hf_name(3, 5)
    assert name == "model.layers.3.mlp.experts.5.up_proj.weight"
    match = rule.pattern.fullmatch(name)
    assert match is not None and match.groupdict() == {"layer": "3", "expert": "5"}
    assert rule.pattern.fullmatch("model.layers.3.mlp.experts.5.up_projXweight") is None
    with pytest.raises(ValueError, match="piece 'upp'"):
        WeightRule.literal("x", "y", "upp")


def test_the_rules_drive_each_ranks_reads() -> None:
    config = model_config({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 512,
    })  # fmt: skip
    rules = architecture_for(config).weight_rules
    rank1 = ModelShard(config, 1, 2, rules)
    assert rank1.read("model.layers.0.self_attn.q_proj.weight").rows == (32, 64)
    assert rank1.read("model.layers.0.self_attn.k_proj.weight").rows == (16, 32)
    assert rank1.read("model.layers.0.self_attn.o_proj.weight").cols == (32, 64)
    assert rank1.read("model.layers.0.mlp.up_proj.weight").rows == (64, 128)
    assert rank1.read("model.layers.0.mlp.down_proj.weight").cols == (64, 128)
    assert rank1.read("model.layers.0.mlp.down_proj.bias").zeros
    assert rank1.read("model.layers.0.input_layernorm.weight").whole
