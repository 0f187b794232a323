"""Gemma 3, Gemma 2 and gpt-oss over the paged KV cache equal transformers' eager forward.

Tiny random models with windows of 8-16 tokens (`tiny_windowed`): prompts of 40-100 tokens
cross them, so each case below is only right if every sliding layer sees exactly its window
(and every full layer everything), with Gemma 2's soft-caps, Gemma 3's two RoPE bases and
QK-norm, and gpt-oss's sinks. fp32 logits within 1e-4 at every position, on the compiled CPU
kernels and on the torch backend; the Triton kernels (under `TRITON_INTERPRET=1`, slow) take
a chunked prefill and decode steps past the window on Gemma 2 (soft-caps) and gpt-oss (sinks).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from model_harness import PagedRunner, assert_logits_close, assert_same_greedy_tokens, prompt
from tiny_windowed import load_hf, make_tiny_gemma3_multimodal, make_tiny_windowed

from sluice.runtime.attention.registry import create_model_backend
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.kernels import cpu_extension
from sluice.runtime.model.loader import load_model

FAMILIES = ["gemma3", "gemma2", "gpt_oss"]
BACKENDS = ["cpu", "torch"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {f: make_tiny_windowed(tmp_path_factory.mktemp(f), f, seed=i)
            for i, f in enumerate(FAMILIES)}  # fmt: skip


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, torch.nn.Module]:
    return {f: load_hf(path) for f, path in folders.items()}


def ours(folder: Path, backend: str) -> torch.nn.Module:
    if backend == "cpu" and not cpu_extension.available():
        pytest.skip(f"CPU kernels not built: {cpu_extension.load()}")
    model, _ = load_model(folder, "cpu", torch.float32, create_model_backend(backend, "cpu"))
    return model


@torch.inference_mode()
def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


def runner(model: torch.nn.Module) -> PagedRunner:
    return PagedRunner(model, page_size=16, num_pages=64, max_context=512)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_across_the_window_matches_hf(folders, references, family, backend) -> None:
    model = ours(folders[family], backend)
    vocab = model.config.vocab_size
    prompts = [prompt(n, seed=n, vocab=vocab) for n in (67, 40, 5)]
    paged = runner(model)
    logits = paged.extend([(0, prompts[0])], return_all_logits=True)
    reference = hf_logits(references[family], prompts[0])
    assert_logits_close(logits, reference)
    assert_same_greedy_tokens(logits, reference)
    # a ragged batch, last tokens only
    batch = paged.extend([(1, prompts[1]), (2, prompts[2])])
    expected = torch.stack([hf_logits(references[family], p)[-1] for p in prompts[1:]])
    assert_logits_close(batch, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_published_shaped_config_without_layer_types_matches_hf(tmp_path, family) -> None:
    """config.json as the published checkpoints write it (no `layer_types`: transformers
    derives the global layers), over a prompt far longer than the window."""
    folder = make_tiny_windowed(tmp_path / family, family, seed=7, published=True)
    model = ours(folder, "torch")
    assert "full_attention" in model.config.layer_types
    ids = prompt(90, seed=3, vocab=model.config.vocab_size)
    logits = runner(model).extend([(0, ids)], return_all_logits=True)
    reference = hf_logits(load_hf(folder), ids)
    assert_logits_close(logits, reference)
    assert_same_greedy_tokens(logits, reference)


@pytest.mark.parametrize("transformers5_names", [False, True])
def test_gemma3_for_conditional_generation_is_served_as_text(tmp_path, transformers5_names):
    """Gemma 3 4B/12B/27B's architecture: the language model's weights (under either
    transformers' names), the vision tower skipped; equal to transformers' multimodal
    model on text."""
    from transformers import Gemma3ForConditionalGeneration

    folder = make_tiny_gemma3_multimodal(tmp_path / "mm", transformers5_names=transformers5_names)
    model = ours(folder, "torch")
    ids = prompt(70, seed=5, vocab=model.config.vocab_size - 3)  # no image/boi/eoi tokens
    logits = runner(model).extend([(0, ids)], return_all_logits=True)
    reference_folder = folder if not transformers5_names else make_tiny_gemma3_multimodal(
        tmp_path / "mm-reference")  # the same weights under the names transformers reads
    hf = Gemma3ForConditionalGeneration.from_pretrained(reference_folder, dtype=torch.float32,
                                                        attn_implementation="eager").eval()  # fmt: skip
    reference = hf_logits(hf, ids)
    assert_logits_close(logits, reference)
    assert_same_greedy_tokens(logits, reference)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_over_a_prefix_longer_than_the_window(folders, references, family,
                                                              backend) -> None:  # fmt: skip
    model = ours(folders[family], backend)
    ids = prompt(100, seed=3, vocab=model.config.vocab_size)
    paged = runner(model)
    chunks = [ids[:40], ids[40:72], ids[72:]]  # each chunk reads a cached prefix > window
    out = [paged.extend([(0, chunk)], return_all_logits=True) for chunk in chunks]
    assert_logits_close(torch.cat(out), hf_logits(references[family], ids))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_far_past_the_window_matches_hf(folders, references, family, backend) -> None:
    model = ours(folders[family], backend)
    vocab = model.config.vocab_size
    prompts = [prompt(n, seed=50 + n, vocab=vocab) for n in (41, 9)]
    paged = runner(model)
    last = paged.extend([(0, prompts[0]), (1, prompts[1])])
    seqs = [list(p) for p in prompts]
    for _ in range(24):  # the short prompt's decodes cross the window too
        tokens = last.argmax(-1).tolist()
        for seq, token in zip(seqs, tokens, strict=True):
            seq.append(token)
        last = paged.decode([(0, tokens[0]), (1, tokens[1])])
    expected = torch.stack([hf_logits(references[family], seq)[-1] for seq in seqs])
    assert_logits_close(last, expected)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_triton_kernels_chunked_prefill_and_decode_past_the_window(folders, references, family):
    model = ours(folders[family], "triton")
    ids = prompt(60, seed=5, vocab=model.config.vocab_size)
    paged = runner(model)
    out = [paged.extend([(0, ids[:24])], return_all_logits=True),
           paged.extend([(0, ids[24:])], return_all_logits=True)]  # fmt: skip
    assert_logits_close(torch.cat(out), hf_logits(references[family], ids))
    for _ in range(4):
        ids.append(int(out[-1][-1].argmax()))
        out.append(paged.decode([(0, ids[-1])]))
    assert_logits_close(out[-1][0], hf_logits(references[family], ids)[-1])


def test_mxfp4_expert_weights_dequantize_as_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from sluice.runtime.model.gpt_oss import dequantize_mxfp4

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(118, 134, (3, 10, 2), generator=gen, dtype=torch.uint8)
    expected = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), expected)


def test_an_mxfp4_checkpoint_loads_its_experts_dequantized(folders) -> None:
    """The released gpt-oss checkpoints hold `*_blocks`/`*_scales` pairs for the experts."""
    from safetensors.torch import load_file

    from sluice.runtime.model.gpt_oss import dequantize_mxfp4

    model = ours(folders["gpt_oss"], "torch")
    tensors = load_file(str(folders["gpt_oss"] / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    experts, hidden, double = tensors["model.layers.0.mlp.experts.gate_up_proj"].shape
    blocks = torch.randint(0, 256, (experts, double, hidden // 32, 16), generator=gen,
                           dtype=torch.uint8)  # fmt: skip
    scales = torch.randint(120, 130, (experts, double, hidden // 32), generator=gen,
                           dtype=torch.uint8)  # fmt: skip
    del tensors["model.layers.0.mlp.experts.gate_up_proj"]
    tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"] = blocks
    tensors["model.layers.0.mlp.experts.gate_up_proj_scales"] = scales
    model.load_weights(tensors)
    assert torch.equal(model.layers[0].mlp.gate_up_proj, dequantize_mxfp4(blocks, scales, torch.float32))


def test_a_backend_without_windows_refuses_the_model_at_load(folders) -> None:
    """What FlashInfer does: the loader asks every layer's options and stops with the reason."""
    from sluice.runtime.attention.torch_backend import TorchAttentionBackend

    class NoWindows(TorchAttentionBackend):
        def unsupported(self, options):
            return "no sliding windows here" if options.window else None

    with pytest.raises(ValueError, match="no sliding windows here"):
        load_model(folders["gemma3"], "cpu", torch.float32, NoWindows())


class _NoWindows(TorchAttentionBackend):
    """A backend that cannot run windowed layers (as FlashInfer cannot)."""

    def unsupported(self, options) -> str | None:
        return "no sliding windows here" if options.window is not None else None


def test_auto_falls_back_to_a_backend_that_runs_the_model(folders, references, monkeypatch):
    folder = folders["gemma2"]
    with pytest.raises(ValueError, match="no sliding windows here"):
        load_model(folder, "cpu", torch.float32, _NoWindows())
    fallback = TorchAttentionBackend()
    model, _ = load_model(folder, "cpu", torch.float32, _NoWindows(), fallback=lambda: fallback)
    assert model.attn_backend is fallback
    ids = prompt(40, seed=2, vocab=model.config.vocab_size)
    logits = runner(model).extend([(0, ids)], return_all_logits=True)
    assert_logits_close(logits, hf_logits(references["gemma2"], ids))
    # what auto falls back to: nothing on the CPU; Triton (else torch) where it chose FlashInfer
    from sluice.runtime.attention import registry

    assert registry.auto_fallback_name("auto", "cpu") is None
    monkeypatch.setattr(registry, "resolve_backend_name", lambda name, device: "flashinfer")
    assert registry.auto_fallback_name("auto", "cuda") in ("triton", "torch")
    assert registry.auto_fallback_name("flashinfer", "cuda") is None  # asked for: no fallback
