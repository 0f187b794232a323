"""The CPU fast path against transformers: the `cpu` attention backend in fp32 (HF-exact),
bf16 within transformers' own bf16 error, and w8a8 against torchao's quantized linear."""

from __future__ import annotations

import pytest
import torch
from model_harness import ModelPair, PagedRunner, assert_logits_close, prompt

from sluice.runtime.kernels import cpu_extension as extension
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.model import cpu_fused_ops
from sluice.runtime.model.config import RopeScaling
from sluice.runtime.model.layers import Linear, RMSNorm, SwiGLUMLP
from sluice.runtime.model.loader import load_model
from sluice.runtime.model.quantization import W8A8Linear, quantize_model, torchao_available
from sluice.runtime.model.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    not extension.available(), reason=f"CPU kernels not built: {extension.load()}"
)
VARIANTS = ["llama", "qwen2", "mistral", "llama3_rope", "qwen3", "qwen3_moe", "mixtral"]


def run_conversation(model, page_size: int, vocab: int, kv_dtype=torch.float32):
    """Prefill two prompts (the second on the first's cached prefix), then 4 decode steps.
    Returns our logits and the token sequences they belong to."""
    runner = PagedRunner(model, page_size=page_size, num_pages=256)
    c = model.config
    runner.kv = KVBuffers(runner.num_pages * page_size, c.num_hidden_layers,
                          c.num_key_value_heads, c.head_dim, kv_dtype, "cpu")  # fmt: skip
    shared, tail, other = prompt(32, 1, vocab), prompt(6, 2, vocab), prompt(19, 3, vocab)
    runner.extend([(0, shared)])
    runner.share_prefix(dst=1, src=0, length=32)
    logits = [runner.extend([(1, tail), (2, other)])]
    seqs = [shared + tail, other]
    for _ in range(4):
        nxt = logits[-1].argmax(-1).tolist()
        seqs = [s + [t] for s, t in zip(seqs, nxt, strict=True)]
        logits.append(runner.decode([(1, nxt[0]), (2, nxt[1])]))
    return logits, seqs


def hf_step_logits(hf, seqs: list[list[int]], steps: int) -> list[torch.Tensor]:
    """transformers' logits at the positions our steps computed."""
    out = []
    for step in range(steps):
        cut = [len(s) - (steps - 1 - step) for s in seqs]
        with torch.inference_mode():
            out.append(torch.stack([hf(torch.tensor([s[:n]])).logits[0, -1].float()
                                    for s, n in zip(seqs, cut, strict=True)]))  # fmt: skip
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_cpu_backend_fp32_matches_hf(model_pairs: dict[str, ModelPair], variant: str,
                                     page_size: int) -> None:  # fmt: skip
    pair = model_pairs[variant]
    model, _ = load_model(pair.folder, "cpu", torch.float32, attention_backend="cpu")
    assert cpu_fused_ops.enable(model) is None
    ours, seqs = run_conversation(model, page_size, pair.config.vocab_size)
    for got, expected in zip(ours, hf_step_logits(pair.hf_model, seqs, len(ours)), strict=True):
        assert_logits_close(got, expected)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "mistral", "qwen3", "qwen3_moe", "mixtral"])
def test_bf16_is_as_close_to_fp32_as_transformers_bf16(model_pairs: dict[str, ModelPair],
                                                       variant: str) -> None:  # fmt: skip
    """Our bf16 forward (bf16 weights, activations and KV) deviates from the fp32 truth no
    more than transformers' own bf16 forward does (twice its error, plus a margin)."""
    from transformers import AutoModelForCausalLM

    pair = model_pairs[variant]
    model, _ = load_model(pair.folder, "cpu", torch.bfloat16, attention_backend="cpu")
    assert cpu_fused_ops.enable(model) is None
    ours, seqs = run_conversation(model, 16, pair.config.vocab_size, kv_dtype=torch.bfloat16)
    hf_bf16 = AutoModelForCausalLM.from_pretrained(pair.folder, dtype=torch.bfloat16).eval()
    truth = hf_step_logits(pair.hf_model, seqs, len(ours))
    theirs = hf_step_logits(hf_bf16, seqs, len(ours))
    for got, hf_b, exact in zip(ours, theirs, truth, strict=True):
        hf_error = (hf_b - exact).abs().max().item()
        our_error = (got - exact).abs().max().item()
        assert our_error <= 2 * hf_error + 0.02, (our_error, hf_error)
        torch.testing.assert_close(got, hf_b, atol=4 * hf_error + 0.05, rtol=0)


needs_torchao = pytest.mark.skipif(not torchao_available(), reason="torchao not installed")


