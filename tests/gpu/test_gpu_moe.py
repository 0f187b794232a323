"""The Triton fused MoE on the GPU: equal to the per-expert loop in bf16, and a CUDA-graph
replay equal to the eager call (`SLUICE_GPU_TESTS_DEVICE=cpu`: fp32 under the interpreter,
no graph)."""

from __future__ import annotations

import pytest
import torch
from gpu_support import ON_CPU

from sluice.runtime.model.config import MoEOptions
from sluice.runtime.model.moe import MoE

pytest.importorskip("triton")
DEVICE = "cpu" if ON_CPU else "cuda"
DTYPE = torch.float32 if ON_CPU else torch.bfloat16


def _layer(hidden: int, width: int, experts: int, top_k: int) -> MoE:
    layer = MoE(hidden, MoEOptions(experts, top_k, width, True, (0,)), DEVICE, DTYPE)
    gen = torch.Generator().manual_seed(0)
    for param in (layer.gate.weight, layer.w13, layer.w2):
        param.data.copy_((0.05 * torch.randn(param.shape, generator=gen)).to(DTYPE))
    return layer


@pytest.mark.parametrize("tokens", [1, 7, 200])
def test_triton_moe_equals_the_loop(tokens: int) -> None:
    layer = _layer(256, 128, 64, 8) if not ON_CPU else _layer(64, 48, 16, 4)
    assert ON_CPU or layer.impl == "triton"  # the default on CUDA
    x = torch.randn(tokens, layer.gate.weight.shape[1], device=DEVICE).to(DTYPE)
    layer.impl = "loop"
    expected = layer(x).float()
    layer.impl = "triton"
    got = layer(x).float()
    tolerance = 1e-5 if ON_CPU else 3e-2
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(ON_CPU, reason="CUDA graphs need a GPU")
def test_triton_moe_replays_in_a_cuda_graph() -> None:
    layer = _layer(256, 128, 64, 8)
    x = torch.randn(16, 256, device="cuda").to(DTYPE)
    eager = layer(x)
    static = x.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static)
    fresh = torch.randn(16, 256, device="cuda").to(DTYPE)  # other tokens, other experts
    static.copy_(fresh)
    graph.replay()
    torch.testing.assert_close(out, layer(fresh), atol=0, rtol=0)
    static.copy_(x)
    graph.replay()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
