"""The batch-invariant Triton matmul of `--enable-deterministic-inference` on CUDA, under
Triton's interpreter on the CPU (compiled on a GPU): close to float64, and each row's bits
the same whatever else shares the call; `Linear` and `RMSNorm` take it when switched."""

from __future__ import annotations

import os

import pytest
import torch

from sluice.runtime.model import batch_invariant_ops
from sluice.runtime.model.layers import Linear, RMSNorm

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 7 + k)
    x = torch.randn(rows, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    return x, w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_matmul_matches_float64_with_bias_and_fp32_output(dtype: torch.dtype) -> None:
    from sluice.runtime.kernels.triton_batch_invariant import matmul

    x, w = _case(70, 100, 90, dtype)  # no dimension a multiple of the tiles
    bias = torch.randn(90).to(dtype).to(DEVICE)
    exact = x.double() @ w.double().T + bias.double()
    got = matmul(x, w, bias, torch.float32)
    assert got.dtype == torch.float32 and got.shape == (70, 90)
    assert torch.allclose(got.double(), exact, atol=1e-4, rtol=1e-4)
    rounded = matmul(x, w, bias)
    assert rounded.dtype == dtype
    assert torch.allclose(rounded.double(), exact, atol=3e-2, rtol=2e-2)


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it() -> None:
    from sluice.runtime.kernels.triton_batch_invariant import matmul

    x, w = _case(200, 96, 80, torch.bfloat16)
    alone = torch.cat([matmul(x[i : i + 1], w, None, torch.float32) for i in range(0, 200, 37)])
    for rows in (1, 5, 64, 65, 130, 200):
        got = matmul(x[:rows], w, None, torch.float32)
        picked = list(range(0, rows, 37))
        assert torch.equal(got[picked], alone[: len(picked)]), f"{rows} rows"


def test_the_switched_layers_run_the_kernels() -> None:
    from sluice.runtime.kernels.triton_batch_invariant import matmul
    from sluice.runtime.kernels.triton_fused import rms_norm

    linear = Linear(96, 80, True, DEVICE, torch.bfloat16)
    norm = RMSNorm(96, 1e-6, DEVICE, torch.bfloat16)
    for p in (linear.weight, linear.bias, norm.weight):
        p.data.normal_(0, 0.1)
    model = torch.nn.ModuleDict({"linear": linear, "norm": norm})
    assert batch_invariant_ops.enable(model) == 2
    x, _ = _case(9, 96, 1, torch.bfloat16)
    assert torch.equal(linear(x), matmul(x, linear.weight, linear.bias))
    assert torch.equal(linear.forward_fp32(x), matmul(x, linear.weight, linear.bias, torch.float32))
    assert torch.equal(norm(x), rms_norm(x, norm.weight, 1e-6))


def test_bmm_is_matmul_per_batch_entry() -> None:
    from sluice.runtime.kernels.triton_batch_invariant import bmm, matmul

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 20, 40, generator=g).bfloat16().to(DEVICE)
    w = torch.randn(3, 30, 40, generator=g).bfloat16().to(DEVICE)
    got = bmm(x, w, torch.float32)
    for i in range(3):
        assert torch.equal(got[i], matmul(x[i], w[i], None, torch.float32))
    # a strided operand (a transposed view) gives the same bits as its contiguous copy
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(bmm(x, wt, torch.float32), got)