@needs_torchao
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_w8a8_linear_equals_torchaos_quantized_linear(dtype: torch.dtype, rows: int,
                                                      fused: bool) -> None:  # fmt: skip
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    gen = torch.Generator().manual_seed(rows)
    ours = Linear(96, 160, True, "cpu", dtype)
    ours.weight.data.copy_(torch.randn(160, 96, generator=gen) * 0.05)
    ours.bias.data.copy_(torch.randn(160, generator=gen))
    reference = torch.nn.Sequential(torch.nn.Linear(96, 160)).to(dtype)
    reference[0].weight.data.copy_(ours.weight.data)
    reference[0].bias.data.copy_(ours.bias.data)
    quantize_(reference, Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    quantized = W8A8Linear.from_linear(ours)
    quantized.fused = fused
    with torch.inference_mode():
        got, expected = quantized(x), reference(x)
        exact = torch.nn.functional.linear(x.float(), ours.weight.float(), ours.bias.float())
    assert got.dtype == dtype
    # the same quantization: differences are the odd rounding tie and the output's rounding
    step = 0.02 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(got.float(), expected.float(), atol=step, rtol=0.01)
    quant_error = (expected.float() - exact).abs().max().item()
    assert (got.float() - exact).abs().max().item() <= quant_error * 1.5 + step


@needs_torchao
def test_w8a8_model_keeps_greedy_tokens_and_lm_head(model_pairs: dict[str, ModelPair]) -> None:
    pair = model_pairs["llama"]
    model, _ = load_model(pair.folder, "cpu", torch.float32, attention_backend="cpu")
    assert quantize_model(model, "w8a8") == 4 * model.config.num_hidden_layers
    assert cpu_fused_ops.enable(model) is None
    assert isinstance(model.lm_head, Linear)  # the output projection is not quantized
    ours, seqs = run_conversation(model, 16, pair.config.vocab_size)
    truth = hf_step_logits(pair.hf_model, seqs, len(ours))
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(ours, truth, strict=True))
    assert agree >= 0.8 * 2 * len(ours)
    for got, exact in zip(ours, truth, strict=True):
        assert (got - exact).abs().max().item() < 0.1 * exact.abs().max().item()


@needs_torchao
@pytest.mark.parametrize("variant", ["qwen3_moe", "mixtral"])
def test_w8a8_moe_quantizes_the_experts_not_the_router(
    model_pairs: dict[str, ModelPair], variant: str
) -> None:
    pair = model_pairs[variant]
    model, _ = load_model(pair.folder, "cpu", torch.float32, attention_backend="cpu")
    moe = pair.config.moe
    assert moe is not None
    dense = pair.config.num_hidden_layers - len(moe.sparse_layers)
    count = quantize_model(model, "w8a8")
    # q/k/v+o per layer, gate/up+down per dense layer, two per expert per sparse layer
    assert count == 2 * pair.config.num_hidden_layers + 2 * dense + 2 * moe.num_experts * len(
        moe.sparse_layers
    )
    assert cpu_fused_ops.enable(model) is None
    sparse = model.layers[moe.sparse_layers[0]].mlp
    assert sparse.impl == "w8a8" and isinstance(sparse.gate, Linear)  # the router stays
    ours, seqs = run_conversation(model, 16, pair.config.vocab_size)
    truth = hf_step_logits(pair.hf_model, seqs, len(ours))
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(ours, truth, strict=True))
    assert agree >= 0.8 * 2 * len(ours)
    for got, exact in zip(ours, truth, strict=True):
        assert (got - exact).abs().max().item() < 0.1 * exact.abs().max().item()


def test_unknown_quantization_is_refused(model_pairs: dict[str, ModelPair]) -> None:
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize_model(model_pairs["llama"].model, "w4a16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_ops_equal_the_torch_layers(dtype: torch.dtype) -> None:
    """bf16: the same roundings as the torch ops, so (almost) every element is bit-equal;
    fp32: equal up to summation order."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    def check(fused: torch.Tensor, plain: torch.Tensor) -> None:
        if dtype == torch.float32:
            torch.testing.assert_close(fused, plain, atol=2e-6, rtol=2e-6)
        else:
            assert (fused != plain).float().mean().item() < 0.01
            torch.testing.assert_close(fused, plain, atol=0.02, rtol=0.01)

    norm = RMSNorm(96, 1e-6, "cpu", dtype)
    norm.weight.data.copy_(rand(96))
    x = rand(37, 96)
    plain = norm(x)
    norm.fused = True
    check(norm(x), plain)

    mlp = SwiGLUMLP(96, 80, False, "cpu", dtype)
    mlp.gate_up_proj.weight.data.copy_(rand(160, 96) * 0.3)
    mlp.down_proj.weight.data.copy_(rand(96, 80) * 0.3)
    plain = mlp(x)
    mlp.fused = True
    check(mlp(x), plain)

    rope = RotaryEmbedding(32, 10000.0, RopeScaling(), "cpu")
    qkv = rand(37, (6 + 2 * 2) * 32)
    q = qkv[:, : 6 * 32].view(37, 6, 32)  # non-contiguous views, as the model passes them
    k = qkv[:, 6 * 32 : 8 * 32].view(37, 2, 32)
    cos, sin = rope.cos_sin(torch.arange(37) * 3, dtype)
    fused_q, fused_k = torch.ops.sluice_cpu.rotary(q, k, cos, sin)
    check(fused_q, RotaryEmbedding.apply(q, cos, sin))
    check(fused_k, RotaryEmbedding.apply(k, cos, sin))
