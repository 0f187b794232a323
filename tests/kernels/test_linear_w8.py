"""`sluice_cpu.linear_w8`, the int8-weight (W8A16) linear of `--quantization w8a16`.

Oracle: float64 matmul of the bf16 rows and the weights bf16(int8 * scale), one scale per
row and group of 32. The serving contract is the bf16 kernel's: a row's output is bitwise
the same however many rows share the call and whichever AMX operand order computes it; and
it is bitwise the bf16 kernel's on those widened weights.
"""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.kernels import cpu_extension

AMX = 2
pytestmark = pytest.mark.skipif(
    not cpu_extension.available() or AMX not in torch.ops.sluice_cpu.linear_paths(),
    reason="needs the CPU kernels on a CPU with AMX-BF16",
)
ROW_COUNTS = [1, 15, 16, 17, 32, 33, 128, 129, 300]
SHAPES = [(576, 960), (1536, 576), (64, 33), (32, 17)]


def _case(k: int, n: int, rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w8 = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, k // 32, generator=g) / (127 * k**0.5) + 1e-4
    return x, w8, scale


def widened(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w8.float() * scale.repeat_interleave(32, dim=1)).bfloat16()


def linear_w8(x, w8, scale, bias, out_dtype, *order):
    packed, packed_scale = torch.ops.sluice_cpu.pack_w8(w8, scale)
    return torch.ops.sluice_cpu.linear_w8(x, packed, packed_scale, w8.shape[0], bias, out_dtype,
                                          *order)  # fmt: skip


@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_int8_weights_equal_float64_and_the_bf16_kernel(k, n, rows) -> None:
    x, w8, scale = _case(k, n, rows)
    bias = torch.randn(n)
    w = widened(w8, scale)
    got = linear_w8(x, w8, scale, bias, torch.float32)
    want = x.double() @ w.double().T + bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, torch.ops.sluice_cpu.linear(x, w, bias, torch.float32, AMX))
    out_bf16 = linear_w8(x, w8, scale, bias, torch.bfloat16)
    assert torch.equal(out_bf16, torch.ops.sluice_cpu.linear(x, w, bias, torch.bfloat16, AMX))


@pytest.mark.parametrize("k, n", SHAPES)
def test_a_rows_result_depends_on_that_row_alone(k, n) -> None:
    x, w8, scale = _case(k, n, 300, seed=1)
    whole = linear_w8(x, w8, scale, None, torch.float32)
    for order in (0, 1):
        forced = linear_w8(x, w8, scale, None, torch.float32, order)
        assert torch.equal(forced, whole)
    for rows in ROW_COUNTS:
        assert torch.equal(linear_w8(x[:rows], w8, scale, None, torch.float32),
                           whole[:rows])  # fmt: skip


def test_bad_operands_are_refused() -> None:
    x, w8, scale = _case(64, 8, 4)
    packed, packed_scale = torch.ops.sluice_cpu.pack_w8(w8, scale)
    with pytest.raises(RuntimeError, match="weight int8"):
        torch.ops.sluice_cpu.pack_w8(w8.float(), scale)
    with pytest.raises(RuntimeError, match="one per row and group of 32"):
        torch.ops.sluice_cpu.pack_w8(w8, scale[:, :1])
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        torch.ops.sluice_cpu.pack_w8(w8[:, :40], scale[:, :1])
    with pytest.raises(RuntimeError, match="packed by pack_w8"):
        torch.ops.sluice_cpu.linear_w8(x, w8, scale, 8, None, torch.float32)
    with pytest.raises(RuntimeError, match="packed by pack_w8"):
        torch.ops.sluice_cpu.linear_w8(x, packed, packed_scale, 17, None, torch.float32)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        torch.ops.sluice_cpu.linear_w8(x[:, :40], packed, packed_scale, 8, None, torch.float32)
