"""GGUF files of the families CPU users download most (Qwen3, Qwen3-MoE, Gemma 3), named
and laid out as llama.cpp writes them (`tests/tiny_gguf.py`), served from their conversion
and held to transformers' own GGUF loader: fp32 logits within 1e-4 over a prompt that
crosses Gemma's window.

The tiny models use shapes the config classes' defaults do not have (Qwen3's head_dim 32,
Qwen3-MoE's expert width 32): transformers' reader drops those GGUF keys, and the
conversion reads them itself (`gguf_convert.gguf_config_fixes`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import PagedRunner, assert_logits_close, assert_same_greedy_tokens, prompt
from tiny_gguf import write_gguf
from tiny_model import make_tiny_mixtral, make_tiny_qwen3, make_tiny_qwen3_moe
from tiny_windowed import make_tiny_windowed

from sluice.runtime.attention.registry import create_model_backend
from sluice.runtime.model.gguf_convert import convert_gguf, gguf_config_fixes
from sluice.runtime.model.loader import load_model

pytest.importorskip("gguf")
SLIDING, FULL = "sliding_attention", "full_attention"


def _make(family: str, folder: Path) -> Path:
    if family == "qwen3":
        return make_tiny_qwen3(folder)
    if family == "mixtral":
        return make_tiny_mixtral(folder)
    if family == "qwen3_moe":  # llama.cpp's qwen3moe: no dense layers, top-k weights renormed
        return make_tiny_qwen3_moe(folder, mlp_only_layers=[], norm_topk_prob=True)
    # Gemma 3 as llama.cpp knows it: a global layer every sixth, queries scaled by head_dim;
    # the global layers' RoPE scaled linearly, as Gemma 3 4B/12B/27B's
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    return make_tiny_windowed(folder, "gemma3", num_hidden_layers=6, query_pre_attn_scalar=32,
                              layer_types=[SLIDING] * 5 + [FULL], rope_parameters=rope)  # fmt: skip


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "gemma3"])
def test_a_gguf_serves_what_transformers_gguf_loader_computes(tmp_path, family):
    from transformers import AutoConfig, AutoModelForCausalLM

    original = _make(family, tmp_path / "hf")
    gguf_file = write_gguf(original, tmp_path / f"{family}.gguf")
    folder = convert_gguf(gguf_file, tmp_path / "cache")
    ours, config = load_model(folder, "cpu", torch.float32, create_model_backend("torch", "cpu"))
    # transformers reads the GGUF's tensors (its names, llama.cpp's transforms undone) into
    # the true architecture: its reader alone would take the class defaults it cannot see
    oracle = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=gguf_file.name, config=AutoConfig.from_pretrained(original),
        dtype=torch.float32, attn_implementation="eager",
    ).eval()  # fmt: skip
    ids = prompt(60, seed=11, vocab=config.vocab_size)
    logits = PagedRunner(ours, page_size=16, num_pages=32, max_context=512).extend(
        [(0, ids)], return_all_logits=True
    )
    with torch.inference_mode():
        expected = oracle(torch.tensor([ids])).logits[0].float()
    assert_logits_close(logits, expected)
    assert_same_greedy_tokens(logits, expected)
    # and the GGUF is the model it was written from
    with torch.inference_mode():
        source = AutoModelForCausalLM.from_pretrained(
            original, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        assert_logits_close(logits, source(torch.tensor([ids])).logits[0].float())


def test_a_mixtral_gguf_serves_the_model_it_was_written_from(tmp_path):
    """transformers' reader does not map Mixtral GGUFs (llama.cpp's `llama` with experts):
    the oracle is the model the file was written from."""
    from transformers import AutoModelForCausalLM

    original = _make("mixtral", tmp_path / "hf")
    folder = convert_gguf(write_gguf(original, tmp_path / "mixtral.gguf"), tmp_path / "cache")
    ours, config = load_model(folder, "cpu", torch.float32, create_model_backend("torch", "cpu"))
    assert config.architectures == ("MixtralForCausalLM",)
    ids = prompt(60, seed=11, vocab=config.vocab_size)
    logits = PagedRunner(ours, page_size=16, num_pages=32, max_context=512).extend(
        [(0, ids)], return_all_logits=True
    )
    source = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = source(torch.tensor([ids])).logits[0].float()
    assert_logits_close(logits, expected)
    assert_same_greedy_tokens(logits, expected)


@pytest.mark.parametrize("arch, layers, scale", [("gemma2", 46, 144), ("gemma2", 26, 256),
                                                 ("gemma3", 62, 168), ("gemma3", 34, 256)])
def test_a_gemma_ggufs_query_scale_is_llama_cpps(tmp_path, arch, layers, scale):
    """GGUF has no query_pre_attn_scalar: llama.cpp scales by head_dim, but the 27Bs by
    hidden / heads (Gemma 2 27B: 4608 / 32, Gemma 3 27B: 5376 / 32)."""
    import gguf
    from transformers import Gemma2Config

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), arch)
    hidden = 4608 if arch == "gemma2" else 5376
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_head_count(32)
    writer.add_key_length(256 if layers not in (46, 62) else 128)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    fixes = gguf_config_fixes(tmp_path / "m.gguf", Gemma2Config())
    assert fixes["query_pre_attn_scalar"] == scale
