"""`--enable-deterministic-inference` on the GPU: the fixed-tile Triton matmul gives a row the
same bits whatever else shares the call (bf16 MMA, SmolLM2's shapes and the LM head's), and
stays within bf16's error of an fp32 reference."""

from __future__ import annotations

import pytest
import torch
from gpu_support import ON_CPU

SHAPES = [(576, 960), (1536, 576)] if ON_CPU else [(576, 960), (576, 3072), (1536, 576), (576, 49152)]
ROWS = [1, 3, 64, 65, 200] if ON_CPU else [1, 3, 16, 64, 65, 129, 512, 2048]


@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_a_row_has_the_same_bits_in_any_batch(device: str, k: int, n: int) -> None:
    from sluice.runtime.kernels.triton_batch_invariant import matmul

    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(max(ROWS), k, generator=g).bfloat16().to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16().to(device)
    alone = torch.cat([matmul(x[i : i + 1], w, None, torch.float32) for i in range(4)])
    for rows in ROWS:
        got = matmul(x[:rows], w, None, torch.float32)
        shown = min(rows, 4)
        assert torch.equal(got[:shown], alone[:shown]), f"{rows} rows"
    exact = x.float() @ w.float().T
    torch.testing.assert_close(matmul(x, w, None, torch.float32), exact, atol=2e-3, rtol=2e-3)
