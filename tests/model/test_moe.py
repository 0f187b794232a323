"""The MoE layer: its routing and its grouped expert GEMMs against the per-expert loop and
transformers' own sparse MoE blocks."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.model.config import MoEOptions
from sluice.runtime.model.moe import MoE
from sluice.runtime.model.moe_routing import route


def _layer(experts: int, top_k: int, renormalize: bool, dtype: torch.dtype, seed: int = 0) -> MoE:
    options = MoEOptions(experts, top_k, 48, renormalize, sparse_layers=(0,))
    layer = MoE(64, options, "cpu", dtype)
    gen = torch.Generator().manual_seed(seed)
    for param in (layer.gate.weight, layer.w13, layer.w2):
        param.data.copy_(0.1 * torch.randn(param.shape, generator=gen))
    return layer


def _outputs(layer: MoE, x: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for impl in ("loop", "segments", "grouped"):
        layer.impl = impl
        out[impl] = layer(x)
    return out


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_grouped_and_segment_gemms_equal_the_per_expert_loop_fp32(tokens: int) -> None:
    layer = _layer(experts=16, top_k=2, renormalize=True, dtype=torch.float32)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    out = _outputs(layer, x)
    torch.testing.assert_close(out["segments"], out["loop"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out["grouped"], out["loop"], atol=1e-6, rtol=0)


def test_grouped_gemms_in_bf16_stay_close_to_the_loop() -> None:
    layer = _layer(experts=8, top_k=2, renormalize=False, dtype=torch.bfloat16)
    x = torch.randn(21, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    out = _outputs(layer, x)
    assert layer.impl == "grouped"
    torch.testing.assert_close(out["grouped"].float(), out["loop"].float(), atol=2e-2, rtol=2e-2)


def test_mixtral_routing_is_a_softmax_over_the_chosen_logits() -> None:
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    weights, ids = route(logits, top_k=2, renormalize=True)
    chosen = torch.softmax(logits.gather(1, ids), dim=-1)
    torch.testing.assert_close(weights, chosen)
    assert torch.equal(ids, logits.topk(2).indices)


def test_qwen3_without_norm_topk_prob_keeps_the_full_softmax_weights() -> None:
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    weights, ids = route(logits, top_k=3, renormalize=False)
    torch.testing.assert_close(weights, torch.softmax(logits, -1).gather(1, ids))
    assert (weights.sum(-1) < 1).all()


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_the_layer_equals_transformers_qwen3_moe_block(norm_topk_prob: bool) -> None:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=48, num_experts=16,
                            num_experts_per_tok=4, norm_topk_prob=norm_topk_prob)  # fmt: skip
    layer = _layer(experts=16, top_k=4, renormalize=norm_topk_prob, dtype=torch.float32)
    hf = Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        hf.gate.weight.copy_(layer.gate.weight)
        hf.experts.gate_up_proj.copy_(layer.w13)
        hf.experts.down_proj.copy_(layer.w2)
        x = torch.randn(1, 29, 64, generator=torch.Generator().manual_seed(4))
        expected = hf(x)[0] if isinstance(hf(x), tuple) else hf(x)
    for impl, got in _outputs(layer, x[0]).items():
        torch.testing.assert_close(got, expected[0], atol=1e-5, rtol=0, msg=impl)


@pytest.mark.parametrize("tokens", [1, 37])
def test_the_triton_kernel_equals_the_loop_under_the_interpreter(tokens: int) -> None:
    pytest.importorskip("triton")
    from sluice.runtime.model.triton_moe import BLOCK_M, align_by_expert

    layer = _layer(experts=16, top_k=2, renormalize=True, dtype=torch.float32)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(5))
    layer.impl = "loop"
    expected = layer(x)
    layer.impl = "triton"
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=0)
    # every block of rows is one expert's; the grid depends only on the batch size
    _, ids = route(layer.gate(x), 2, True)
    blocks = align_by_expert(ids, 16)
    assert blocks.sorted_pairs.numel() == -(-(2 * tokens + 16 * (BLOCK_M - 1)) // BLOCK_M) * BLOCK_M
    flat = ids.reshape(-1)
    for b, expert in enumerate(blocks.block_experts.tolist()):
        pairs = blocks.sorted_pairs[b * BLOCK_M : (b + 1) * BLOCK_M]
        real = pairs[pairs < flat.numel()].long()
        assert (flat[real] == expert).all() if expert >= 0 else real.numel() == 0
    assert sorted(blocks.sorted_pairs[blocks.sorted_pairs < flat.numel()].tolist()) == list(
        range(flat.numel())
    )
