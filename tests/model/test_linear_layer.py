"""`Linear.forward_fp32` (the LM head's logits) against float64: fp32 sums from bf16 weights,
with or without the compiled kernel, a bias, and a weight taller than one conversion slice
(no fp32 copy of the whole matrix is made on the torch path)."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.kernels import cpu_extension
from sluice.runtime.model import layers
from sluice.runtime.model.layers import Linear

FUSED = [False, True] if cpu_extension.available() else [False]


@pytest.mark.parametrize("fused", FUSED, ids=lambda f: "kernel" if f else "torch")
def test_fp32_logits_of_bf16_weights_match_float64(fused: bool) -> None:
    g = torch.Generator().manual_seed(3)
    rows = layers._FP32_SLICE_ROWS + 321  # more than one slice of the torch path
    linear = Linear(96, rows, True, "cpu", torch.bfloat16)
    linear.weight.data.copy_(torch.randn(rows, 96, generator=g) / 10)
    linear.bias.data.copy_(torch.randn(rows, generator=g))
    linear.fused = fused
    x = torch.randn(5, 96, generator=g).bfloat16()
    got = linear.forward_fp32(x)
    exact = x.double() @ linear.weight.double().T + linear.bias.double()
    assert got.dtype == torch.float32 and got.shape == (5, rows)
    # products of bf16 values are exact in fp32; only the 96 additions and the bias round
    bound = 97 * 2.0**-23 * (x.double().abs() @ linear.weight.double().abs().T + linear.bias.double().abs())
    assert ((got.double() - exact).abs() <= bound).all()
    # and the model-dtype forward is that result rounded to bf16 (within one bf16 step)
    rounded = linear(x)
    assert rounded.dtype == torch.bfloat16
    assert ((rounded.double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-2).all()
